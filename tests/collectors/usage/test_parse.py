"""Usage shapes from the real vLLM captures and from Anthropic's and OpenTelemetry's documented shapes."""

import pytest

from collectors.usage.parse import Usage, UsageError, gateway_cache_hit, usage_from, usage_from_span
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
    assert usage_from(usage) == Usage(2212, 2200, 40, cache_write_tokens=0, provider="bedrock")


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
