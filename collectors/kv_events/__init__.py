"""vLLM KV cache events: decode ZMQ messages (parse), track sequence numbers (sequence), talk ZMQ (client)."""
