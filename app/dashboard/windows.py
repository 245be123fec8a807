"""The time window a page's URL asks for (the picker's windows, or a custom one), and the buckets a
page draws it in."""

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from app.rollups import series as traffic_series
from app.rollups.series import SeriesError

# The picker's windows and the bucket each is drawn in (a few hundred points at most).
WINDOWS = {"1h": (timedelta(hours=1), 60), "6h": (timedelta(hours=6), 300),
           "24h": (timedelta(days=1), 900), "7d": (timedelta(days=7), 3600)}  # fmt: skip
CUSTOM_POINTS = 400  # a custom window takes the shortest bucket that draws at most this many


@dataclass(frozen=True, slots=True)
class Window:
    key: str  # 1h, 6h, 24h, 7d or custom
    since: datetime
    until: datetime
    bucket: int
    ttft: str
    error: str = ""  # why a custom window asked for was not taken

    @property
    def since_field(self) -> str:
        return _local(self.since)

    @property
    def until_field(self) -> str:
        return _local(self.until)

    def params(self) -> dict[str, str]:
        """What the page's URL says of the window."""
        found = {"window": self.key, "ttft": self.ttft}
        if self.key == "custom":
            found |= {"since": _local(self.since), "until": _local(self.until)}
        return found


def picked_window(params: Mapping[str, str], *, now: datetime) -> Window:
    """The window a page's URL asks for; the last hour when it asks for none, or for a custom
    window that cannot be drawn (with the reason)."""
    key = params.get("window", "1h")
    ttft = params.get("ttft", "client")
    ttft = ttft if ttft in traffic_series.TTFTS else "client"
    if key == "custom":
        try:
            return _custom(params, ttft=ttft, now=now)
        except SeriesError as exc:
            return _last("1h", ttft=ttft, now=now, error=f"Custom window not drawn: {exc.message}.")
    return _last(key if key in WINDOWS else "1h", ttft=ttft, now=now)


def _last(key: str, *, ttft: str, now: datetime, error: str = "") -> Window:
    length, bucket = WINDOWS[key]
    asked = {"since": (now - length).isoformat(), "until": now.isoformat()}
    query = traffic_series.parse_query({"metric": "requests", "bucket": str(bucket), **asked}, now=now)
    return Window(key, query.since, query.until, bucket, ttft, error)


def _custom(params: Mapping[str, str], *, ttft: str, now: datetime) -> Window:
    since, until = params.get("since", ""), params.get("until", "")
    if not since or not until:
        raise SeriesError("bad_window", "give both its start and its end")
    query = None
    for bucket in traffic_series.BUCKETS:
        query = traffic_series.parse_query(
            {"metric": "requests", "bucket": str(bucket), "since": since, "until": until}, now=now
        )
        if (query.until - query.since).total_seconds() / bucket <= CUSTOM_POINTS:
            break
    assert query is not None
    return Window("custom", query.since, query.until, query.bucket, ttft)


def in_hours(window: Window) -> Window:
    """A window of a day or more in whole hours, drawn by the hour: its sums and sparklines then read
    the hour rollups alone (a day of a fleet's minutes is 1,440 rows per server)."""
    if window.until - window.since < timedelta(days=1):
        return window
    since = window.since.replace(minute=0, second=0, microsecond=0)
    until = window.until.replace(minute=0, second=0, microsecond=0)
    return replace(window, since=since, until=until if until == window.until else until + timedelta(hours=1),
                   bucket=3600)  # fmt: skip


def bucket_starts(window: Window) -> list[datetime]:
    """The start of each whole bucket of the window, oldest first."""
    count = int((window.until - window.since).total_seconds()) // window.bucket
    return [window.since + timedelta(seconds=i * window.bucket) for i in range(count)]


def _local(moment: datetime) -> str:
    """A time as a datetime-local field shows it (UTC, to the minute)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")
