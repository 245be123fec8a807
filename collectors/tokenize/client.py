"""vLLM's /tokenize: a prompt (text or chat) in, its token ids (and their strings) out."""

from collections.abc import Mapping
from typing import Any

import httpx

from collectors.errors import CollectorError
from collectors.http import exchange


class TokenizeFailed(CollectorError):
    """A server's /tokenize gave no usable answer."""


def fetch_tokens(
    client: httpx.Client, base_url: str, body: Mapping[str, Any], *, timeout_seconds: float
) -> tuple[list[int], list[str] | None]:
    """POST ``body`` to ``<base_url>/tokenize``; return the token ids and token strings (or None).

    Raises TokenizeFailed for network errors, non-200 answers and answers without a list of ids.
    """
    url = base_url.rstrip("/") + "/tokenize"
    response = exchange(
        client, "POST", url, timeout_seconds=timeout_seconds, error=TokenizeFailed, json=dict(body)
    )
    try:
        answer = response.json()
    except ValueError:
        raise TokenizeFailed(retryable=False, reason="the answer is not JSON") from None
    tokens, strs = answer.get("tokens") if isinstance(answer, dict) else None, None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise TokenizeFailed(retryable=False, reason="the answer has no list of token ids")
    raw_strs = answer.get("token_strs")
    if (
        isinstance(raw_strs, list)
        and len(raw_strs) == len(tokens)
        and all(isinstance(s, str) for s in raw_strs)
    ):
        strs = list(raw_strs)
    return list(tokens), strs
