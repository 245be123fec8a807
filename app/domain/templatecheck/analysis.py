"""One side of a check (a template at one commit): its renders tokenized, whether each sample renders
the same under every perturbation, the stable prefix every render shares (cut at the boundary marker),
and what ends it.

A render's tokens are the prompt the server sees: the render itself for a completion template, the
render as the system message of the model's chat template for a chat one (``Wrap``). Token positions
map back to template lines through the render's spots (app/domain/templatecheck/render.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from app.domain.killers import KillerClass, KillerSettings
from app.domain.killers.text import decoded_windows, text_class
from app.domain.templatecheck.config import TemplateEntry
from app.domain.templatecheck.findings import Finding, Rule
from app.domain.templatecheck.perturb import Conditions, Variant, perturbations, swaps
from app.domain.templatecheck.render import Rendered


class Tokenizer(Protocol):
    """The served model's tokenizer: ids and each token's start offset in the text; ids back to text."""

    def encode_batch(self, texts: Sequence[str]) -> list[tuple[list[int], list[int]]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


Render = Callable[[Mapping[str, Any], Conditions], Rendered]
"""One sample's context under conditions into its render; raises RenderError."""
Wrap = Callable[[str, Mapping[str, Any]], str]
"""A render and its context into the prompt text the server tokenizes (identity for completions)."""

