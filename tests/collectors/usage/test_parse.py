"""Usage shapes from the real vLLM captures and from Anthropic's, Bedrock's and OpenTelemetry's documented
shapes."""

import re

import pytest

from collectors.usage.parse import (
    Usage,
    UsageError,
    gateway_cache_hit,
    ttl_seconds,
    usage_from,
    usage_from_span,
)
from tests.support.captures import load_json


@pytest.mark.parametrize(
    "name", ["completion-shared-prefix-the", "completion-salt-b-1", "completion-evict-0"]
)
def test_vllm_answers_give_their_counts(name: str) -> None:
    usage = load_json(f"{name}.json")["response"]["usage"]
    assert usage_from(usage) == Usage(
        usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], usage["completion_tokens"]
    )


def test_null_details_mean_unknown_cached_tokens_not_zero() -> None:
    assert usage_from({"prompt_tokens": 191, "completion_tokens": 4, "prompt_tokens_details": None}) == Usage(
        191, None, 4
    )


def test_anthropic_prompt_is_the_sum_of_uncached_read_and_created() -> None:
    usage = {
        "input_tokens": 21,
        "cache_read_input_tokens": 1800,
        "cache_creation_input_tokens": 120,
        "output_tokens": 9,
    }
    assert usage_from(usage) == Usage(
        prompt_tokens=1941, cached_tokens=1800, completion_tokens=9, cache_write_tokens=120
    )


def test_genai_span_attributes_and_vllms_names() -> None:
    attributes = {
        "gen_ai.usage.input_tokens": 300,
        "gen_ai.usage.cache_read.input_tokens": 256,
        "gen_ai.usage.output_tokens": 7,
    }
    assert usage_from_span(attributes) == Usage(300, 256, 7)
    assert usage_from_span({"gen_ai.usage.prompt_tokens": 191, "gen_ai.usage.completion_tokens": 4}) == Usage(
        191, None, 4
    )


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"prompt_tokens": "191"}, "usage.prompt_tokens"),
        (
            {"prompt_tokens": 1, "prompt_tokens_details": {"cached_tokens": -1}},
            "usage.prompt_tokens_details.cached_tokens",
        ),
        ({"prompt_tokens": 1, "prompt_tokens_details": 5}, "usage.prompt_tokens_details"),
        ({"input_tokens": True}, "usage.input_tokens"),
        ({"completion_tokens": 2**31}, "usage.completion_tokens"),  # no request is that long
    ],
)
def test_a_bad_count_names_its_field(payload: dict[str, object], field: str) -> None:
    with pytest.raises(UsageError, match=field.replace(".", r"\.")):
        usage_from(payload)


def test_anthropic_keeps_its_cache_writes() -> None:
    usage = usage_from(
        {"input_tokens": 21, "cache_read_input_tokens": 0, "cache_creation_input_tokens": 1900}
    )
    assert (usage.cache_write_tokens, usage.cached_tokens, usage.provider) == (1900, 0, "")


def test_bedrock_converse_counts_reads_and_writes_apart_from_input() -> None:
    usage = {
        "inputTokens": 12, "outputTokens": 40, "totalTokens": 2252, "cacheReadInputTokens": 2200,
        "cacheWriteInputTokens": 0, "cacheDetails": [{"ttl": "5m", "inputTokens": 2200}],
    }  # fmt: skip
    expected = Usage(2212, 2200, 40, cache_write_tokens=0, provider="bedrock", cache_ttl_seconds=300)
    assert usage_from(usage) == expected


def _anthropic(five: int, hour: int) -> dict[str, object]:
    # The Messages API's usage with its writes split by TTL (platform.claude.com prompt caching;
    # the SDKs' CacheCreation: ephemeral_5m_input_tokens, ephemeral_1h_input_tokens).
    split = {"ephemeral_5m_input_tokens": five, "ephemeral_1h_input_tokens": hour}
    return {"input_tokens": 50, "cache_read_input_tokens": 0, "cache_creation_input_tokens": five + hour,
            "output_tokens": 9, "cache_creation": split}  # fmt: skip


