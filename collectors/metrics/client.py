"""One /metrics pull over HTTP (httpx); transport, URL and timeout are the caller's."""

import httpx

from collectors.errors import CollectorError
from collectors.http import exchange


class ScrapeFailed(CollectorError):
    """The page could not be fetched; `retryable` says whether trying again later can help."""


def fetch_metrics(client: httpx.Client, url: str, *, timeout_seconds: float) -> str:
    """The text of the page at `url`. Raises ScrapeFailed for network errors and non-200 answers."""
    headers = {"Accept": "text/plain"}
    answer = exchange(
        client, "GET", url, timeout_seconds=timeout_seconds, error=ScrapeFailed, headers=headers
    )
    return answer.text
