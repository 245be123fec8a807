"""What a series request asks and what it answers: the metrics, scopes and buckets it may name, its
parameters parsed (parse_query), the buckets of its window, and the answer as CSV or table rows.
The reads themselves are app/rollups/series.py's."""

import csv
import io
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

ROLLUP_METRICS = ("hit_rate", "ttft_p50", "ttft_p90", "ttft_p99", "lost_tokens", "requests")
# A server's own readings: its /metrics scrapes and its KV events (scope=server only).
SERVER_METRICS = ("engine_hit_rate", "kv_usage", "evictions", "preemptions", "request_rate")
METRICS = ROLLUP_METRICS + SERVER_METRICS
SCOPES = ("fleet", "server", "template", "tenant")
BUCKETS = (60, 300, 900, 3600, 21600, 86400)
TTFTS = ("client", "server")
MAX_POINTS = 2000
MAX_WINDOW = timedelta(days=31)
MAX_ID = 255
UNITS = {
    "hit_rate": "ratio", "engine_hit_rate": "ratio", "kv_usage": "ratio", "ttft_p50": "seconds",
    "ttft_p90": "seconds", "ttft_p99": "seconds", "lost_tokens": "tokens", "requests": "requests",
    "evictions": "blocks", "preemptions": "preemptions", "request_rate": "requests per second",
}  # fmt: skip


class SeriesError(ValueError):
    """A request for a series that cannot be answered; `code` says which parameter, for a 400."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True, slots=True)
class SeriesQuery:
    metric: str
    scope: str
    id: str  # "" for the fleet; a server's id or name, a template's id, a tenant's name
    since: datetime
    until: datetime
    bucket: int  # seconds
    ttft: str = "client"  # which TTFT: as the client saw it (gateway, application) or vLLM's own


@dataclass(frozen=True, slots=True)
class Series:
    name: str  # the metric, or for lost_tokens the cause
    values: list[float | None]  # one per bucket; None where nothing was measured


@dataclass(frozen=True, slots=True)
class SeriesSet:
    query: SeriesQuery
    unit: str
    source: str  # the table the numbers come from
    times: list[datetime]  # the start of each bucket
    series: list[Series]


def parse_query(params: Mapping[str, str], *, now: datetime) -> SeriesQuery:
    """A SeriesQuery from request parameters; SeriesError names the first bad one.

    since/until: ISO 8601 (with a zone, else UTC) or Unix seconds; until defaults to now, since to
    one hour before until. Both are rounded down to the bucket, so buckets start on its multiples.
    """
    metric = _choice(params, "metric", METRICS, None)
    scope = _choice(params, "scope", SCOPES, "fleet")
    ttft = _choice(params, "ttft", TTFTS, "client")
    bucket = int(_choice(params, "bucket", tuple(str(b) for b in BUCKETS), "60"))
    ident = params.get("id", "").strip()
    if (scope == "fleet") != (ident == ""):
        raise SeriesError("bad_id", "id names the server, template or tenant, and only for those scopes")
    if len(ident) > MAX_ID or "\x00" in ident:
        raise SeriesError("bad_id", f"an id is at most {MAX_ID} characters, without NUL")
    if scope == "template" and not is_key(ident):
        raise SeriesError("bad_id", "a template's id is a number")
    if metric in SERVER_METRICS and scope != "server":
        raise SeriesError("bad_scope", f"{metric} is a server's own reading: use scope=server")
    if metric.startswith("ttft_") and scope == "tenant":
        raise SeriesError(
            "bad_scope", "TTFT is not rolled up per tenant; hit_rate, lost_tokens and requests are"
        )
    until = _time(params, "until", now)
    since = _time(params, "since", until - timedelta(hours=1))
    since, until = _floor(since, bucket), _ceil(until, bucket)
    if since >= until:
        raise SeriesError("bad_window", "since must come before until")
    if until - since > MAX_WINDOW:
        raise SeriesError("bad_window", f"a window is at most {MAX_WINDOW.days} days")
    if (until - since).total_seconds() / bucket > MAX_POINTS:
        raise SeriesError("bad_bucket", f"at most {MAX_POINTS} buckets: choose a longer bucket")
    return SeriesQuery(metric, scope, ident, since, until, bucket, ttft)


def _choice(params: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str | None) -> str:
    value = params.get(name) or default
    if value not in allowed:
        raise SeriesError(f"bad_{name}", f"{name} is one of {', '.join(allowed)}")
    return value


def _time(params: Mapping[str, str], name: str, default: datetime) -> datetime:
    text = params.get(name, "").strip()
    if not text:
        return default
    try:
        moment = (
            datetime.fromtimestamp(float(text), UTC) if _is_number(text) else datetime.fromisoformat(text)
        )
    except (ValueError, OverflowError, OSError):
        raise SeriesError(f"bad_{name}", f"{name} is ISO 8601 or Unix seconds") from None
    if not 1970 <= moment.year <= 9000:  # room to round to a bucket and add a window
        raise SeriesError(f"bad_{name}", f"{name} is after 1970 and before 9000")
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def is_key(text: str) -> bool:
    """Whether `text` is a primary key PostgreSQL's bigint holds (ASCII digits only)."""
    return text.isascii() and text.isdigit() and int(text) < 2**63


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _floor(moment: datetime, bucket: int) -> datetime:
    seconds = int(moment.timestamp())
    return datetime.fromtimestamp(seconds - seconds % bucket, UTC)


def _ceil(moment: datetime, bucket: int) -> datetime:
    floor = _floor(moment, bucket)
    return floor if floor == moment else floor + timedelta(seconds=bucket)


def bucket_starts(query: SeriesQuery) -> list[datetime]:
    count = int((query.until - query.since).total_seconds()) // query.bucket
    return [query.since + timedelta(seconds=i * query.bucket) for i in range(count)]


def as_csv(times: list[datetime], found: list[Series]) -> str:
    """A `time` column (ISO 8601, UTC), then one column per series: floats as Python writes them
    (repr, so that a reader gets the very numbers of the JSON), an empty cell for None."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["time", *(s.name for s in found)])
    for i, at in enumerate(times):
        writer.writerow([at.isoformat(), *("" if s.values[i] is None else repr(s.values[i]) for s in found)])
    return out.getvalue()


def table_rows(found: SeriesSet) -> list[tuple[datetime, list[float | None]]]:
    """The numbers of a SeriesSet by bucket: (bucket start, one value per series), as a table shows them."""
    return [(at, [s.values[i] for s in found.series]) for i, at in enumerate(found.times)]
