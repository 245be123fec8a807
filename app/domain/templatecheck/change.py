"""What a commit does to a template's stable prefix: where head's departs from base's, whether the
reusable part grows or shrinks, and whether it still matches its committed golden copy."""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.templatecheck.analysis import Cause, Side, first_difference
from app.domain.templatecheck.findings import Finding, Rule


@dataclass(frozen=True, slots=True)
class Change:
    """Base's and head's stable prefixes compared on the first sample: the token where head's departs
    (None when the prefixes are the same), its line in head's template, and both lengths."""

    departs_at: int | None
    line: int | None
    base_tokens: int
    head_tokens: int
    base_blocks: int
    head_blocks: int
    ends: Cause | None

    @property
    def blocks_delta(self) -> int:
        return self.head_blocks - self.base_blocks

    @property
    def direction(self) -> str:
        """``shrinks`` or ``grows`` (in whole reusable blocks), ``edited`` (the same blocks, other
        text) or ``same``."""
        if self.blocks_delta < 0:
            return "shrinks"
        if self.blocks_delta > 0:
            return "grows"
        return "same" if self.departs_at is None else "edited"


def compare_sides(base: Side, head: Side) -> Change:
    """How head's stable prefix differs from base's."""
    departs = first_difference(base.first.ids[: base.stable_tokens], head.first.ids[: head.stable_tokens])
    variable = head.ends.variable if head.ends else None
    line = head.first.line_at(departs, variable) if departs is not None else None
    return Change(
        departs,
        line,
        base.stable_tokens,
        head.stable_tokens,
        base.reusable_blocks,
        head.reusable_blocks,
        head.ends,
    )


def change_findings(name: str, path: str, change: Change, block_size: int) -> list[Finding]:
    """A shrinking prefix is an error (its price may clear it: app/domain/templatecheck/price.py); an
    edit inside it is a note (the cache refills once)."""
    if change.departs_at is None:
        return []
    where = f"line {change.line}, token {change.departs_at}" if change.line else f"token {change.departs_at}"
    size = (
        f"from {change.base_tokens:,} to {change.head_tokens:,} tokens "
        f"({change.base_blocks} to {change.head_blocks} blocks of {block_size})"
    )
    ends = change.ends
    if change.direction == "shrinks":
        why = f"; it now ends at `{ends.variable or ends.label}` ({ends.klass})" if ends else ""
        return [Finding(
            Rule.PREFIX_SHRINKS, "error", name, path,
            f"the stable prefix departs from base's at {where} and shrinks {size}{why}",
            change.line, change.departs_at, ends.variable if ends else None, ends.klass if ends else None,
        )]  # fmt: skip
    verb = "grows" if change.direction == "grows" else "keeps its length"
    return [Finding(
        Rule.PREFIX_CHANGES, "note", name, path,
        f"the stable prefix departs from base's at {where} and {verb} ({size}): the cache refills once",
        change.line, change.departs_at,
    )]  # fmt: skip


def golden_findings(name: str, path: str, head: Side, golden: str | None, golden_path: str) -> list[Finding]:
    """Head's stable prefix against its golden copy (``golden`` is the file's text at head, None when
    the file is missing)."""
    if golden is None:
        missing = f"the golden file {golden_path} is missing: write it with --update-golden and commit it"
        return [Finding(Rule.GOLDEN_DRIFT, "error", name, path, missing)]
    text = head.stable_text
    if golden == text:
        return []
    char = next(
        (i for i, (a, b) in enumerate(zip(golden, text, strict=False)) if a != b), min(len(golden), len(text))
    )
    token = head.first.token_at(char)
    line = head.first.line_at(token)
    where = f"line {line}, token {token}" if line else f"token {token}"
    return [Finding(
        Rule.GOLDEN_DRIFT, "error", name, path,
        f"the stable prefix departs from its golden copy {golden_path} at {where}: if intended, update the "
        "golden in the same commit (--update-golden)", line, token,
    )]  # fmt: skip