KNOWN_CLASSES = {
    "clock": KillerClass.TIMESTAMP, "zone": KillerClass.TIMESTAMP,
    "order": KillerClass.REORDERED_ITEMS, "hash_seed": KillerClass.REORDERED_ITEMS,
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Prompt:
    """One variant's render as the server's prompt: its text, token ids and token start offsets, and
    where the render starts in the text (``shift``: after a chat template's header)."""

    variant: Variant
    rendered: Rendered
    text: str
    shift: int
    ids: tuple[int, ...]
    starts: tuple[int, ...]

    def line_at(self, token: int, variable: str | None = None) -> int | None:
        """The template line of the token (the loop over ``variable`` where one renders it); None for
        text that is not the template's (a chat header, a command's output)."""
        if not self.rendered.spots or token >= len(self.starts):
            return None
        char = self.starts[token] - self.shift
        if not 0 <= char < len(self.rendered.text):
            return None
        return self.rendered.spot_at(char).line_for(variable)

    def token_at(self, char: int) -> int:
        """The index of the token that holds character ``char`` of the prompt text."""
        return max(bisect.bisect_right(self.starts, char) - 1, 0)


@dataclass(frozen=True, slots=True)
class Cause:
    """What makes renders differ at a token: the variant's label and variable, the line and the class."""

    label: str
    variable: str | None
    line: int | None
    klass: KillerClass
    token: int


@dataclass(frozen=True, slots=True)
class Side:
    """A template at one commit, checked: its prompts (the samples first), the stable prefix's length
    in tokens and in whole blocks a request can reuse, what ends it, and the findings."""

    prompts: tuple[Prompt, ...]
    stable_tokens: int
    reusable_blocks: int
    ends: Cause | None
    findings: tuple[Finding, ...]

    @property
    def first(self) -> Prompt:
        return self.prompts[0]

    @property
    def stable_text(self) -> str:
        first = self.first
        return (
            first.text[: first.starts[self.stable_tokens]]
            if self.stable_tokens < len(first.ids)
            else first.text
        )


@dataclass(frozen=True, slots=True)
class Template:
    """A template to check at one commit: its product name, file, entry and how to render it."""

    name: str
    path: str
    source: str
    entry: TemplateEntry
    render: Render
    wrap: Wrap
    command: bool = False


def check_side(template: Template, tokenizer: Tokenizer, *, block_size: int, now: Conditions) -> Side:
    """Render every variant of every sample, tokenize, and judge. Raises RenderError."""
    entry = template.entry
    variants = [
        v for s in range(len(entry.samples)) for v in perturbations(entry, s, now, command=template.command)
    ]
    variants += swaps(entry, now)
    prompts = _prompts(template, variants, tokenizer)
    findings = _nondeterministic(template, prompts, tokenizer)
    common = _common_prefix([p.ids for p in prompts])
    stable = common
    if entry.marker is not None:
        marker, marker_findings = _marker(template, prompts, common, tokenizer)
        findings += marker_findings
        stable = min(common, marker) if marker is not None else common
    last = min(len(p.ids) for p in prompts) - 1  # the last prompt token is always computed again
    reusable = min(stable, last) // block_size
    ends = (
        _cause_at(template, prompts, stable, tokenizer) if stable < max(len(p.ids) for p in prompts) else None
    )
    return Side(tuple(prompts), stable, max(reusable, 0), ends, tuple(findings))


def _prompts(template: Template, variants: list[Variant], tokenizer: Tokenizer) -> list[Prompt]:
    rendered = [template.render(v.context, v.conditions) for v in variants]
    texts = [template.wrap(r.text, v.context) for r, v in zip(rendered, variants, strict=True)]
    encoded = tokenizer.encode_batch(texts)
    return [
        Prompt(v, r, text, max(text.find(r.text), 0), tuple(ids), tuple(starts))
        for v, r, text, (ids, starts) in zip(variants, rendered, texts, encoded, strict=True)
    ]


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where the sequences differ (the shorter's length when one is the other's
    prefix); None when they are equal."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def _common_prefix(sequences: list[tuple[int, ...]]) -> int:
    shortest = min(sequences, key=len)
    for sequence in sequences:
        found = first_difference(shortest, sequence[: len(shortest)])
        if found is not None:
            shortest = shortest[:found]
    return len(shortest)


def _reference(prompts: list[Prompt], prompt: Prompt) -> Prompt:
    """The sample render a variant is compared with: its sample's own."""
    return next(p for p in prompts if p.variant.kind is None and p.variant.sample == prompt.variant.sample)


def _nondeterministic(template: Template, prompts: list[Prompt], tokenizer: Tokenizer) -> list[Finding]:
    """One finding per perturbation (and variable) that changes some sample's render: the first sample's."""
    found: dict[tuple[str, str | None], Finding] = {}
    for prompt in prompts:
        kind = prompt.variant.kind
        if kind is None or kind == "swap" or (kind, prompt.variant.variable) in found:
            continue
        reference = _reference(prompts, prompt)
        token = first_difference(reference.ids, prompt.ids)
        if token is None:
            continue
        cause = _cause(template, prompt, [reference, prompt], token, tokenizer)
        where = f"line {cause.line}" if cause.line else "its output"
        what = f"`{cause.variable}` ({cause.label})" if cause.variable else cause.label
        found[(kind, prompt.variant.variable)] = Finding(
            Rule.NONDETERMINISTIC, "error", template.name, template.path,
            f"non-deterministic at {where}: {what} changes the prompt at token {token}",
            cause.line, token, cause.variable, cause.klass,
        )  # fmt: skip
    return list(found.values())


def _marker(
    template: Template, prompts: list[Prompt], common: int, tokenizer: Tokenizer
) -> tuple[int | None, list[Finding]]:
    """The marker's token position in the first sample, and the findings: a render without it, and
    each per-request variable (or other difference between samples) above it."""
    marker = template.entry.marker or ""
    missing = [p for p in prompts if p.variant.kind is None and marker not in p.rendered.text]
    if missing:
        message = (
            f"the boundary marker {marker!r} is not in the render of sample {missing[0].variant.sample + 1}"
        )
        return None, [Finding(Rule.MARKER_MISSING, "error", template.name, template.path, message)]
    first = prompts[0]
    position = first.token_at(first.shift + first.rendered.text.index(marker))
    if common >= position:
        return position, []
    return position, _above_marker(template, prompts, position, tokenizer)


def _above_marker(
    template: Template, prompts: list[Prompt], position: int, tokenizer: Tokenizer
) -> list[Finding]:
    found: list[Finding] = []
    for prompt in prompts:
        variant = prompt.variant
        if variant.kind not in ("swap", None) or (variant.kind is None and variant.sample == 0):
            continue
        reference = prompts[0]
        token = first_difference(reference.ids, prompt.ids)
        if token is None or token >= position:
            continue
        cause = _cause(template, prompt, [reference, prompt], token, tokenizer)
        what = (
            f"`{cause.variable}` (per request)" if cause.variable else f"sample {variant.sample + 1} differs"
        )
        found.append(Finding(
            Rule.ABOVE_MARKER, "error", template.name, template.path,
            f"above the boundary marker at line {cause.line}: {what}, at token {token} of {position} "
            "that every request must share", cause.line, token, cause.variable, cause.klass,
        ))  # fmt: skip
    return found[:1] if not any(f.variable for f in found) else [f for f in found if f.variable]


def _cause_at(template: Template, prompts: list[Prompt], token: int, tokenizer: Tokenizer) -> Cause | None:
    """What ends the stable prefix at ``token``: the first variant whose render departs from its
    reference there, classed over every prompt that goes on past it. Perturbations and swaps first:
    they name their cause; another sample's render only shows that the samples differ."""
    for prompt in sorted(prompts, key=lambda p: p.variant.kind is None):
        if prompt.variant.kind is None and prompt.variant.sample == 0:
            continue
        reference = prompts[0] if prompt.variant.kind in ("swap", None) else _reference(prompts, prompt)
        if first_difference(reference.ids, prompt.ids) == token:
            distinct = list({p.ids: p for p in prompts if len(p.ids) > token}.values())
            return _cause(template, prompt, distinct, token, tokenizer)
    return None


def _cause(
    template: Template, prompt: Prompt, around: list[Prompt], token: int, tokenizer: Tokenizer
) -> Cause:
    variant = prompt.variant
    line = prompt.line_at(token, variant.variable)
    if variant.variable is not None and variant.variable in template.entry.per_user:
        klass = KillerClass.PER_USER
    elif variant.kind in KNOWN_CLASSES:
        klass = KNOWN_CLASSES[variant.kind]
    else:
        klass = _text_class(around, token, tokenizer)
    return Cause(variant.label, variant.variable, line, klass, token)


def _text_class(prompts: list[Prompt], token: int, tokenizer: Tokenizer) -> KillerClass:
    """The product's killer classifier (app/domain/killers/text.py) over the prompts at the token."""
    lists = [np.asarray(p.ids, dtype=np.int64) for p in prompts if len(p.ids) > token]
    if len(lists) < 2:
        return KillerClass.VARYING_TEXT
    windows = decoded_windows(lists, token, 64, lambda ids: tokenizer.decode(list(ids)), KillerSettings())
    return text_class(windows)
