"""The JSON of the OpenAI-compatible answers, shaped as vLLM 0.32 writes them.

``CompletionShape`` shapes /v1/completions answers and ``ChatShape`` /v1/chat/completions answers,
whole (``full``) or as the chunks of a server-sent event stream (``chunks``), from a finished
``Completion`` and the request's body (``return_token_ids``, ``return_prompt_text``, ``stream_options``).

The key order and the keys present follow vLLM 0.32's pydantic models and how
`vllm/entrypoints/openai/{completion,chat_completion}/serving.py` serialises them: a whole answer
is ``model_dump()`` (every field, null or not), a stream chunk ``model_dump_json(exclude_unset=True)``
(only the fields the server set, null or not), the final usage chunk also ``exclude_none``.
tests/e2e/test_answer_shapes.py compares them with the real server's answers; error answers are
simulator/openai_requests.py's. Not modelled: ``n`` > 1, ``echo``, logprobs, stop strings, tools and
reasoning (their fields stay null, and every answer runs to its max_tokens).
"""

import time
from typing import TYPE_CHECKING, Any

from app.domain import gpt2

if TYPE_CHECKING:
    from simulator.server import Completion

FINGERPRINT = "vllm-0.32.0-simulated"
FINISH_REASON = "length"  # the simulator never samples EOS: every answer runs to max_tokens

Json = dict[str, Any]


def stream_usage(body: Json) -> tuple[bool, bool]:
    """(include_usage, continuous_usage_stats) as vLLM reads them: continuous only with include_usage."""
    options = body.get("stream_options")
    if not isinstance(options, dict):
        return False, False
    include = bool(options.get("include_usage"))
    return include, include and bool(options.get("continuous_usage_stats"))


def token_counts(prompt: int, completion: int) -> Json:
    """``UsageInfo``'s counts, in its field order."""
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}


