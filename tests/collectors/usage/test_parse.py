"""Usage shapes from the real vLLM captures and from Anthropic's and OpenTelemetry's documented shapes."""

import pytest

from collectors.usage.parse import Usage, UsageError, usage_from, usage_from_span
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
    assert usage_from(usage) == Usage(prompt_tokens=1941, cached_tokens=1800, completion_tokens=9)


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
