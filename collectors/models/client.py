"""One /v1/models read over HTTP (httpx); transport, URL and timeout are the caller's."""

import httpx

from collectors.http import exchange
from collectors.metrics.client import ScrapeFailed


def fetch_models(client: httpx.Client, url: str, *, timeout_seconds: float) -> str:
    """The text of the model list at `url` (a server's ``<base_url>/v1/models``).

    Raises ScrapeFailed (``retryable`` says whether a later try can help) for network errors and
    non-200 answers, as a /metrics pull does.
    """
    headers = {"Accept": "application/json"}
    answer = exchange(
        client, "GET", url, timeout_seconds=timeout_seconds, error=ScrapeFailed, headers=headers
    )
    return answer.text
