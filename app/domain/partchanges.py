"""Which part of a changed request differs from the earlier request of its family it departs from.

The gateway keeps digests of each chat request's parts (app/domain/requestparts.py). The diagnosis
(app/domain/misscauses.py) finds where a prompt departs from its family's earlier prompts; here the
request it departs from is looked up by the blocks they share, and their parts compared: the system
message, the tools, a request parameter the chat template renders, the history, the model.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import replace

from app.domain.misses import Diagnosis, RequestPart
from app.domain.requestparts import RecentParts, changed_part, own_turn
from app.domain.requestprompt import RequestPrompt

# Blocks whose latest request's part digests are kept per template and salt: the earlier requests a
# changed prompt is compared with (a quarter of what Followers keeps: its recent prompts are enough).
PARTS_MEMORY_BLOCKS = 16_384


class FamilyParts:
    """The part digests of each family's (template and salt) recent requests, by their blocks."""

    def __init__(self) -> None:
        self._recent: dict[tuple[Hashable, str], RecentParts] = {}

    def remember(self, request: RequestPrompt, chain: list[int]) -> None:
        """Keep the request's parts, if it has them, as the latest to hold its blocks."""
        if request.parts is not None:
            recent = self._recent.setdefault((request.family, request.salt), RecentParts(PARTS_MEMORY_BLOCKS))
            recent.remember(chain, request.key, request.parts)

    def named(self, request: RequestPrompt, chain: list[int], found: Diagnosis) -> Diagnosis:
        """`found` with the part that changed, compared with the earlier request of its family it
        departs from, when both have part digests. A model or adapter changes every block's hash:
        the prompt then departs at its first token, whatever tokens it shares."""
        recent = self._recent.get((request.family, request.salt))
        compared = recent.compared(chain) if recent is not None and request.parts is not None else None
        if compared is None:
            return found
        assert request.parts is not None
        change = changed_part(request.parts, compared[1], _departs(found.diverged_at, request))
        if change is None:
            return replace(found, compared_with=compared[0])
        detail = change.detail.value if change.detail else change.kwarg
        diverged = 0 if change.part in (RequestPart.MODEL, RequestPart.ADAPTER) else found.diverged_at
        # Its own latest messages alone changed: what the parts say settles what the fan-out point
        # guessed from positions (own_turn: a question after a compacted history is new content).
        return own_turn(replace(found, diverged_at=diverged, changed_part=change.part, part_detail=detail,
                                compared_with=compared[0]))  # fmt: skip


def _departs(at: int | None, request: RequestPrompt) -> range | None:
    """The tokens a departure found at `at` may be: that one when found off a block boundary (token
    ids compared), else any of its block (Followers gives a block's first token when it cannot tell)."""
    if at is None:
        return None
    size = request.block_size or 1
    return range(at, at + 1 if request.token_ids is not None and at % size else at + size)
