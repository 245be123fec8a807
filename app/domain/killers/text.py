"""What varies at a killer: per-user data from the tree, and from decoded windows of text its samples
and class (whitespace, JSON key order, reordered items, rotating examples, or the varying value)."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from app.domain.blockhash import TokenIds, int64_ids
from app.domain.killers.values import Decode, Ints, KillerClass, KillerSettings


def per_user(tenants: Sequence[str | None], children: Sequence[int], least: int) -> bool:
    """Whether the continuation is a function of the tenant that tells tenants apart: every tenant's
    requests take one continuation, no two tenants share one, and at least ``least`` tenants (two of
    them with repeat requests) take part."""
    by_tenant: dict[str, set[int]] = {}
    by_child: dict[int, set[str]] = {}
    requests: Counter[str] = Counter()
    for tenant, child in zip(tenants, children, strict=True):
        if tenant is not None and child >= 0:
            by_tenant.setdefault(tenant, set()).add(child)
            by_child.setdefault(child, set()).add(tenant)
            requests[tenant] += 1
    repeat = sum(1 for n in requests.values() if n > 1)
    one_to_one = all(len(v) == 1 for v in by_tenant.values()) and all(len(v) == 1 for v in by_child.values())
    return one_to_one and len(by_tenant) >= least and repeat >= 2


@dataclass(frozen=True, slots=True)
class Window:
    """One request's decoded text around the position: ``lead`` (up to the start of the position's line),
    ``text`` (from that line's start on) and ``varying``, the offset in ``text`` where the windows of the
    sampled requests start to differ."""

    lead: str
    text: str
    varying: int

    @property
    def lines(self) -> list[str]:
        """The complete lines of ``text`` (its last line is cut by the window)."""
        return self.text.split("\n")[:-1]

    @property
    def varying_line(self) -> int:
        """The index, in ``lines``, of the line where the windows start to differ."""
        return self.text.count("\n", 0, self.varying)


def decoded_windows(
    token_lists: list[Ints], position: int, width: int, decode: Decode, settings: KillerSettings
) -> list[Window]:
    """Decode ``lead_tokens`` before the position (once: every request has them) and ``width`` tokens
    from it, for each request; one ``decode`` call per request, plus one. ``token_lists`` is not empty."""
    start = max(0, position - settings.lead_tokens)
    lead = decode(token_lists[0][start:position].tolist()) if start < position else ""  # shared by all
    line_start = lead.rfind("\n") + 1
    texts = [decode(tokens[start : position + width].tolist())[line_start:] for tokens in token_lists]
    common = _common_prefix(texts) if len(texts) > 1 else 0  # one text: it varies from the position on
    varying = max(common, len(lead) - line_start)
    return [Window(lead[:line_start], text, varying) for text in texts]


def _common_prefix(texts: list[str]) -> int:
    """The length of the longest prefix every text has."""
    shortest, longest = min(texts), max(texts)  # the lexical extremes bound every common prefix
    size = next((i for i, (a, b) in enumerate(zip(shortest, longest, strict=False)) if a != b), None)
    return min(len(shortest), len(longest)) if size is None else size


def window_samples(windows: list[Window], settings: KillerSettings) -> tuple[tuple[str, int], ...]:
    """The distinct varying lines, cut to ``sample_chars`` around where they start to differ, each with
    the index of the first window that shows it; at most ``max_samples``."""
    chars = settings.sample_chars
    found: dict[str, int] = {}
    for index, window in enumerate(windows):
        line_start = window.text.rfind("\n", 0, window.varying) + 1
        line = window.text[line_start:].split("\n", 1)[0]
        offset = window.varying - line_start
        cut = 0 if len(line) <= chars or offset <= chars // 2 else offset - chars // 4
        found.setdefault(("…" if cut else "") + line[cut : cut + chars], index)
    return tuple(found.items())[: settings.max_samples]


SAMPLE_WINDOW_TOKENS: Final = 64


def sample_texts(
    token_lists: Sequence[TokenIds], position: int, decode: Decode, settings: KillerSettings | None = None
) -> tuple[str, ...]:
    """The samples of the varying text at token ``position`` of these prompts, as ``find_killers``
    gives them: for a killer's ``sample_requests`` decoded again later, where their token ids are still
    kept and the viewer may read them. Prompts that end before the position are left out; none, none."""
    chosen = settings or KillerSettings()
    kept = [int64_ids(ids) for ids in token_lists if len(ids) > position]
    if not kept:
        return ()
    windows = decoded_windows(kept, position, SAMPLE_WINDOW_TOKENS, decode, chosen)
    return tuple(sample for sample, _ in window_samples(windows, chosen))


def text_class(windows: list[Window]) -> KillerClass:
    """The class of the varying text, tried from the most specific: whitespace, JSON, line order,
    rotating examples, then what the varying value looks like."""
    if _whitespace_only(windows):
        return KillerClass.WHITESPACE_DRIFT
    if _same_json(windows):
        return KillerClass.JSON_KEY_ORDER
    common = _common_lines(windows)
    if _reordered(windows, common):
        return KillerClass.REORDERED_ITEMS
    if _rotating(windows, common):
        return KillerClass.ROTATING_EXAMPLES
    return _value_class(windows)


def _whitespace_only(windows: list[Window], beyond: int = 128) -> bool:
    """Whether, whitespace collapsed, the windows agree ``beyond`` characters past where they split
    (or to the end of the shortest): only whitespace differed there."""
    bodies = [" ".join(w.text.rsplit("\n", 1)[0].split()) for w in windows]
    split = len(" ".join(windows[0].text[: windows[0].varying].split()))
    shortest = min(len(body) for body in bodies)
    return shortest > split and _common_prefix(bodies) >= min(shortest, split + beyond)


def _same_json(windows: list[Window]) -> bool:
    """Whether the JSON object around the position is the same value in most windows, written apart."""
    forms = [form for w in windows if (form := _json_around(w)) is not None]
    return len(forms) >= max(2, 0.8 * len(windows)) and len(set(forms)) == 1


def _json_around(window: Window, attempts: int = 32) -> str | None:
    text, target = window.lead + window.text, len(window.lead) + window.varying
    decoder = json.JSONDecoder()
    for match in list(re.finditer(r"\{", text[: target + 1]))[:attempts]:
        try:
            value, end = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict) and end > target:
            return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return None


def _common_lines(windows: list[Window]) -> set[str]:
    """Non-blank lines present in at least 80% of the windows."""
    counts = Counter(line for w in windows for line in set(w.lines) if line.strip())
    return {line for line, n in counts.items() if n >= 0.8 * len(windows)}


def _line_at(window: Window) -> str | None:
    lines = window.lines
    return lines[window.varying_line] if window.varying_line < len(lines) else None


def _reordered(windows: list[Window], common: set[str]) -> bool:
    """The varying line is an item most windows have, and the items come in more than one order."""
    at_common = sum(1 for w in windows if _line_at(w) in common)
    orders = {tuple(line for line in dict.fromkeys(w.lines) if line in common) for w in windows}
    return len(common) >= 2 and at_common >= 0.8 * len(windows) and len(orders) >= 2


def _rotating(windows: list[Window], common: set[str]) -> bool:
    """Several varying lines per window, and the varying line itself recurs: drawn from a small pool."""
    counts = Counter(line for w in windows for line in set(w.lines) if line.strip())
    varying = [[line for line in w.lines if line.strip() and line not in common] for w in windows]
    recurring = sum(1 for w in windows if (line := _line_at(w)) is not None and counts[line] >= 2)
    return sum(map(len, varying)) >= 2 * len(windows) and recurring * 2 >= len(windows)


_MONTH = r"(?:jan|feb|mar|apr|may|jun|jul|aug|sep|sept|oct|nov|dec)[a-z]*\.?"
_WEEKDAY = r"(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*,?"
_ZONE = r"(?:z|utc|gmt|[+-]\d{2}:?\d{2})"
_CLOCK = r"\d{1,2}:\d{2}(?::\d{2})?"
_TIMESTAMPS = (
    rf"\d{{4}}-\d{{2}}-\d{{2}}(?:[t ]\d{{2}}:\d{{2}}(?::\d{{2}}(?:[.,]\d+)?)?\s?{_ZONE}?)?",  # ISO 8601
    rf"(?:{_WEEKDAY}\s+)?\d{{1,2}}\s+{_MONTH}\s+\d{{4}}(?:\s+{_CLOCK}\s*{_ZONE}?)?",  # RFC 2822
    rf"(?:{_WEEKDAY}\s+)?{_MONTH}\s+\d{{1,2}}(?:st|nd|rd|th)?,?\s+\d{{4}}(?:,?\s+{_CLOCK})?",  # Dec 1 2026
    rf"\b{_CLOCK}(?:[.,]\d+)?(?:\s?[ap]m)?\b",  # 12:03:44
    r"\b\d{1,2}/\d{1,2}/\d{2,4}\b",
    r"\b1[5-9]\d{8}(?:\d{3})?\b",  # epoch seconds or milliseconds, 2017 to 2033
)
_IDS = (
    r"\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b",  # uuid
    r"\b(?:request|trace|span|session|message|correlation|call)[ _-]?id\b\W{0,3}[^\s|,;]+",  # labelled
    r"\b(?:req|trace|span|msg|sess|run|job|txn|corr|call|chatcmpl|evt)[-_:][a-z0-9][a-z0-9_-]{3,}",
    r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{8,}\b",  # hex
    r"(?-i:\b(?=[\w+/-]*\d)(?=[\w+/-]*[A-Z])(?=[\w+/-]*[a-z])[\w+/-]{16,}={0,2})",  # base64-ish
)
_VALUE_PATTERNS: Final = (
    (KillerClass.TIMESTAMP, re.compile("|".join(_TIMESTAMPS), re.IGNORECASE)),
    (KillerClass.ID, re.compile("|".join(_IDS), re.IGNORECASE)),
    (KillerClass.NUMBER, re.compile(r"[-+]?\d+(?:[.,]\d+)*")),
)


def _value_class(windows: list[Window]) -> KillerClass:
    """Vote over the windows: the value pattern whose match covers the varying offset of its line, or
    else starts nearest after it; of equal matches, timestamp before id before number."""
    votes: Counter[KillerClass] = Counter()
    for window in windows:
        # Around the varying offset only: a prompt without newlines would make its line the window.
        line_start = max(window.text.rfind("\n", 0, window.varying) + 1, window.varying - 64)
        line = window.text[line_start : window.varying + 256].split("\n", 1)[0]
        offset = window.varying - line_start
        found = [
            (0 if match.start() <= offset < match.end() else 1, match.start(), rank, klass)
            for rank, (klass, pattern) in enumerate(_VALUE_PATTERNS)
            for match in pattern.finditer(line)
            if match.end() > offset
        ]
        if found:
            votes[min(found)[3]] += 1
    if not votes or votes.most_common(1)[0][1] * 2 < len(windows):
        return KillerClass.VARYING_TEXT
    return votes.most_common(1)[0][0]
