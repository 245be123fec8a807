"""The one error a collector's fetch raises (what failed, and whether trying again can help), and the
fixed codes input is rejected under."""

from dataclasses import dataclass
from enum import StrEnum


class CollectorError(Exception):
    """A fetch or exchange with a server failed. ``retryable``: the same call later may succeed
    (a timeout, a refused connection, a 5xx); not retryable, it will fail the same way (a bad
    endpoint, an answer that cannot be read) until someone changes something."""

    def __init__(self, *, retryable: bool, reason: str) -> None:
        super().__init__(reason)
        self.retryable = retryable
        self.reason = reason


class RejectReason(StrEnum):
    """Why input was rejected: the fixed set of codes every rejection is counted under, and the
    only values of the `reason` label of /metrics (a label of free text is a series per message).
    The human detail (which field, what was expected) travels beside the code, never as a label."""

    # KV events (collectors/kv_events/parse.py)
    KV_FRAMES = "kv_frames"  # a message of the wrong frame count, or a bad seq or topic frame
    KV_NOT_MSGPACK = "kv_not_msgpack"  # a payload or event that is not one msgpack value
    KV_BATCH_SHAPE = "kv_batch_shape"  # msgpack, but not [ts, [events], dp_rank]
    KV_EVENT_SHAPE = "kv_event_shape"  # an event neither a map nor a tagged array, or with no type
    KV_UNKNOWN_TYPE = "kv_unknown_type"  # an event type vLLM does not publish
    KV_FIELD_MISSING = "kv_field_missing"  # a required field of a known event is absent
    KV_FIELD_INVALID = "kv_field_invalid"  # a field of a known event has the wrong type or range
    # Request records (REST, OTLP spans, the gateway)
    BODY_INVALID = "body_invalid"  # a record that is not JSON, or not an object
    FIELD_INVALID = "field_invalid"  # a field missing, of the wrong type or out of range
    TEXT_TOO_LONG = "text_too_long"  # a text field longer than its column
    TEXT_INVALID = "text_invalid"  # a NUL character or a lone surrogate
    NO_TIME_ZONE = "no_time_zone"  # an arrival time without a time zone
    CACHED_OVER_PROMPT = "cached_over_prompt"  # more cached tokens than prompt tokens
    TOO_OLD = "too_old"  # arrived before the request records' retention
    TOO_FAR_AHEAD = "too_far_ahead"  # arrived after the newest partition
    UNKNOWN_MODEL = "unknown_model"  # the server serves no model or adapter of that name
    USAGE_INVALID = "usage_invalid"  # a span's usage or duration attribute is not a count
    PARTS_INVALID = "parts_invalid"  # a request body or span content not of a chat request's shape
    # The gateway's /tokenize look-ups of where each part starts failed: the record kept without them.
    PART_STARTS_UNKNOWN = "part_starts_unknown"
    # Refused whole, or lost inside Prefixscope
    BUSY = "busy"  # 429: the process was ingesting as many batches as it may
    DATABASE_BUSY = "database_busy"  # 429: the database did not take the batch in time
    NOT_STORABLE = "not_storable"  # the database refused the rows (e.g. no partition)
    QUEUE_FULL = "queue_full"  # the gateway's writer queue was full: a record dropped
    SPILL_UNREADABLE = "spill_unreadable"  # a line of the gateway's spill file could not be read
    SPILL_UNWRITABLE = "spill_unwritable"  # the gateway could neither store nor spill: records dropped
    OTHER = "other"  # a tally kept from before the codes, whose text matched none


KV_DECODE_REASONS = frozenset(r for r in RejectReason if r.value.startswith("kv_"))
"""The codes of KV events that could not be decoded (KVEventsUndecodable alerts on any)."""


@dataclass(frozen=True, slots=True)
class Rejection:
    """One rejection: the code it is counted under, and the message that says what was wrong
    (which field, what was expected; never the value, which may be prompt text)."""

    code: RejectReason
    detail: str
