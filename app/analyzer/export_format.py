"""Prefixscope's own trace export: one JSON object per line, the fields of a replay's TraceRequest
(app/domain/replay/trace.py).

    {"request_id": "r1", "arrived": 1767225600.25, "prompt_tokens": 1830, "server": "vllm-a",
     "group": "llama-3-8b", "salt": "<sha256 of the salt, hex>", "tenant": "acme",
     "template": "support-bot", "session": "", "output_tokens": 120, "held_seconds": 0.0,
     "block_size": 16, "block_hashes": [<uint64 wire hashes>], "unsalted_hashes": [...],
     "cached_tokens": 1600, "token_ids": [...]}

`arrived` is Unix seconds; `block_hashes` are the engine's chain as on the wire (uint64), salted
as it hashed them, and `unsalted_hashes` the same without the salt (empty when unsalted);
`token_ids` only where they were kept (absent otherwise); `cached_tokens` null when not reported.
manage.py export_trace writes it; the analyzer reads it (format `prefixscope`).
"""

from __future__ import annotations

from typing import Any

import msgspec

from app.analyzer.lines import BadLine, Line, Lines, Skip, add_token_ids, natural, text
from app.domain.blockhash import signed_to_wire, wire_to_signed


class ExportLine(msgspec.Struct, omit_defaults=True):
    """One exported request (see the module's docstring)."""

    request_id: str
    arrived: float
    prompt_tokens: int
    server: str = ""
    group: str = ""
    salt: str = ""
    tenant: str = ""
    template: str = ""
    session: str = ""
    output_tokens: int = 0
    held_seconds: float = 0.0
    block_size: int = 0
    block_hashes: list[int] = []
    unsalted_hashes: list[int] = []
    cached_tokens: int | None = None
    token_ids: list[int] | None = None


def wire_hashes(signed: list[int]) -> list[int]:
    """Stored (signed) hashes as the wire's uint64s."""
    return [signed_to_wire(value) for value in signed]


def read_line(lines: Lines, item: dict[str, Any], number: int) -> Line:
    """One export line into a `Line` (hashes back to signed 64-bit, as the analysis keys them)."""
    arrived = item.get("arrived")
    if not isinstance(arrived, int | float) or isinstance(arrived, bool):
        raise BadLine(Skip.BAD_FIELD)
    hashes, unsalted = item.get("block_hashes") or [], item.get("unsalted_hashes") or []
    try:
        signed = tuple(map(wire_to_signed, hashes))
        unsalted_signed = tuple(map(wire_to_signed, unsalted))
    except (TypeError, ValueError):
        raise BadLine(Skip.BAD_FIELD) from None
    token_ids = item.get("token_ids")
    span = add_token_ids(lines, token_ids) if token_ids is not None else None
    prompt_tokens = natural(item.get("prompt_tokens"), None if span is None else span[1] - span[0])
    if prompt_tokens is None or (span is None and not signed):
        raise BadLine(Skip.NO_PROMPT)
    return Line(
        request_id=text(item.get("request_id"), f"line-{number}"), arrived=float(arrived),
        prompt_tokens=prompt_tokens, server=text(item.get("server")), group=text(item.get("group")),
        salt=text(item.get("salt")), tenant=text(item.get("tenant")), template=text(item.get("template")),
        session=text(item.get("session")), output_tokens=natural(item.get("output_tokens"), 0) or 0,
        held_seconds=_seconds(item.get("held_seconds")),
        cached_tokens=natural(item.get("cached_tokens"), None),
        block_size=natural(item.get("block_size"), 0) or 0, block_hashes=signed,
        unsalted_hashes=unsalted_signed, tokens=span,
    )  # fmt: skip


def _seconds(value: object) -> float:
    if value is None:
        return 0.0
    if isinstance(value, int | float) and not isinstance(value, bool) and value >= 0:
        return float(value)
    raise BadLine(Skip.BAD_FIELD)
