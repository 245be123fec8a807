"""vLLM's /tokenize and /detokenize: a prompt (text or chat) in, its token ids (and their strings) out;
token ids in, their text out."""

from collections.abc import Mapping, Sequence
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
    return tokens_from(answer)


def tokens_from(answer: Any) -> tuple[list[int], list[str] | None]:
    """The token ids and token strings (or None) of a decoded /tokenize answer (vLLM's
    `TokenizeResponse`); TokenizeFailed for one without a list of ids."""
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


class DetokenizeFailed(CollectorError):
    """A server's /detokenize gave no usable answer."""


def fetch_text(
    client: httpx.Client, base_url: str, token_ids: Sequence[int], *, timeout_seconds: float
) -> str:
    """POST ``token_ids`` to ``<base_url>/detokenize``; return their text (vLLM's ``prompt``).

    Raises DetokenizeFailed for network errors, non-200 answers and answers without a text.
    """
    url = base_url.rstrip("/") + "/detokenize"
    response = exchange(
        client, "POST", url, timeout_seconds=timeout_seconds, error=DetokenizeFailed,
        json={"tokens": list(token_ids)},
    )  # fmt: skip
    try:
        answer = response.json()
    except ValueError:
        raise DetokenizeFailed(retryable=False, reason="the answer is not JSON") from None
    text = answer.get("prompt") if isinstance(answer, dict) else None
    if not isinstance(text, str):
        raise DetokenizeFailed(retryable=False, reason="the answer has no prompt text")
    return text
