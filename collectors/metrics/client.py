"""One /metrics pull over HTTP (httpx); transport, URL and timeout are the caller's."""

import httpx


class ScrapeFailed(Exception):
    """The page could not be fetched; `retryable` says whether trying again later can help."""

    def __init__(self, *, retryable: bool, reason: str) -> None:
        super().__init__(reason)
        self.retryable = retryable
        self.reason = reason


def fetch_metrics(client: httpx.Client, url: str, *, timeout_seconds: float) -> str:
    """The text of the page at `url`. Raises ScrapeFailed for network errors and non-200 answers."""
    try:
        response = client.get(url, timeout=timeout_seconds, headers={"Accept": "text/plain"})
    except httpx.TimeoutException:
        raise ScrapeFailed(retryable=True, reason=f"timed out after {timeout_seconds} s") from None
    except httpx.TransportError as exc:
        raise ScrapeFailed(retryable=True, reason=f"{exc.__class__.__name__}: {exc}") from None
    if response.status_code != 200:
        # 5xx may pass; 4xx (wrong path, auth) will not without a change of configuration.
        retryable = response.status_code >= 500
        raise ScrapeFailed(retryable=retryable, reason=f"HTTP {response.status_code}")
    return response.text
