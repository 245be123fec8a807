"""Prometheus /metrics of vLLM servers: the text format parsed into samples, and the fetch."""
