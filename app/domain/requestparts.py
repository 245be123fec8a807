"""Which part of a request changed, from the digests of its parts and of the request it departs
from (the gateway's, collectors/parts.py, stored on the record as JSON), and where each part starts
in the rendered prompt when the gateway learned it (collectors/partstarts.py: token positions).

Where the starts are known, the part named is the one whose span holds the token where the prompt
departs: a changed part that starts after the departure did not cause it, nor did one followed,
before the departure, by another changed part. A departure known to its block only (no token ids)
lies anywhere in that block, so every changed part starting inside it remains a candidate too; so
does a changed part whose start is not known (vLLM's /tokenize takes no tool choice nor response
format). Among the candidates left, and when nothing is known of the starts, the rule order names one:
the model or LoRA adapter (every block differs), then the tools, the system message, the request
parameters the chat template renders (tool choice, response format, reasoning effort, the other
template arguments), the history (an earlier message edited, removed or summarized: not appended to),
and last the latest messages. So a request whose latest message and a template argument rendered
after it (Qwen3's `enable_thinking`, at the generation prompt) both changed departs in its latest
message by the starts, and in its template arguments by the rule order alone.

A request that differs only in its latest messages (every other part the same, the earlier request's
history in place: a turn appended, a new question), or whose departure lies in them, did not change
its prompt: everything the chat template renders before its own messages is what the earlier request
sent, so it departs where its own content starts, and those tokens are its new content (`own_turn`).
The family's usual fan-out point (app/domain/fanout.py) says the same from token positions alone,
and cannot after a change that moved the conversation's own content up: once a history is compacted,
the questions after it start above the point the longer history taught, and only the parts tell them
from a change.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from app.domain.lossruns import main_cause, new_content_after
from app.domain.misses import PART_LABELS, Cause, Diagnosis, RequestPart


class PartDetail(StrEnum):
    """How the tools changed."""

    ADDED = "added"
    REMOVED = "removed"
    EDITED = "edited"  # a tool of the set changed, or tools were both added and removed
    REORDERED = "reordered"
    RESERIALIZED = "re-serialized"


DETAIL_LABELS: dict[PartDetail, str] = {
    PartDetail.ADDED: "added",
    PartDetail.REMOVED: "removed",
    PartDetail.EDITED: "edited",
    PartDetail.REORDERED: "reordered",
    PartDetail.RESERIALIZED: "re-serialized",
}


def change_text(part: str, detail: str) -> str:
    """How pages say a changed part (values as stored): "tools reordered", "chat-template argument
    enable_thinking", "system message"; "" for none."""
    if not part:
        return ""
    label = PART_LABELS.get(RequestPart(part), part) if part in _PART_VALUES else part
    if part == RequestPart.TEMPLATE_KWARGS and detail:
        return f"chat-template argument {detail}"
    return f"{label.lower()} {detail}" if detail else label.lower()


_PART_VALUES = frozenset(RequestPart)


@dataclass(frozen=True, slots=True)
class Parts:
    """A request's parts as digests ("" for absent), and its model name as the record has it."""

    model: str = ""
    adapter: bool = False  # the model name is a LoRA adapter of its server, not the base model
    system: str = ""
    tools: tuple[str, ...] = ()
    tools_sent: str = ""
    tool_choice: str = ""
    response_format: str = ""
    reasoning_effort: str = ""
    template_kwargs: Mapping[str, str] = field(default_factory=dict)
    messages: tuple[str, ...] = ()
    latest: int = 0
    starts: Mapping[str, int] = field(default_factory=dict)  # part (RequestPart's value) -> token

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], *, model: str, adapter: bool) -> Parts:
        """As stored on a record (PartDigests' JSON, its defaults left out); `model` and `adapter`
        from the record and its server."""
        return cls(
            model=model,
            adapter=adapter,
            system=str(stored.get("system", "")),
            tools=tuple(stored.get("tools", ())),
            tools_sent=str(stored.get("tools_sent", "")),
            tool_choice=str(stored.get("tool_choice", "")),
            response_format=str(stored.get("response_format", "")),
            reasoning_effort=str(stored.get("reasoning_effort", "")),
            template_kwargs=dict(stored.get("template_kwargs", {})),
            messages=tuple(stored.get("messages", ())),
            latest=int(stored.get("latest", 0)),
            starts={str(k): int(v) for k, v in stored.get("starts", {}).items()},
        )

    @property
    def history(self) -> int:
        """How many leading messages are earlier turns (not the request's own)."""
        return max(len(self.messages) - self.latest, 0)


@dataclass(frozen=True, slots=True)
class PartChange:
    part: RequestPart
    detail: PartDetail | None = None
    kwarg: str = ""  # template_kwargs: the first argument (by name) that differs


def changed_part(ours: Parts, theirs: Parts, departs: range | None = None) -> PartChange | None:
    """The part of `ours` that departs from `theirs` (the earlier request): among the changed parts
    whose span in `ours` may hold the departure (a token of `departs`, when known), the first in rule
    order (the module's docstring); None when no part differs (a completions request, or the same parts
    rendered differently: a template change)."""
    changes = _changes(ours, theirs)
    if departs is not None and changes:
        held = _holding(changes, ours.starts, departs)
        changes = [change for change in changes if change.part in held]
    return changes[0] if changes else None


def part_at(starts: Mapping[str, int], position: int) -> RequestPart | None:
    """The part whose span holds token `position`: the one starting last at or before it (of parts
    starting at the same token, the first in rule order); None when no start is known at or before it."""
    before = [(-start, _RULE_ORDER.index(RequestPart(p))) for p, start in starts.items()
              if p in _RULE_ORDER and start <= position]  # fmt: skip
    return _RULE_ORDER[min(before)[1]] if before else None


