"""A vLLM look-alike for demos, tests and benchmarks: pure cores here (tokenizer, prefix cache,
KV-event wire format); the HTTP and ZMQ servers that use them live beside them.

Imports ``app.domain`` (pure) only, never Django, Celery, psycopg or other ``app`` modules.
"""
