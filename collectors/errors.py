"""The one error a collector's fetch raises: what failed, and whether trying again can help."""


class CollectorError(Exception):
    """A fetch or exchange with a server failed. ``retryable``: the same call later may succeed
    (a timeout, a refused connection, a 5xx); not retryable, it will fail the same way (a bad
    endpoint, an answer that cannot be read) until someone changes something."""

    def __init__(self, *, retryable: bool, reason: str) -> None:
        super().__init__(reason)
        self.retryable = retryable
        self.reason = reason
