"""The real /metrics pages of vLLM 0.32, parsed."""

import pytest

from collectors.metrics.parse import (
    CacheConfig,
    MetricsParseError,
    cache_config,
    model_name,
    parse_metrics,
    prefix_cache_totals,
)
from tests.support.captures import VLLM_CPU_FIXTURES


def page(name: str) -> str:
    return (VLLM_CPU_FIXTURES / name).read_text()


def test_every_sample_of_the_real_page_is_kept_as_exposed() -> None:
    samples = parse_metrics(page("metrics-after.txt"))
    value_lines = [
        line for line in page("metrics-after.txt").splitlines() if line and not line.startswith("#")
    ]
    assert len(samples) == len(value_lines)
    hits = next(s for s in samples if s.name == "vllm:prefix_cache_hits_total")
    assert (hits.value, hits.kind, hits.labels) == (
        960.0,
        "counter",
        (("engine", "0"), ("model_name", "tiny")),
    )
    buckets = [s for s in samples if s.name == "vllm:time_to_first_token_seconds_bucket"]
    assert buckets[-1].label("le") == "+Inf" and buckets[0].kind == "histogram"


def test_the_cache_configuration_is_discovered() -> None:
    config = cache_config(parse_metrics(page("metrics-after.txt")))
    assert config == CacheConfig(
        block_size=32, hash_algo="sha256_cbor", num_gpu_blocks=48, prefix_caching=True, model_name=None,
        hit_alignment=None, attention_block_size=32, mamba_block_size=None, speculative=False,
    )  # fmt: skip
    assert model_name(parse_metrics(page("metrics-after.txt"))) == "tiny"


def test_a_hybrid_models_block_sizes_and_speculative_decoding_are_read() -> None:
    text = page("metrics-after.txt").replace('mamba_block_size="None"', 'mamba_block_size="3584"')
    text = text.replace('cache_hit_alignment_tokens="None"', 'cache_hit_alignment_tokens="3584"')
    text += '# TYPE vllm:spec_decode_num_drafts counter\nvllm:spec_decode_num_drafts_total{engine="0"} 3.0\n'
    config = cache_config(parse_metrics(text))
    assert config is not None
    assert (config.hit_alignment, config.mamba_block_size, config.speculative) == (3584, 3584, True)


@pytest.mark.parametrize(
    ("name", "totals"), [("metrics-before.txt", (0.0, 0.0)), ("metrics-after.txt", (4026.0, 960.0))]
)
def test_prefix_cache_totals_read_the_counters(name: str, totals: tuple[float, float]) -> None:
    assert prefix_cache_totals(parse_metrics(page(name))) == totals


def test_the_pre_0_9_names_give_the_same_totals() -> None:
    renamed = page("metrics-after.txt").replace("vllm:prefix_cache_", "vllm:gpu_prefix_cache_")
    assert prefix_cache_totals(parse_metrics(renamed)) == (4026.0, 960.0)


def test_a_page_without_prefix_counters_has_no_totals() -> None:
    assert prefix_cache_totals(parse_metrics("# TYPE up gauge\nup 1\n")) is None
    assert cache_config(parse_metrics("# TYPE up gauge\nup 1\n")) is None


@pytest.mark.parametrize(
    "text", ['vllm:x{engine="0" 1\n', "<html>502 Bad Gateway</html>\n", "vllm:hits_total twelve\n"]
)
def test_malformed_text_is_refused_with_a_reason(text: str) -> None:
    with pytest.raises(MetricsParseError, match="not Prometheus text format"):
        parse_metrics(text)
