"""vLLM's answer to a completion request: what the gateway added is taken out, the facts are read. Pure.

A client must see the bytes vLLM would have sent it had the gateway added nothing (vLLM 0.32,
`vllm/entrypoints/openai/{completion,chat_completion}/serving.py`, checked against the captures):
- without `return_token_ids`, vLLM writes `"prompt_token_ids":null` and `"token_ids":null` (the
  keys stay, only their values are null), and a chat stream sends no chunk whose only news is
  token ids (`"delta":{}` with no finish reason and no logprobs);
- without `stream_options.include_usage`, there is no usage chunk, and the terminal chunk (the one
  with a finish reason) carries the `system_fingerprint` that the usage chunk carries otherwise.
Edits are made in the bytes (a value replaced, a chunk dropped, a field appended), never by
re-encoding, so everything else stays byte for byte as vLLM wrote it.
"""

import re
from dataclasses import dataclass, field
from typing import Any

import msgspec

from collectors.gateway.plan import Plan

# A key (after `{` or `,`, so never inside a string, where `"` is escaped) with an array of ints.
_TOKEN_IDS = re.compile(rb'([{,]\s*"(?:prompt_token_ids|token_ids)"\s*:\s*)\[[0-9,\s]*\]')
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def strip_token_ids(data: bytes) -> bytes:
    """`data` with every `prompt_token_ids` and `token_ids` array replaced by null."""
    return _TOKEN_IDS.sub(rb"\1null", data)


