"""A /metrics page of a vLLM server, parsed with prometheus_client's own parser. No I/O.

Samples are kept exactly as exposed (names with `_total`, `_bucket`, `_created`, labels as given):
Prefixscope stores counters as scraped and derives rates later. Two readings are interpreted
here because the collector needs them at once: the cache configuration (`vllm:cache_config_info`)
and the prefix-cache counters under their old and new names.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from collectors.metrics.names import PREFIX_CACHE_HITS, PREFIX_CACHE_QUERIES, SPEC_DECODE_PREFIX


class MetricsParseError(ValueError):
    """The page is not Prometheus text exposition."""


@dataclass(frozen=True, slots=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]  # sorted by label name
    value: float
    kind: str  # the family's type: counter, gauge, histogram, summary, info, unknown

    def label(self, name: str) -> str | None:
        return dict(self.labels).get(name)


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """What `vllm:cache_config_info` says of the prefix cache (one engine's labels)."""

    block_size: int | None
    hash_algo: str | None
    num_gpu_blocks: int | None
    prefix_caching: bool | None
    model_name: str | None
    # What newer builds say of a hybrid model's cache (absent or "None" on a plain one): the hit
    # granularity vLLM computed, the full-attention group's block, the Mamba group's block.
    hit_alignment: int | None = None  # cache_hit_alignment_tokens
    attention_block_size: int | None = None  # effective_attention_block_size
    mamba_block_size: int | None = None
    # Whether speculative decoding runs (its vllm:spec_decode_* counters are on the page): not a
    # CacheConfig label, read from the same page.
    speculative: bool = False


def parse_metrics(text: str) -> list[Sample]:
    """Every sample of the page, in page order. Raises MetricsParseError on malformed text."""
    try:
        return [
            Sample(s.name, tuple(sorted(s.labels.items())), float(s.value), family.type)
            for family in text_string_to_metric_families(text)
            for s in family.samples
        ]
    except ValueError as exc:  # prometheus_client reports every syntax error as ValueError
        raise MetricsParseError(f"not Prometheus text format: {exc}") from None


def cache_config(samples: Iterable[Sample]) -> CacheConfig | None:
    """The cache configuration from `vllm:cache_config_info`, or None when the page has none."""
    samples = list(samples)
    speculative = any(sample.name.startswith(SPEC_DECODE_PREFIX) for sample in samples)
    for sample in samples:
        if sample.name == "vllm:cache_config_info":
            return CacheConfig(
                block_size=_int_label(sample, "block_size"),
                hash_algo=sample.label("prefix_caching_hash_algo"),
                num_gpu_blocks=_int_label(sample, "num_gpu_blocks"),
                prefix_caching=_bool_label(sample, "enable_prefix_caching"),
                model_name=sample.label("model_name"),
                hit_alignment=_int_label(sample, "cache_hit_alignment_tokens"),
                attention_block_size=_int_label(sample, "effective_attention_block_size"),
                mamba_block_size=_int_label(sample, "mamba_block_size"),
                speculative=speculative,
            )
    return None


def model_name(samples: Iterable[Sample]) -> str | None:
    """The served model name, from the first vLLM sample that carries `model_name`."""
    return next(
        (s.label("model_name") for s in samples if s.name.startswith("vllm:") and s.label("model_name")), None
    )


def prefix_cache_totals(samples: Iterable[Sample]) -> tuple[float, float] | None:
    """Cumulative (queries, hits) summed over engines, under either name; None if absent."""
    queries = hits = 0.0
    found = False
    for sample in samples:
        if sample.name in PREFIX_CACHE_QUERIES:
            queries, found = queries + sample.value, True
        elif sample.name in PREFIX_CACHE_HITS:
            hits += sample.value
    return (queries, hits) if found else None


def _int_label(sample: Sample, name: str) -> int | None:
    value = sample.label(name)
    return int(value) if value is not None and value.isdigit() else None


def _bool_label(sample: Sample, name: str) -> bool | None:
    value = sample.label(name)
    return None if value is None else value == "True"
