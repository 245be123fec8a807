"""vLLM's /v1/models: the base models and LoRA adapters a server serves, parsed, and the fetch."""
