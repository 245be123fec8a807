"""The JSON of the OpenAI-compatible answers, shaped as vLLM 0.32 writes them (see the captures).

``CompletionShape`` shapes /v1/completions answers and ``ChatShape`` /v1/chat/completions answers,
whole (``full``) or as the chunks of a server-sent event stream (``chunks``), from a finished
``Completion`` and the request's body (``return_token_ids``, ``stream``, ``stream_options``).
"""

import time
from typing import TYPE_CHECKING, Any

from simulator import tokenizer

if TYPE_CHECKING:
    from simulator.server import Completion

FINGERPRINT = "vllm-0.32.0-simulated"


class CompletionShape:
    """The JSON of /v1/completions answers, as vLLM 0.32 writes them (see the captures)."""

    object_name = "text_completion"

    def usage(self, done: "Completion", *, full: bool) -> dict[str, Any]:
        details: dict[str, Any] = {"cached_tokens": done.cached_tokens}
        if full:
            details.update(created_cache_tokens=None, multimodal_tokens=None)
        usage: dict[str, Any] = {
            "prompt_tokens": len(done.prompt_ids),
            "total_tokens": len(done.prompt_ids) + len(done.output_ids),
            "completion_tokens": len(done.output_ids),
            "prompt_tokens_details": details,
        }
        if full:
            usage["completion_tokens_details"] = None
        return usage

    def choice(
        self,
        text: str,
        done: "Completion",
        body: dict[str, Any],
        *,
        finish: str | None,
        first: bool,
        tokens: list[int],
    ) -> dict[str, Any]:
        ids = bool(body.get("return_token_ids"))
        return {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
            "prompt_token_ids": (done.prompt_ids if ids and first else None),
            "token_ids": tokens if ids else None,
        }

    def full(self, model: str, done: "Completion", body: dict[str, Any]) -> dict[str, Any]:
        choice = self.choice(
            tokenizer.decode(done.output_ids), done, body, finish="length", first=True, tokens=done.output_ids
        )
        return {
            "id": self.id(done),
            "object": self.object_name,
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": self.usage(done, full=True),
            "kv_transfer_params": None,
        }

    def chunks(self, model: str, done: "Completion", body: dict[str, Any]) -> list[dict[str, Any]]:
        head = {"id": self.id(done), "object": self.object_name, "created": int(time.time()), "model": model}
        chunks = []
        last = len(done.output_ids) - 1
        for i, token in enumerate(done.output_ids):
            finish = "length" if i == last else None
            text = tokenizer.decode([token])
            chunks.append(
                {
                    **head,
                    "choices": [self.choice(text, done, body, finish=finish, first=i == 0, tokens=[token])],
                }
            )
        if not (body.get("stream_options") or {}).get("include_usage"):
            # Without a usage chunk, vLLM 0.32 stamps the terminal chunk with the fingerprint.
            chunks[-1]["system_fingerprint"] = FINGERPRINT
        else:
            chunks.append(
                {
                    **head,
                    "choices": [],
                    "usage": self.usage(done, full=False),
                    "system_fingerprint": FINGERPRINT,
                }
            )
        return chunks

    def id(self, done: "Completion") -> str:
        return f"cmpl-{done.request_id}"


class ChatShape(CompletionShape):
    """The JSON of /v1/chat/completions answers."""

    object_name = "chat.completion"

    def choice(
        self,
        text: str,
        done: "Completion",
        body: dict[str, Any],
        *,
        finish: str | None,
        first: bool,
        tokens: list[int],
    ) -> dict[str, Any]:
        key = "message" if not body.get("stream") else "delta"
        choice = {
            "index": 0,
            key: {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish,
            "stop_reason": None,
        }
        # vLLM 0.32 writes the field always: the ids when asked for, else null.
        choice["token_ids"] = tokens if body.get("return_token_ids") else None
        return choice

    def full(self, model: str, done: "Completion", body: dict[str, Any]) -> dict[str, Any]:
        answer = super().full(model, done, body)
        answer["prompt_token_ids"] = done.prompt_ids if body.get("return_token_ids") else None
        return answer

    def chunks(self, model: str, done: "Completion", body: dict[str, Any]) -> list[dict[str, Any]]:
        chunks = super().chunks(model, done, body)
        for chunk in chunks:
            chunk["object"] = "chat.completion.chunk"
        return chunks

    def id(self, done: "Completion") -> str:
        return f"chatcmpl-{done.request_id}"
