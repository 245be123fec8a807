"""The page's layout of a divergence: chips near the edits, long stretches folded on block boundaries."""

from itertools import pairwise

import pytest

from app.compare.display import CHUNK, Chip, Fold, Layout, Reveal, TextsOf, chip_text, readable
from app.compare.summary import PrefillSlope, compatibility_rows, estimate
from app.domain import gpt2
from app.domain.divergence import Compatibility, compare_prompts
from tests.compare.conftest import prompt_ids

RECORD = Compatibility(model="tiny", hash_algo="sha256_cbor")


def _layout(a: list[int], b: list[int], block_size: int = 16) -> Layout:
    divergence = compare_prompts(a, b, block_size, RECORD, RECORD)
    return Layout(divergence, ids={"a": a, "b": b}, texts={"a": _texts(a), "b": _texts(b)})


def _texts(ids: list[int]) -> TextsOf:
    return lambda start, end: [str(t) for t in ids[start:end]]


def _pieces(layout: Layout, reveal: Reveal | None = None) -> list[Chip | Fold]:
    return [p for segment in layout.segments(reveal) for p in (*segment.a_run, *segment.b_run)]


def test_a_long_prompt_shows_a_few_hundred_chips_and_folds_the_rest_on_block_boundaries() -> None:
    a = prompt_ids("salt-a-1") * 686  # 131,026 tokens
    b = list(a)
    b[65_000] = 50_000

    pieces = _pieces(_layout(a, b))

    chips = [p for p in pieces if isinstance(p, Chip)]
    folds = [p for p in pieces if isinstance(p, Fold)]
    assert len(chips) < 300
    assert len(folds) == 2
    assert all(f.start % 16 == 0 and f.end % 16 == 0 for f in folds)
    assert folds[0].start == 32 and folds[0].label.startswith(f"{folds[0].end - 32:,} identical tokens, ")
    assert "(reusable)" in folds[0].label  # inside the reusable prefix
    # every token of b is either a chip or inside a fold, once
    covered = sorted(
        [(c.index, c.index + 1) for c in chips if c.side == "b"] + [(f.start, f.end) for f in folds]
    )
    assert covered[0][0] == 0 and covered[-1][1] == len(b)
    assert all(left[1] == right[0] for left, right in pairwise(covered))


def test_the_fold_label_counts_tokens_and_blocks_like_the_issue_says() -> None:
    a = list(range(2_000))
    b = [*a[:1_968], 9_999, *a[1_969:]]  # a change near the end

    fold = next(p for p in _pieces(_layout(a, b)) if isinstance(p, Fold))

    assert (fold.start, fold.end) == (32, 1_936)
    assert fold.label == "1,904 identical tokens, 119 blocks (reusable)"


def test_an_opened_fold_shows_a_chunk_and_folds_the_rest_again() -> None:
    a = list(range(10_000))
    layout = _layout(a, a)
    fold = next(p for p in _pieces(layout) if isinstance(p, Fold))

    opened = layout.expand("b", fold.start, fold.end)

    assert [p.index for p in opened if isinstance(p, Chip)] == list(range(fold.start, fold.start + CHUNK))
    rest = opened[-1]
    assert isinstance(rest, Fold) and (rest.start, rest.end) == (fold.start + CHUNK, fold.end)
    first = opened[0]
    assert isinstance(first, Chip) and first.anchor == fold.dom_id


def test_a_revealed_fold_is_open_on_the_page_without_htmx() -> None:
    a = list(range(10_000))
    layout = _layout(a, a)
    fold = next(p for p in _pieces(layout) if isinstance(p, Fold))

    pieces = _pieces(layout, Reveal("b", fold.start, fold.end))

    assert any(isinstance(p, Chip) and p.index == fold.start for p in pieces)


def test_an_inserted_timestamp_is_one_edit_with_b_tokens_marked_and_the_first_divergence_chip() -> None:
    a = gpt2.encode("You are the support assistant. " * 20)
    header = gpt2.encode("Current time: 10:21:32\n")
    b = header + a

    segments = _layout(a, b).segments()

    edit = next(s for s in segments if s.edit == 0)
    assert edit.kind == "inserted" and edit.label.startswith(
        "first divergence at token 0: inserted b 0\u2013"
    )
    chips = [p for p in edit.b_run if isinstance(p, Chip)]
    assert len(chips) == len(header) and all(c.css.startswith("ins") for c in chips)
    assert chips[0].first and chips[0].block == 0


def test_tokens_are_classed_by_their_part_in_the_reuse() -> None:
    a = list(range(100))
    b = [*range(40), 999, *range(41, 100)]
    layout = _layout(a, b)  # blocks of 16: reusable 0-31, shared 32-39, replaced 40, equal again after

    assert [layout.css("b", i) for i in (0, 31, 32, 39, 40, 41, 95, 96)] == [
        "reuse", "reuse", "same", "same", "ins", "after", "after", "after tail",
    ]  # fmt: skip
    assert layout.css("a", 40) == "del"


@pytest.mark.parametrize(
    ("token_str", "text"),
    [
        ("Ġthe", " the"),
        ("Ċ", "\n"),
        ("<|endoftext|>", "<|endoftext|>"),
        ("▁the", " the"),
        ("<0x0A>", "\n"),
        ("<script>", "<script>"),
        ("âĢ", "\\xe2\\x80"),  # the first two bytes of a three-byte character
    ],
)
def test_vocabulary_strings_read_as_the_text_they_stand_for(token_str: str, text: str) -> None:
    assert readable(token_str) == text


@pytest.mark.parametrize(
    ("text", "shown", "newline"),
    [
        (" the", " the", False),
        ("\n", "↵", True),
        ("  ", "··", False),
        ("\t", "⇥", False),
        ("", "∅", False),
        ("\u00a0", "⟨U+00A0⟩", False),  # the page drops whitespace between tags: it must not vanish
        (" \u3000", "·⟨U+3000⟩", False),
    ],
)
def test_chips_show_whitespace_visibly(text: str, shown: str, newline: bool) -> None:
    assert chip_text(text) == (shown, newline)


def test_compatibility_rows_mark_a_salt_difference_as_blocking_and_a_template_one_as_a_note() -> None:
    a = Compatibility(model="tiny", template="bot", tenant_salt="a" * 64)
    b = Compatibility(model="tiny", template="bot-v2", tenant_salt="b" * 64)

    rows = {row.field: row for row in compatibility_rows(a, b)}

    assert rows["tenant_salt"].differs and rows["tenant_salt"].blocks
    assert rows["template"].differs and not rows["template"].blocks
    assert rows["template"].effect.startswith("noted")
    assert not rows["model"].differs
    assert rows["tenant_salt"].a == "sha256 aaaaaaaaaaaa…"


def test_the_estimate_uses_a_measured_slope_or_says_it_is_assumed() -> None:
    measured = estimate(
        1_000, PrefillSlope("vllm-0", 0.0002, 120), assumed_tokens_per_second=8_000, gpu_hour_price=3
    )
    assumed = estimate(1_000, PrefillSlope("", None, 0), assumed_tokens_per_second=8_000, gpu_hour_price=3)

    assert measured.measured and measured.ttft_seconds == pytest.approx(0.2)
    assert "vllm-0" in measured.basis and "120 requests" in measured.basis
    assert not assumed.measured and assumed.basis.startswith("configured 8,000 prefill tokens/s")
    assert assumed.usd_per_1000 == pytest.approx(1000 * 0.125 / 3600 * 3)
