"""Mooncake's trace format: the public traces of its FAST '25 paper, and what Dynamo's replay and
data generator, AIPerf's trace replay and kvcache-simulator read. One request a line:

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ...]}

- `timestamp`: milliseconds from the trace's start (absent: the line's place in the file);
- `input_length`, `output_length`: tokens;
- `hash_ids`: "remapped prefix block hashes", one per block of 512 tokens, the last for the
  partial block that ends the prompt; equal ids are the same prefix up to that block, as vLLM's
  chained hashes are. A line's `block_size`, where it has one, says another size (Dynamo's data
  generator writes traces at any).

The file holds no token ids (nor text): the analysis is block-exact, at the trace's block size.
vLLM caches only full blocks, so the id of a prompt's partial last block is left out.
`request_id` and `session_id`, where a line has them, are kept.
"""

from __future__ import annotations

from typing import Any

from app.analyzer.lines import BadLine, Line, Skip, natural, text
from app.domain.blockhash import wire_to_signed

BLOCK_SIZE = 512  # tokens per hash id in Mooncake's traces
_MAX_ID = 1 << 64  # ids are keys of the analysis: 64-bit, as an engine's hashes are


def read_line(item: dict[str, Any], number: int) -> Line:
    """One Mooncake line into a `Line`; BadLine for a field of the wrong type, or fewer ids than
    the prompt's full blocks (what its blocks hold is then unknown)."""
    prompt = natural(item.get("input_length"), None)
    if prompt is None:
        raise BadLine(Skip.NO_PROMPT)
    if prompt == 0:
        raise BadLine(Skip.EMPTY_PROMPT)
    size = natural(item.get("block_size"), BLOCK_SIZE)
    ids = item.get("hash_ids")
    if not size or not isinstance(ids, list) or len(ids) < prompt // size:
        raise BadLine(Skip.BAD_FIELD)
    full = ids[: prompt // size]
    if not all(type(key) is int and 0 <= key < _MAX_ID for key in full):
        raise BadLine(Skip.BAD_FIELD)
    return Line(
        request_id=text(item.get("request_id"), f"line-{number}"),
        arrived=_seconds(item.get("timestamp")),
        prompt_tokens=prompt,
        session=text(item.get("session_id")),
        output_tokens=natural(item.get("output_length"), 0) or 0,
        block_size=size,
        block_hashes=tuple(map(wire_to_signed, full)),
    )


def _seconds(milliseconds: object) -> float | None:
    if milliseconds is None:
        return None
    if isinstance(milliseconds, int | float) and not isinstance(milliseconds, bool) and milliseconds >= 0:
        return milliseconds / 1000
    raise BadLine(Skip.BAD_FIELD)
