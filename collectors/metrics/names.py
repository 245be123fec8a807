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
