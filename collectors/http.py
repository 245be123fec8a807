"""One HTTP exchange with a server, its failures as the caller's CollectorError (`retryable` set)."""

from typing import Any

import httpx

from collectors.errors import CollectorError


def exchange(
    client: httpx.Client,
    method: str,
    url: str,
    *,
    timeout_seconds: float,
    error: type[CollectorError],
    **options: Any,
) -> httpx.Response:
    """The 200 answer to one request; `error` for a network failure or another status.

    Timeouts, transport errors and 5xx answers may pass (retryable); 4xx (a wrong path, auth) will
    not without a change of configuration.
    """
    try:
        response = client.request(method, url, timeout=timeout_seconds, **options)
    except httpx.TimeoutException:
        raise error(retryable=True, reason=f"timed out after {timeout_seconds} s") from None
    except httpx.TransportError as exc:
        raise error(retryable=True, reason=f"{exc.__class__.__name__}: {exc}") from None
    if response.status_code != 200:
        raise error(retryable=response.status_code >= 500, reason=f"HTTP {response.status_code}")
    return response
