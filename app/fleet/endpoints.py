"""What a server's endpoints must look like before it is registered: checks shared by the set-up
pages' forms and the API. Each returns the problem in words, or None."""

from urllib.parse import urlsplit


def http_url_problem(url: str) -> str | None:
    """None for an http(s) URL with a host (plain host names too: http://vllm-0:8000, as docker-compose
    names services; Django's URL validator wants a dotted domain)."""
    parts = urlsplit(url)
    try:
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.port != 0
    except ValueError:  # a port that is not a number
        valid = False
    return None if valid else "Enter an http:// or https:// URL with a host, e.g. http://vllm-0:8000."


def zmq_endpoint_problem(endpoint: str) -> str | None:
    """None for a ZMQ TCP endpoint with host and port (tcp://vllm-0:5557), as vLLM publishes on."""
    parts = urlsplit(endpoint)
    try:
        valid = parts.scheme == "tcp" and bool(parts.hostname) and bool(parts.port)
    except ValueError:
        valid = False
    return None if valid else "Enter a ZMQ endpoint tcp://host:port, e.g. tcp://vllm-0:5557."