def _bedrock(*details: tuple[str, int]) -> dict[str, object]:
    # Converse's TokenUsage: cacheDetails lists the writes by TTL, 1h before 5m, empty without a
    # write (Bedrock API reference, TokenUsage and CacheDetail).
    written = sum(tokens for _, tokens in details)
    return {"inputTokens": 50, "cacheReadInputTokens": 0, "cacheWriteInputTokens": written, "outputTokens": 9,
            "cacheDetails": [{"ttl": ttl, "inputTokens": tokens} for ttl, tokens in details]}  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "ttl"),
    [
        (_anthropic(0, 1900), 3600), (_anthropic(1900, 0), 300), (_anthropic(400, 1500), 3600),
        (_anthropic(0, 0), None), ({"input_tokens": 50, "cache_creation_input_tokens": 900}, None),
        (_bedrock(("1h", 2000)), 3600), (_bedrock(("5m", 2000)), 300),
        (_bedrock(("1h", 1000), ("5m", 500)), 3600), (_bedrock(), None), (_bedrock(("1h", 0)), None),
    ],
)  # fmt: skip
def test_the_ttl_a_cache_write_used_is_the_longest_of_its_writes(
    payload: dict[str, object], ttl: int | None
) -> None:
    assert usage_from(payload).cache_ttl_seconds == ttl


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"input_tokens": 1, "cache_creation": 5}, "usage.cache_creation"),
        ({"input_tokens": 1, "cache_creation": {"ephemeral_1h_input_tokens": "9"}},
         "usage.cache_creation.ephemeral_1h_input_tokens"),
        ({"inputTokens": 1, "cacheDetails": {"ttl": "5m"}}, "usage.cacheDetails"),
        ({"inputTokens": 1, "cacheDetails": [{"ttl": "forever", "inputTokens": 3}]},
         "usage.cacheDetails[0].ttl"),
        ({"inputTokens": 1, "cacheDetails": [{"ttl": "1h", "inputTokens": -3}]},
         "usage.cacheDetails[0].inputTokens"),
    ],
)  # fmt: skip
def test_a_bad_ttl_breakdown_names_its_field(payload: dict[str, object], field: str) -> None:
    with pytest.raises(UsageError, match=re.escape(field)):
        usage_from(payload)


@pytest.mark.parametrize(("text", "seconds"), [("5m", 300), ("1h", 3600), ("30m", 1800), ("90s", 90)])
def test_ttls_read_as_the_providers_write_them(text: str, seconds: int) -> None:
    assert ttl_seconds(text, "ttl") == seconds


@pytest.mark.parametrize("text", ["", "0m", "1d", "1 h", "h", 60, None, "999999h"])
def test_anything_else_is_no_ttl(text: object) -> None:
    with pytest.raises(UsageError, match="ttl: expected a duration"):
        ttl_seconds(text, "ttl")


def test_gemini_prompt_count_already_holds_the_cached_tokens() -> None:
    metadata = {"promptTokenCount": 5000, "cachedContentTokenCount": 4096, "candidatesTokenCount": 30}
    expected = Usage(5000, 4096, 30, provider="gemini")
    assert usage_from(metadata) == expected
    assert usage_from({"usageMetadata": metadata}) == expected
    # Gemini leaves cachedContentTokenCount out when nothing was read: a miss, not unknown.
    assert usage_from({"promptTokenCount": 900}).cached_tokens == 0


def test_gemini_interactions_usage() -> None:
    usage = {"total_input_tokens": 6000, "total_cached_tokens": 4100, "total_output_tokens": 12}
    assert usage_from(usage) == Usage(6000, 4100, 12, provider="gemini")


def test_span_cache_creation_attribute_is_the_write_count() -> None:
    attributes = {"gen_ai.usage.input_tokens": 3000, "gen_ai.usage.cache_read.input_tokens": 0,
                  "gen_ai.usage.cache_creation.input_tokens": 2900}  # fmt: skip
    assert usage_from_span(attributes).cache_write_tokens == 2900


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"inputTokens": "12"}, "usage.inputTokens"),
        ({"inputTokens": 1, "cacheWriteInputTokens": -3}, "usage.cacheWriteInputTokens"),
        ({"usageMetadata": [1]}, "usage.usageMetadata"),
        ({"usageMetadata": {"promptTokenCount": 1.5}}, "usage.usageMetadata.promptTokenCount"),
        ({"total_input_tokens": 3, "total_cached_tokens": False}, "usage.total_cached_tokens"),
    ],
)
def test_a_bad_hosted_count_names_its_field(payload: dict[str, object], field: str) -> None:
    with pytest.raises(UsageError, match=field.replace(".", r"\.")):
        usage_from(payload)


@pytest.mark.parametrize(
    ("headers", "hit"),
    [
        ({"x-portkey-cache-status": "SEMANTIC HIT"}, True),
        ({"X-Portkey-Cache-Status": "hit"}, True),
        ({"x-portkey-cache-status": "SEMANTIC MISS"}, False),
        ({"content-type": "application/json"}, None),
    ],
)
def test_a_gateway_cache_answer_is_read_from_its_header(headers: dict[str, str], hit: bool | None) -> None:
    assert gateway_cache_hit(headers) is hit