@dataclass(slots=True)
class AnswerFacts:
    """What one answer says about its request; filled as the answer passes."""

    request_id: str = ""
    model: str = ""
    usage: dict[str, Any] | None = None
    samples: int = 1  # the request's n: vLLM numbers choice i of prompt p as p * n + i
    prompts: dict[int, list[int]] = field(default_factory=dict)  # prompt index -> its token ids
    error: bool = False  # an error object instead of (or in the middle of) the answer
    content_seen: bool = False
    malformed: str = ""  # why a part of the answer could not be read (a fixed phrase), if one could not

    def observe(self, payload: dict[str, Any]) -> None:
        """Take what one JSON answer, or one chunk of a stream, tells."""
        if "error" in payload or payload.get("object") == "error":
            self.error = True
            return
        if not self.request_id and isinstance(payload.get("id"), str):
            self.request_id = payload["id"]
        if not self.model and isinstance(payload.get("model"), str):
            self.model = payload["model"]
        if isinstance(payload.get("usage"), dict):
            self.usage = payload["usage"]
        self._prompt(payload.get("prompt_token_ids"), 0)  # chat: one prompt
        choices = payload.get("choices")
        for position, choice in enumerate(choices if isinstance(choices, list) else []):
            if isinstance(choice, dict):
                index = choice.get("index")
                index = index if type(index) is int and index >= 0 else position
                self._prompt(choice.get("prompt_token_ids"), index // self.samples)  # completions
                self.content_seen = self.content_seen or _has_content(choice)

    @property
    def several_prompts(self) -> bool:
        """A completion call with several prompts: each is a request of its own in vLLM."""
        return len(self.prompts) > 1

    @property
    def token_ids(self) -> list[int] | None:
        """The prompt's token ids, when the answer is one prompt's."""
        return None if self.several_prompts else self.prompts.get(0)

    def _prompt(self, ids: Any, prompt: int) -> None:
        if isinstance(ids, list) and all(type(i) is int for i in ids):
            self.prompts.setdefault(prompt, ids)


def _has_content(choice: dict[str, Any]) -> bool:
    if choice.get("text"):
        return True
    delta = choice.get("delta")
    return isinstance(delta, dict) and any(value for key, value in delta.items() if key != "role")


def read_answer(body: bytes, *, samples: int = 1) -> AnswerFacts:
    """The facts of a whole JSON answer to a request of `samples` (n) choices per prompt;
    `malformed` says why when it is not a JSON object."""
    facts = AnswerFacts(samples=samples)
    payload = _decode(body, facts)
    if payload is not None:
        facts.observe(payload)
    return facts


def _decode(data: bytes, facts: AnswerFacts) -> dict[str, Any] | None:
    try:
        payload = msgspec.json.decode(data)
    except msgspec.DecodeError:
        facts.malformed = "answer: not JSON"  # one reason, however it broke: it is counted by reason
        return None
    if not isinstance(payload, dict):
        facts.malformed = "answer: not a JSON object"
        return None
    return payload


class StreamEditor:
    """A server-sent event stream, edited event by event as its bytes arrive.

    `feed` returns the bytes to send on now: the chunk itself when nothing was added to the
    request (events are read on the side), else the edited complete events (an unfinished
    event waits for its end). From a terminal chunk to the usage chunk, events are held back,
    so that the fingerprint the usage chunk brings can be put where vLLM would have put it.
    """

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.facts = AnswerFacts(samples=plan.samples)
        self._buffer = bytearray()
        self._held: list[tuple[bytes, bool]] = []  # (event, is terminal)
        self._server_adds_usage = False  # usage in content chunks: the server sends usage by itself

    def feed(self, chunk: bytes) -> bytes:
        self._buffer += chunk
        edited = []
        while (end := _EVENT_END.search(self._buffer)) is not None:
            event = bytes(self._buffer[: end.end()])
            del self._buffer[: end.end()]
            edited.append(self._event(event))
        return b"".join(edited) if self.plan.edits_answer else chunk

    def close(self) -> bytes:
        """What is left when the stream ends: held events, and an unfinished last event as it came."""
        rest = self._release(None) + bytes(self._buffer)
        self._buffer.clear()
        return rest if self.plan.edits_answer else b""

    def _event(self, event: bytes) -> bytes:
        data = event.removeprefix(b"data:").strip() if event.startswith(b"data:") else b""
        if not data.startswith(b"{"):
            return self._release(None) + event if data == b"[DONE]" else self._queue(event)
        payload = _decode(data, self.facts)
        if payload is None:
            return self._queue(event)
        self.facts.observe(payload)
        if not self.plan.edits_answer or self.facts.error:
            return self._release(None) + event
        return self._edit(event, payload)

    def _edit(self, event: bytes, payload: dict[str, Any]) -> bytes:
        choices = payload.get("choices")
        usage = payload.get("usage")
        if choices and usage is not None:
            self._server_adds_usage = True
        strip_usage = self.plan.added_usage and not self._server_adds_usage
        if strip_usage and choices == [] and usage is not None:
            fingerprint = payload.get("system_fingerprint")
            return self._release(fingerprint if isinstance(fingerprint, str) else None)
        if self.plan.added_token_ids:
            event = strip_token_ids(event)
            if self.plan.chat and _only_token_ids(choices):
                return b""
        terminal = isinstance(choices, list) and any(
            isinstance(c, dict) and c.get("finish_reason") is not None for c in choices
        )
        if strip_usage and (terminal or self._held) and "system_fingerprint" not in payload:
            self._held.append((event, terminal))
            return b""
        return event

    def _queue(self, event: bytes) -> bytes:
        if self._held:
            self._held.append((event, False))
            return b""
        return event

    def _release(self, fingerprint: str | None) -> bytes:
        held = self._held
        released = b"".join(_stamp(e, fingerprint) if t and fingerprint else e for e, t in held)
        self._held.clear()
        return released


def _only_token_ids(choices: Any) -> bool:
    """A chat chunk vLLM sends only because token ids were asked for (an empty delta, nothing else)."""
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return False
    choice = choices[0]
    quiet = choice.get("finish_reason") is None and choice.get("logprobs") is None
    return quiet and choice.get("delta") == {}


def _stamp(event: bytes, fingerprint: str) -> bytes:
    """The event's JSON object with `system_fingerprint` as its last field."""
    close = event.rindex(b"}")
    field = b',"system_fingerprint":' + msgspec.json.encode(fingerprint)
    return event[:close] + field + event[close:]
