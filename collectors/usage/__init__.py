"""Per-request token usage in the shapes applications report it (OpenAI, Anthropic, OpenTelemetry GenAI)."""
