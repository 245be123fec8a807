"""The /metrics families of one simulated vLLM server: names, types, labels and buckets as vLLM 0.32's.

Each server has its own registry so that one process can serve many. Counters are declared
without `_total`, as vLLM does; prometheus_client adds `_total` and `_created` on exposition.
"""

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from simulator.block_metrics import Eviction

LABELS = ("model_name", "engine")
REQUEST_TIME_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
KV_BLOCK_BUCKETS = (
    0.001,
    0.002,
    0.005,
    0.01,
    0.02,
    0.05,
    0.1,
    0.2,
    0.5,
    1,
    2,
    5,
    10,
    20,
    30,
    60,
    120,
    300,
    600,
    1200,
    1800,
)


def token_buckets(max_model_len: int) -> list[float]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_model_len."""
    buckets: list[float] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_model_len:
                return buckets
            buckets.append(value)
        exponent += 1


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """What `vllm:cache_config_info` exposes of the simulated cache."""

    block_size: int
    num_gpu_blocks: int
    hash_algo: str = "sha256_cbor"
    mamba_block_size: int | None = None  # a hybrid model's Mamba group: hits align to it
    speculative: bool = False  # EAGLE/MTP on: vLLM registers its vllm:spec_decode_* counters


class ServerMetrics:
    """The metric families of one server, bound to its model name and engine 0."""

    def __init__(self, model: str, cache: CacheInfo, *, max_model_len: int, kv_cache_metrics: bool) -> None:
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model, "engine": "0"}
        self._counters()
        self._gauges(cache)
        self._histograms(max_model_len, kv_cache_metrics)

    def _counter(self, name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
        counter = Counter(name, doc, [*LABELS, *extra], registry=self.registry)
        if not extra:  # vLLM creates each engine's series at start-up: they read 0, not absent
            counter.labels(**self.labels)
        return counter

    def _counters(self) -> None:
        self.prefix_cache_queries = self._counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens."
        )
        self.prefix_cache_hits = self._counter("vllm:prefix_cache_hits", "Prefix cache hits, in tokens.")
        self.prompt_tokens = self._counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.prompt_tokens_by_source = self._counter(
            "vllm:prompt_tokens_by_source", "Prompt tokens by source.", ("source",)
        )
        self.prompt_tokens_cached = self._counter("vllm:prompt_tokens_cached", "Cached prompt tokens.")
        self.prompt_tokens_recomputed = self._counter(
            "vllm:prompt_tokens_recomputed", "Cached tokens recomputed for forward pass."
        )
        self.generation_tokens = self._counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.num_preemptions = self._counter("vllm:num_preemptions", "Cumulative number of preemptions.")
        self.request_success = self._counter(
            "vllm:request_success", "Count of successfully processed requests.", ("finished_reason",)
        )
        self._counter("vllm:external_prefix_cache_queries", "External prefix cache queries, in tokens.")
        self._counter("vllm:external_prefix_cache_hits", "External prefix cache hits, in tokens.")
        for source in ("local_compute", "local_cache_hit", "external_kv_transfer"):
            self.prompt_tokens_by_source.labels(**self.labels, source=source)
        for reason in ("stop", "length", "abort"):
            self.request_success.labels(**self.labels, finished_reason=reason)

    def _gauges(self, cache: CacheInfo) -> None:
        self.kv_cache_usage = Gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            LABELS,
            registry=self.registry,
        )
        self.running = Gauge(
            "vllm:num_requests_running",
            "Requests in model execution batches.",
            LABELS,
            registry=self.registry,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Requests waiting to be processed.", LABELS, registry=self.registry
        )
        for gauge in (self.kv_cache_usage, self.running, self.waiting):
            gauge.labels(**self.labels)
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            [
                "block_size",
                "cache_dtype",
                "cache_hit_alignment_tokens",
                "enable_prefix_caching",
                "engine",
                "mamba_block_size",
                "num_gpu_blocks",
                "prefix_caching_hash_algo",
            ],
            registry=self.registry,
        )
        # As vLLM 0.32 spells an unset field: "None". A hybrid model's hit alignment is the LCM of its
        # groups' blocks: the Mamba block, a multiple of the attention one here.
        mamba = str(cache.mamba_block_size) if cache.mamba_block_size else "None"
        info.labels(
            block_size=str(cache.block_size),
            cache_dtype="auto",
            cache_hit_alignment_tokens=mamba,
            enable_prefix_caching="True",
            engine="0",
            mamba_block_size=mamba,
            num_gpu_blocks=str(cache.num_gpu_blocks),
            prefix_caching_hash_algo=cache.hash_algo,
        ).set(1)
        if cache.speculative:
            self.spec_decode_drafts = self._counter("vllm:spec_decode_num_drafts", "Speculative drafts.")

    def _histogram(self, name: str, doc: str, buckets: tuple[float, ...] | list[float]) -> Histogram:
        histogram = Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)
        histogram.labels(**self.labels)
        return histogram

    def _histograms(self, max_model_len: int, kv_cache_metrics: bool) -> None:
        self.ttft = self._histogram(
            "vllm:time_to_first_token_seconds", "Time to first token in seconds.", TTFT_BUCKETS_SECONDS
        )
        self.e2e = self._histogram(
            "vllm:e2e_request_latency_seconds", "End to end request latency.", REQUEST_TIME_BUCKETS
        )
        self.queue_time = self._histogram(
            "vllm:request_queue_time_seconds", "Time in WAITING phase.", REQUEST_TIME_BUCKETS
        )
        self.prefill_time = self._histogram(
            "vllm:request_prefill_time_seconds", "Time in PREFILL phase.", REQUEST_TIME_BUCKETS
        )
        self.decode_time = self._histogram(
            "vllm:request_decode_time_seconds", "Time in DECODE phase.", REQUEST_TIME_BUCKETS
        )
        tokens = token_buckets(max_model_len)
        self.request_prompt_tokens = self._histogram(
            "vllm:request_prompt_tokens", "Prefill tokens per request.", tokens
        )
        self.request_generation_tokens = self._histogram(
            "vllm:request_generation_tokens", "Generation tokens per request.", tokens
        )
        self.prefill_kv_computed = self._histogram(
            "vllm:request_prefill_kv_computed_tokens", "New KV tokens computed during prefill.", tokens
        )
        self.block_lifetime: Histogram | None = None
        self.block_idle: Histogram | None = None
        self.block_reuse_gap: Histogram | None = None
        if kv_cache_metrics:  # vLLM only registers these with --kv-cache-metrics
            self.block_lifetime = self._histogram(
                "vllm:kv_block_lifetime_seconds",
                "KV block lifetime from allocation to eviction.",
                KV_BLOCK_BUCKETS,
            )
            self.block_idle = self._histogram(
                "vllm:kv_block_idle_before_evict_seconds", "Idle time before eviction.", KV_BLOCK_BUCKETS
            )
            self.block_reuse_gap = self._histogram(
                "vllm:kv_block_reuse_gap_seconds", "Time between KV block reuses.", KV_BLOCK_BUCKETS
            )

    def observe_eviction(self, eviction: Eviction) -> None:
        """One sampled block's eviction (simulator/block_metrics.py), as vLLM's collector observes it."""
        if self.block_lifetime is None or self.block_idle is None or self.block_reuse_gap is None:
            return
        self.block_lifetime.labels(**self.labels).observe(eviction.lifetime)
        self.block_idle.labels(**self.labels).observe(eviction.idle)
        for gap in eviction.reuse_gaps:
            self.block_reuse_gap.labels(**self.labels).observe(gap)

    def observe_request(self, outcome: "RequestTiming") -> None:
        """Count one finished request the way vLLM's PrometheusStatLogger does."""
        labels = self.labels
        self.prefix_cache_queries.labels(**labels).inc(outcome.prompt_tokens)
        self.prefix_cache_hits.labels(**labels).inc(outcome.cached_tokens)
        self.prompt_tokens.labels(**labels).inc(outcome.prompt_tokens)
        computed = outcome.prompt_tokens - outcome.cached_tokens
        self.prompt_tokens_by_source.labels(**labels, source="local_compute").inc(computed)
        self.prompt_tokens_by_source.labels(**labels, source="local_cache_hit").inc(outcome.cached_tokens)
        self.prompt_tokens_cached.labels(**labels).inc(outcome.cached_tokens)
        self.generation_tokens.labels(**labels).inc(outcome.generated_tokens)
        self.request_success.labels(**labels, finished_reason="length").inc()
        self.ttft.labels(**labels).observe(outcome.ttft_seconds)
        self.queue_time.labels(**labels).observe(outcome.queue_seconds)
        self.prefill_time.labels(**labels).observe(outcome.prefill_seconds)
        self.decode_time.labels(**labels).observe(outcome.decode_seconds)
        self.e2e.labels(**labels).observe(outcome.e2e_seconds)
        self.request_prompt_tokens.labels(**labels).observe(outcome.prompt_tokens)
        self.request_generation_tokens.labels(**labels).observe(outcome.generated_tokens)
        self.prefill_kv_computed.labels(**labels).observe(computed)


@dataclass(frozen=True, slots=True)
class RequestTiming:
    """One finished request's token counts and phases (seconds), as vLLM measures them."""

    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    queue_seconds: float
    prefill_seconds: float
    decode_seconds: float

    @property
    def ttft_seconds(self) -> float:
        return self.queue_seconds + self.prefill_seconds

    @property
    def e2e_seconds(self) -> float:
        return self.ttft_seconds + self.decode_seconds
