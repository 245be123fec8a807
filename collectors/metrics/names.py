"""The vLLM series Prefixscope reads from a server's /metrics, by name as exposed (counters with
`_total`): the collector's parse and the rollups of a server's readings (app/rollups) name them here."""

# vLLM renamed these (about 0.9); a server on either version must give one hit rate.
PREFIX_CACHE_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_CACHE_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
KV_USAGE = "vllm:kv_cache_usage_perc"
PREEMPTIONS = ("vllm:num_preemptions_total",)
FINISHED_REQUESTS = ("vllm:request_success_total",)
# vLLM registers these counters (drafts, draft and accepted tokens) only when speculative decoding runs.
SPEC_DECODE_PREFIX = "vllm:spec_decode_"

# Hits by storage tier below the GPU's prefix cache. vLLM's tiered offloading counts per `tier`
# label ("0:primary" is its CPU tier, "<n>:<backend>" the ones below); vLLM 0.32 names them
# ..._chunk_*, vLLM #48798 ..._block_*. LMCache counts hit tokens per level (L1: its CPU memory,
# L2: disk or remote); L0, vLLM's GPU cache, is not in them.
OFFLOAD_TIER_QUERIES = (
    "vllm:kv_offload_tiering_chunk_queries_total",
    "vllm:kv_offload_tiering_block_queries_total",
)
OFFLOAD_TIER_HITS = ("vllm:kv_offload_tiering_chunk_hits_total", "vllm:kv_offload_tiering_block_hits_total")
LMCACHE_TIER_HIT_TOKENS = {
    "lmcache_mp_lookup_hit_l1_tokens_total": "cpu",
    "lmcache_mp_lookup_hit_l2_tokens_total": "storage",
}
LMCACHE_REQUESTED_TOKENS = "lmcache_mp_lookup_requested_tokens_total"

TIERS = ("cpu", "storage", "remote", "other")
"""Every tier Prefixscope names (its /metrics label values): a fixed set, whatever a server calls its own."""


def offload_tier(label: str | None) -> str:
    """The tier of a vLLM offloading `tier` label: "0:primary" and "<n>:cpu" are cpu; a file system
    or disk backend storage; object stores, peers and KV caches elsewhere remote; the rest other."""
    backend = (label or "").partition(":")[2].lower()
    if backend in ("primary", "cpu"):
        return "cpu"
    if backend in ("fs", "file", "disk", "storage", "gds"):
        return "storage"
    if backend in ("obj", "p2p", "kvcr", "remote", "s3", "mooncake", "nixl"):
        return "remote"
    return "other"
