"""The hosted-API causes, each from the smallest history that shows it."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from app.domain.hosted import HostedHistory, HostedPrompt, content_chain, minimum_tokens
from app.domain.misses import Cause, RequestPart, Unknown
from app.domain.requestparts import Parts

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
BLOCKS = [f"block-{i}" for i in range(40)]


def request(
    at: float, *, provider: str = "anthropic", model: str = "claude-sonnet-4-5", blocks: int = 4,
    marks: list[int] | None = None, prompt: int = 5000, cached: int = 0, written: int | None = 4000,
    key: str = "", digests: list[str] | None = None, ttl: int | None = None,
) -> HostedPrompt:  # fmt: skip
    chain = content_chain((digests or BLOCKS)[:blocks])
    return HostedPrompt(
        provider=provider, model=model, arrived_at=T0 + timedelta(seconds=at), prompt_tokens=prompt,
        cached_tokens=cached, cache_write_tokens=written, chain=chain,
        breakpoints=marks if marks is not None else [blocks - 2], cache_key=key, cache_ttl_seconds=ttl,
    )  # fmt: skip


def last_cause(*requests: HostedPrompt) -> Cause | Unknown | None:
    history = HostedHistory()
    found = [history.diagnose(one) for one in requests][-1]
    return found if isinstance(found, Unknown) else found.cause


def test_a_first_request_is_cold_and_its_tail_new_content() -> None:
    found = HostedHistory().diagnose(request(0))
    assert not isinstance(found, Unknown)
    assert found.cause == Cause.COLD
    assert found.tokens_by_cause() == {Cause.COLD: 4000, Cause.NEW_CONTENT: 1000}


def test_a_hit_loses_nothing() -> None:
    assert last_cause(request(0), request(60, cached=4000, written=0)) == Cause.NEW_CONTENT


@pytest.mark.parametrize(
    ("provider", "model", "minimum"),
    [
        ("openai", "gpt-5.6", 1024), ("anthropic", "claude-opus-4-6", 4096),
        ("anthropic", "claude-3-5-haiku-20241022", 2048), ("anthropic", "claude-sonnet-4-5", 1024),
        ("bedrock", "us.anthropic.claude-haiku-4-5-20251001-v1:0", 4096),
        ("bedrock", "amazon.nova-pro-v1:0", 1024),
        ("gemini", "gemini-2.5-flash", 2048), ("gemini", "gemini-3-pro", 4096),
    ],
)  # fmt: skip
def test_minimums_per_provider_and_model(provider: str, model: str, minimum: int) -> None:
    assert minimum_tokens(provider, model) == minimum
    short = request(0, provider=provider, model=model, prompt=minimum - 1, written=0)
    assert last_cause(short) == Cause.BELOW_MINIMUM


def test_the_same_prefix_after_the_ttl_lapsed() -> None:
    assert last_cause(request(0), request(301)) == Cause.TTL_LAPSED
    assert last_cause(request(0), request(299)) == Cause.UNEXPLAINED


HOUR = 3600


@pytest.mark.parametrize(
    ("history", "cause"),
    [
        # A 1-hour write read 20 minutes later is not lapsed (here a marker stripped on the way); a
        # 5-minute one is, and so is a 1-hour one past its hour.
        ([request(0, ttl=HOUR), request(1200, written=0)], Cause.MARKER_ABSENT),
        ([request(0, ttl=300), request(1200, written=0)], Cause.TTL_LAPSED),
        ([request(0, ttl=HOUR), request(HOUR + 1)], Cause.TTL_LAPSED),
        ([request(0, ttl=HOUR), request(HOUR - 1)], Cause.UNEXPLAINED),
        # A read refreshes the entry for the TTL it was written with (its usage says none).
        ([request(0, ttl=HOUR), request(1800, cached=4000, written=0), request(1800 + HOUR - 1)],
         Cause.UNEXPLAINED),
        ([request(0, ttl=HOUR), request(1800, cached=4000, written=0), request(1800 + HOUR + 1)],
         Cause.TTL_LAPSED),
        # Rewritten with the default TTL: the hour is gone.
        ([request(0, ttl=HOUR), request(1800, ttl=300), request(1800 + 301)], Cause.TTL_LAPSED),
        # Only a shorter prefix was cached, with an hour's TTL: within it, the lookback decides.
        ([request(0, blocks=6, marks=[5], ttl=HOUR), request(1200, blocks=30, marks=[29])],
         Cause.BEYOND_LOOKBACK),
        ([request(0, blocks=6, marks=[5], ttl=300), request(1200, blocks=30, marks=[29])],
         Cause.TTL_LAPSED),
    ],
)  # fmt: skip
def test_lapsed_is_judged_by_the_ttl_the_prefix_was_written_with(
    history: list[HostedPrompt], cause: Cause
) -> None:
    assert last_cause(*history) == cause


def test_a_stripped_marker_writes_nothing_and_reads_nothing() -> None:
    assert last_cause(request(0, written=0), request(30, written=0)) == Cause.MARKER_ABSENT
    assert last_cause(request(0, marks=[]), request(30, marks=[], written=None)) == Cause.MARKER_ABSENT


def test_a_changed_cache_key_on_openai() -> None:
    first = request(0, provider="openai", model="gpt-5.6", written=None, key="a", marks=[])
    again = request(30, provider="openai", model="gpt-5.6", written=None, key="b", marks=[])
    assert last_cause(first, again) == Cause.CACHE_KEY_CHANGED
    assert last_cause(first, request(30, provider="openai", model="gpt-5.6", written=None, key="a",
                                     marks=[])) == Cause.UNEXPLAINED  # fmt: skip


def test_a_marker_more_than_twenty_blocks_past_the_last_cached_one() -> None:
    earlier = request(0, blocks=6, marks=[5])
    assert last_cause(earlier, request(30, blocks=30, marks=[29])) == Cause.BEYOND_LOOKBACK
    assert last_cause(earlier, request(30, blocks=20, marks=[19])) == Cause.UNEXPLAINED


def test_a_prefix_that_departs_before_its_marker_changed() -> None:
    other = [*BLOCKS[:2], "changed", *BLOCKS[3:]]
    assert last_cause(request(0), request(30, digests=other)) == Cause.PROMPT_CHANGED


def test_no_content_blocks_cannot_be_told_past_the_minimum() -> None:
    bare = HostedPrompt(
        provider="openai", model="gpt-5.6", arrived_at=T0, prompt_tokens=3000, cached_tokens=0,
        cache_write_tokens=None,
    )  # fmt: skip
    assert HostedHistory().diagnose(bare) == Unknown.NO_PROMPT


SYSTEM_EDITED = Parts(system="s2", tools=("t1", "t2"), messages=("m1", "m2", "q2"), latest=1)
TOOLS_REORDERED = Parts(system="s1", tools=("t2", "t1"), messages=("m1", "m2", "q2"), latest=1)
BEFORE = Parts(system="s1", tools=("t1", "t2"), messages=("m1", "m2", "q1"), latest=1)
REORDERED = ["block-1", "block-0", *BLOCKS[2:]]


def found_part(*sent: tuple[HostedPrompt, Parts | None, str | None]) -> tuple[object, ...]:
    """The last request's cause, changed part, its detail and the request it was compared with;
    each request sent with its parts and template, keyed by its position."""
    history = HostedHistory()
    found = [history.diagnose(replace(one, parts=parts, key=n, family=family))
             for n, (one, parts, family) in enumerate(sent)][-1]  # fmt: skip
    assert not isinstance(found, Unknown)
    return found.cause, found.changed_part, found.part_detail, found.compared_with


def test_a_changed_prompt_names_the_part_that_changed_and_the_request_it_departs_from() -> None:
    edited = request(30, digests=[BLOCKS[0], "block-1-edited", *BLOCKS[2:]])
    found = found_part((request(0), BEFORE, "support"), (edited, SYSTEM_EDITED, "support"))
    assert found == (Cause.PROMPT_CHANGED, RequestPart.SYSTEM, "", 0)


def test_a_first_block_changed_is_a_change_of_its_template_not_a_first_request() -> None:
    reordered = request(30, digests=REORDERED)
    found = found_part((request(0), BEFORE, "support"), (reordered, TOOLS_REORDERED, "support"))
    assert found == (Cause.PROMPT_CHANGED, RequestPart.TOOLS, "reordered", 0)
    # Without a template, or without parts, a prompt sharing no first block with its scope is new.
    untemplated = found_part((request(0), BEFORE, None), (reordered, TOOLS_REORDERED, None))
    assert untemplated == (Cause.COLD, None, "", None)
    assert found_part((request(0), None, "support"), (reordered, None, "support"))[0] == Cause.COLD