class CompletionShape:
    """The JSON of /v1/completions answers."""

    def full(self, model: str, done: "Completion", body: Json) -> Json:
        ids = bool(body.get("return_token_ids"))
        choice = {
            "index": 0,
            "text": gpt2.decode(done.output_ids),
            "logprobs": None,
            "finish_reason": FINISH_REASON,
            "stop_reason": None,
            "token_ids": done.output_ids if ids else None,
            "prompt_logprobs": None,
            "prompt_token_ids": done.prompt_ids if ids else None,
            "routed_experts": None,
        }
        return {
            **self.head(model, done, "text_completion"),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": self.whole_usage(done),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def chunks(self, model: str, done: "Completion", body: Json) -> list[Json]:
        """One chunk per output token, then the usage chunk when asked for."""
        ids = bool(body.get("return_token_ids"))
        include_usage, continuous = stream_usage(body)
        head = self.head(model, done, "text_completion")
        chunks = []
        for i, token in enumerate(done.output_ids):
            terminal = i == len(done.output_ids) - 1
            choice = {
                "index": 0,
                "text": gpt2.decode([token]),
                "logprobs": None,
                "finish_reason": FINISH_REASON if terminal else None,
                "stop_reason": None,
                "prompt_token_ids": done.prompt_ids if ids and i == 0 else None,
                "token_ids": [token] if ids else None,
            }
            chunk = {**head, "choices": [choice]}
            if continuous:
                chunk["usage"] = token_counts(len(done.prompt_ids), i + 1)
            if terminal and not include_usage:
                chunk["system_fingerprint"] = FINGERPRINT  # else the usage chunk carries it
            chunks.append(chunk)
        if include_usage:
            chunks.append(self.usage_chunk(head, done))
        return chunks

    def head(self, model: str, done: "Completion", object_name: str) -> Json:
        return {
            "id": f"cmpl-{done.request_id}",
            "object": object_name,
            "created": int(time.time()),
            "model": model,
        }

    def whole_usage(self, done: "Completion") -> Json:
        details = {
            "cached_tokens": done.cached_tokens,
            "created_cache_tokens": None,
            "multimodal_tokens": None,
        }
        return {
            **token_counts(len(done.prompt_ids), len(done.output_ids)),
            "prompt_tokens_details": details,
            "completion_tokens_details": None,
        }

    def usage_chunk(self, head: Json, done: "Completion") -> Json:
        """The last chunk, serialised without its null fields."""
        usage = {
            **token_counts(len(done.prompt_ids), len(done.output_ids)),
            "prompt_tokens_details": self.prompt_details(done),
        }
        return {**head, "choices": [], "usage": usage, "system_fingerprint": FINGERPRINT}

    def prompt_details(self, done: "Completion") -> Json:
        # The completions endpoint passes vLLM's cached tokens only, not the created ones.
        return {"cached_tokens": done.cached_tokens}


class ChatShape(CompletionShape):
    """The JSON of /v1/chat/completions answers.

    A stream opens with a chunk of its own: the role with empty content, and (at the chunk's top
    level) the prompt's token ids and rendered text, null unless asked for. The token chunks carry
    the content alone; only the finishing one has a ``stop_reason``.
    """

    def full(self, model: str, done: "Completion", body: Json) -> Json:
        message = {
            "role": "assistant",
            "content": gpt2.decode(done.output_ids),
            "refusal": None,
            "annotations": None,
            "audio": None,
            "function_call": None,
            "reasoning": None,
        }
        choice = {
            "index": 0,
            "message": message,
            "logprobs": None,
            "finish_reason": FINISH_REASON,
            "stop_reason": None,
            "token_ids": done.output_ids if body.get("return_token_ids") else None,
            "routed_experts": None,
        }
        return {
            **self.head(model, done, "chat.completion"),
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": self.whole_usage(done),
            "prompt_logprobs": None,
            "prompt_token_ids": done.prompt_ids if body.get("return_token_ids") else None,
            "prompt_text": prompt_text(body),
            "kv_transfer_params": None,
            "ec_transfer_params": None,
            "metrics": None,
        }

    def chunks(self, model: str, done: "Completion", body: Json) -> list[Json]:
        """The role chunk, one chunk per output token, then the usage chunk when asked for."""
        include_usage, continuous = stream_usage(body)
        head = self.head(model, done, "chat.completion.chunk")
        chunks = [self.role_chunk(head, done, body, continuous=continuous)]
        for i, token in enumerate(done.output_ids):
            terminal = i == len(done.output_ids) - 1
            chunk = {**head, "choices": [self.delta_choice(token, body, terminal=terminal)]}
            if continuous:
                chunk["usage"] = {
                    **token_counts(len(done.prompt_ids), i + 1),
                    "completion_tokens_details": None,
                }
            if terminal and not include_usage:
                chunk["system_fingerprint"] = FINGERPRINT  # else the usage chunk carries it
            chunks.append(chunk)
        if include_usage:
            chunks.append(self.usage_chunk(head, done))
        return chunks

    def role_chunk(self, head: Json, done: "Completion", body: Json, *, continuous: bool) -> Json:
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        chunk: Json = {**head, "choices": [choice]}
        if continuous:
            chunk["usage"] = {**token_counts(len(done.prompt_ids), 0), "completion_tokens_details": None}
        chunk["prompt_token_ids"] = done.prompt_ids if body.get("return_token_ids") else None
        chunk["prompt_text"] = prompt_text(body)
        return chunk

    def delta_choice(self, token: int, body: Json, *, terminal: bool) -> Json:
        choice: Json = {"index": 0, "delta": {"content": gpt2.decode([token])}, "logprobs": None}
        if terminal:
            choice.update(finish_reason=FINISH_REASON, stop_reason=None)
        else:
            choice["finish_reason"] = None
        choice["token_ids"] = [token] if body.get("return_token_ids") else None
        return choice

    def head(self, model: str, done: "Completion", object_name: str) -> Json:
        return {**super().head(model, done, object_name), "id": f"chatcmpl-{done.request_id}"}

    def whole_usage(self, done: "Completion") -> Json:
        usage = super().whole_usage(done)
        usage["prompt_tokens_details"]["created_cache_tokens"] = done.created_cache_tokens
        return usage

    def prompt_details(self, done: "Completion") -> Json:
        return {"cached_tokens": done.cached_tokens, "created_cache_tokens": done.created_cache_tokens}


def prompt_text(body: Json) -> str | None:
    """The rendered chat prompt when the request asks for it (``return_prompt_text``), else None."""
    if not body.get("return_prompt_text"):
        return None
    return gpt2.render_chat(body["messages"])
