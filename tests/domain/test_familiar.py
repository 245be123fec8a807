"""The family's shared text, found again where a volatile span moved it (app/domain/familiar.py)."""

import random

import pytest

from app.domain.blockhash import signed_block_hashes
from app.domain.familiar import FAMILIAR_TOKENS, MAX_SHIFT, FamiliarText

SIZE = 16


def tokens(seed: int, count: int) -> list[int]:
    return random.Random(seed).choices(range(50_000), k=count)


SYSTEM = tokens(1, 640)


def learned(*prompts: list[int], text: FamiliarText | None = None) -> FamiliarText:
    """What a family learns of `prompts`, each sharing its leading blocks with the one before."""
    text = text or FamiliarText()
    earlier: list[int] = []
    for prompt in prompts:
        chain, before = signed_block_hashes(prompt, SIZE), signed_block_hashes(earlier, SIZE)
        shared = next(
            (i for i, (a, b) in enumerate(zip(chain, before, strict=False)) if a != b),
            min(len(chain), len(before)),
        )
        text.learn(chain, prompt, shared, SIZE)
        earlier = prompt
    return text


def test_the_shared_text_is_found_whatever_the_span_before_it() -> None:
    text = learned(SYSTEM + tokens(2, 40), SYSTEM + tokens(3, 40))
    for span in (1, 7, 13, 29, 100):
        assert text.familiar(tokens(span, span) + SYSTEM, 0), span
    assert text.familiar(SYSTEM[:200] + tokens(4, 11) + SYSTEM[200:], 192)  # a volatile token mid-text


def test_a_prompt_of_its_own_is_not_familiar() -> None:
    text = learned(SYSTEM + tokens(2, 40), SYSTEM + tokens(3, 40))
    assert not text.familiar(tokens(5, 600), 0)
    assert not text.familiar(SYSTEM + tokens(6, 300), 640)  # its own tail after the shared text
    assert not text.familiar(None, 0)  # hash-only retention


def test_only_what_two_prompts_shared_is_learned_never_a_request_s_own_tail() -> None:
    """A question asked once is the request's own content: another prompt going on with it after a
    departure departed where prompts part."""
    question = tokens(7, 200)
    text = learned(SYSTEM + question, SYSTEM + tokens(8, 200))
    assert not text.familiar(tokens(9, 5) + question, 640)


def test_text_shorter_than_the_threshold_or_far_from_its_place_is_not_familiar() -> None:
    text = learned(SYSTEM + tokens(2, 40), SYSTEM + tokens(3, 40))
    short = SYSTEM[320 : 320 + FAMILIAR_TOKENS - 24]
    assert not text.familiar(tokens(10, 9) + short + tokens(11, 300), 320 - 9)
    moved = tokens(12, MAX_SHIFT + 200) + SYSTEM[:200]  # a passage of it, far from where it stood
    assert not text.familiar(moved, MAX_SHIFT + 100)


def test_past_its_memory_the_shared_text_is_learned_again_from_the_next_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A chat family's long shared histories fill the memory: it is emptied before the next prompt
    adds its own, so the text a prompt shares is always learned."""
    monkeypatch.setattr("app.domain.familiar.MEMORY_KEYS", 200)
    text = FamiliarText()
    for n in range(6):
        history = SYSTEM + tokens(100 + n, 400)
        learned(history, history + tokens(1, 20), text=text)
        assert len(text._seen_at) <= 200 + (640 + 400) // 4  # the memory, and one prompt's keys
    learned(SYSTEM + tokens(2, 40), SYSTEM + tokens(3, 40), text=text)
    assert text.familiar(tokens(4, 12) + SYSTEM, 0)