def _changes(ours: Parts, theirs: Parts) -> list[PartChange]:
    """Every changed part, in rule order."""
    if ours.model != theirs.model:
        adapter = ours.adapter or theirs.adapter
        return [PartChange(RequestPart.ADAPTER if adapter else RequestPart.MODEL)]
    changes = []
    if tools := _tools(ours, theirs):
        changes.append(PartChange(RequestPart.TOOLS, tools))
    if ours.system != theirs.system:
        changes.append(PartChange(RequestPart.SYSTEM))
    changes += [
        PartChange(part) for part, name in _PARAMETERS if getattr(ours, name) != getattr(theirs, name)
    ]
    if ours.template_kwargs != theirs.template_kwargs:
        names = sorted(set(ours.template_kwargs) | set(theirs.template_kwargs))
        first = next(n for n in names if ours.template_kwargs.get(n) != theirs.template_kwargs.get(n))
        changes.append(PartChange(RequestPart.TEMPLATE_KWARGS, kwarg=first))
    if _history_rewritten(ours.messages, theirs):
        changes.append(PartChange(RequestPart.HISTORY))
    if ours.messages != theirs.messages:
        changes.append(PartChange(RequestPart.MESSAGES))
    return changes


def _differs(ours: Parts, theirs: Parts, name: str) -> bool:
    return bool(getattr(ours, name) != getattr(theirs, name))


def _holding(changes: Sequence[PartChange], starts: Mapping[str, int], departs: range) -> set[RequestPart]:
    """The changed parts whose span may hold a token of `departs`: those starting last at or before
    its first token, those starting inside it, and those whose start is not known."""
    known = {c.part: starts[c.part] for c in changes if c.part in starts}
    held = {c.part for c in changes if c.part not in known}
    held |= {part for part, start in known.items() if departs.start < start < departs.stop}
    if before := [start for start in known.values() if start <= departs.start]:
        held |= {part for part, start in known.items() if start == max(before)}
    return held


def own_turn(found: Diagnosis) -> Diagnosis:
    """The diagnosis with a prompt change that is only the request's own latest messages (its changed
    part `messages`, by `changed_part`) read as what it is: its tokens from where it departs are its
    new content, not a loss, and no part changed. Any other diagnosis as it is."""
    changed = [loss.first_token for loss in found.losses if loss.cause == Cause.PROMPT_CHANGED]
    if found.changed_part != RequestPart.MESSAGES or not changed:
        return found
    losses = new_content_after(list(found.losses), min(changed))
    # New content is among the losses now: main_cause only reads `reusable` when there is none.
    return replace(
        found, cause=main_cause(losses, reusable=1), diverged_at=None, losses=tuple(losses),
        changed_part=None, part_detail="",
    )  # fmt: skip


# The parts a chat template renders, in rule order (the model and adapter are no span of the prompt).
_RULE_ORDER = (
    RequestPart.TOOLS, RequestPart.SYSTEM, RequestPart.TOOL_CHOICE, RequestPart.RESPONSE_FORMAT,
    RequestPart.REASONING_EFFORT, RequestPart.TEMPLATE_KWARGS, RequestPart.HISTORY, RequestPart.MESSAGES,
)  # fmt: skip
_PARAMETERS = (
    (RequestPart.TOOL_CHOICE, "tool_choice"),
    (RequestPart.RESPONSE_FORMAT, "response_format"),
    (RequestPart.REASONING_EFFORT, "reasoning_effort"),
)


def _tools(ours: Parts, theirs: Parts) -> PartDetail | None:
    mine, before = set(ours.tools), set(theirs.tools)
    if mine != before:
        if mine > before:
            return PartDetail.ADDED
        return PartDetail.REMOVED if mine < before else PartDetail.EDITED
    if ours.tools != theirs.tools:
        return PartDetail.REORDERED
    if ours.tools_sent != theirs.tools_sent:
        return PartDetail.RESERIALIZED
    return None


def _history_rewritten(ours: Sequence[str], theirs: Parts) -> bool:
    """Whether a message the earlier request had as history is not where it was: edited, removed
    or summarized (a conversation appended to keeps every earlier message in its place)."""
    kept = theirs.history
    return any(i >= len(ours) or ours[i] != theirs.messages[i] for i in range(kept))


@dataclass(slots=True)
class RecentParts:
    """The parts of a family's earlier requests, by the blocks of their chains: the request an
    earlier prompt was departed from is the latest one holding its last shared block (all of its
    blocks before cover the same tokens). Bounded: past `limit` blocks, the ones not seen for the
    longest are forgotten first."""

    limit: int
    _by_block: dict[int | None, tuple[Hashable, Parts]] = field(default_factory=dict)

    def remember(self, chain: Sequence[int], key: Hashable, parts: Parts) -> None:
        by_block = self._by_block
        entry = (key, parts)
        for block in (None, *chain):  # popped first: a dict keeps the first insertion's place
            by_block.pop(block, None)
            by_block[block] = entry
        while len(by_block) > self.limit:
            del by_block[next(iter(by_block))]

    def compared(self, chain: Sequence[int]) -> tuple[Hashable, Parts] | None:
        """The latest earlier request sharing the most leading blocks with `chain` (the latest of
        all when none shares its first)."""
        found = self._by_block.get(None)
        for block in chain:
            if (entry := self._by_block.get(block)) is None:
                break
            found = entry
        return found
