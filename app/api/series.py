"""Time series of hit rate, TTFT, lost tokens and requests for any scope and bucket, as JSON or CSV.

Read from the per-minute rollups and summed per bucket in SQL (app/rollups/series.py); a server's
own readings (its scrapes, its KV events) for scope=server. Every parameter is checked here and a
bad one answered 400 with a code and a message, as django-ninja's validation is (app/api/errors.py).
"""

from datetime import datetime
from typing import Any

from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from ninja import Field, Router, Schema

from app.api.auth import READERS
from app.api.errors import ApiError, error
from app.api.viewers import caller_viewer
from app.domain.misses import HOSTED_INCLUDED, OF_COUNTERS, OF_PROMPT, OF_RECORDED
from app.prompts.selectors import find_template
from app.rollups import series as traffic_series

router = Router(tags=["series"])


class OneSeries(Schema):
    name: str = Field(description="the metric, or for lost_tokens the cause")
    values: list[float | None] = Field(description="one per bucket of `times`; null: nothing measured")


class SeriesOut(Schema):
    metric: str
    scope: str
    id: str
    since: datetime
    until: datetime
    bucket: int = Field(description="seconds")
    ttft: str = Field(description="client: as the gateway or application saw it; server: vLLM's own")
    unit: str
    source: str = Field(description="the table the numbers were read from")
    definition: str | None = Field(description="for a hit rate, what it is the share of; else null")
    times: list[datetime] = Field(description="the start of each bucket")
    series: list[OneSeries]


DESCRIPTION = """
`metric`: hit_rate (cached / prompt tokens of the requests that reported cached tokens, weighted by
tokens; for a tenant: reused / prompt tokens of the diagnosed requests), ttft_p50, ttft_p90, ttft_p99
(`ttft=client`: as the gateway or application saw it, default; `ttft=server`: as vLLM measured it),
lost_tokens (one series per miss cause that lost tokens in the window), requests (per bucket).
For scope=server also its own readings: engine_hit_rate (its prefix-cache counters), kv_usage
(mean of vllm:kv_cache_usage_perc), evictions (blocks removed, from its KV events, kept for hours),
preemptions (per bucket), request_rate (finished requests per second).

`scope`: fleet, server (`id`: its id or name), template (`id`: its name or id), tenant (`id`: its name).
`since`/`until`: ISO 8601 or Unix seconds (default: the last hour), rounded to the bucket.
`bucket`: 60, 300, 900, 3600, 21600 or 86400 seconds; at most 2000 buckets, 31 days.
CSV (`format=csv` or `Accept: text/csv`): a `time` column, then one column per series.
"""


@router.get(
    "/series",
    auth=READERS,
    response={200: SeriesOut, 400: ApiError},
    summary="A time series of hit rate, TTFT, lost tokens or requests",
    description=DESCRIPTION,
)
def series(
    request: HttpRequest,
    metric: str = "",
    scope: str = "fleet",
    id: str = "",
    since: str = "",
    until: str = "",
    bucket: str = "60",
    ttft: str = "client",
    format: str = "",
) -> Any:
    params = {"metric": metric, "scope": scope, "id": id, "since": since, "until": until,
              "bucket": bucket, "ttft": ttft}  # fmt: skip
    if scope == "template" and id.strip():  # by its name or its id, as everywhere in the API
        template = find_template(id.strip(), viewer=caller_viewer(request))
        if template is None:
            return error(400, f"no template {id.strip()!r}", code="unknown_template")
        params["id"] = str(template.pk)
    try:
        query = traffic_series.parse_query(params, now=timezone.now())
        found = traffic_series.series(query, viewer=caller_viewer(request))
    except traffic_series.SeriesError as exc:
        return error(400, exc.message, code=exc.code)
    if format == "csv" or (not format and "text/csv" in request.headers.get("Accept", "")):
        return _csv(found)
    query = found.query
    return SeriesOut(
        metric=query.metric, scope=query.scope, id=query.id, since=query.since, until=query.until,
        bucket=query.bucket, ttft=query.ttft, unit=found.unit, source=found.source, times=found.times,
        definition=hit_rate_definition(query.metric, query.scope),
        series=[OneSeries(name=s.name, values=s.values) for s in found.series],
    )  # fmt: skip


def hit_rate_definition(metric: str, scope: str) -> str | None:
    """The definition of a hit-rate series (app/domain/misses.py), None for any other metric: a
    tenant's reads the diagnoses (reused / prompt tokens), every other scope's the records."""
    if metric == "engine_hit_rate":
        return OF_COUNTERS
    if metric != "hit_rate":
        return None
    return f"{OF_PROMPT}, of the diagnosed requests; {HOSTED_INCLUDED}" if scope == "tenant" else OF_RECORDED


def _csv(found: traffic_series.SeriesSet) -> HttpResponse:
    response = HttpResponse(
        traffic_series.as_csv(found.times, found.series), content_type="text/csv; charset=utf-8"
    )
    name = f"{found.query.metric}-{found.query.scope}{'-' + found.query.id if found.query.id else ''}.csv"
    response["Content-Disposition"] = f'attachment; filename="{_safe(name)}"'
    return response


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
