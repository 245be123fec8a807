"""Reads of request records, their diagnoses and the diagnoses' per-minute and per-hour sums."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection
from django.db.models import Q, QuerySet, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.cost import Reuse
from app.fleet.models import Server
from app.traffic.models import (
    REUSABLE_LOST,
    LossHour,
    LossMinute,
    RequestDiagnosis,
    RequestRecord,
    ServerLossHour,
    ServerLossMinute,
    ServerLossQuarter,
)
from app.traffic.services.rollups import QUARTER

LOST_COLUMNS = {cause.value: f"{cause.value}_tokens" for cause in RequestDiagnosis.Cause}


@dataclass(frozen=True, slots=True)
class DiagnosedRequest:
    record: RequestRecord
    diagnosis: RequestDiagnosis | None  # None until the diagnosis task has run on it

    def lost_tokens(self) -> dict[str, int]:
        """Lost tokens by cause, the causes that lost none left out."""
        if self.diagnosis is None:
            return {}
        found = {cause: getattr(self.diagnosis, column) for cause, column in LOST_COLUMNS.items()}
        return {cause: tokens for cause, tokens in found.items() if tokens}


OTHERS_LISTED = 20
"""At most this many of the other requests under one id are listed (newest first); all are counted."""


@dataclass(frozen=True, slots=True)
class AddressedRequest:
    """The one request a (server, request id) address names, and the other requests a client sent
    under that id on that server: the ingest merges records of one id within JOIN_WINDOW of each
    other, so records further apart are different requests (the client reused the id)."""

    request: DiagnosedRequest
    others: list[datetime]  # their arrivals, newest first, OTHERS_LISTED at most
    other_count: int  # all of them


def addressed_request(
    *, server_name: str, request_id: str, arrived_at: datetime | None = None, viewer: Viewer = SEES_ALL
) -> AddressedRequest | None:
    """The request of that server and id the viewer sees that arrived at `arrived_at` (its record's
    exact arrival), else the latest, with its diagnosis and the other requests under its id; None
    when there is none (or none arrived then). Token ids are not read: prompt text stays in the
    database."""
    records = viewer.traffic(RequestRecord.objects.all()).filter(
        server__name=server_name, request_id=request_id
    )
    arrivals = list(records.order_by("-arrived_at").values_list("arrived_at", flat=True)[: OTHERS_LISTED + 2])
    chosen = arrived_at if arrived_at is not None else (arrivals[0] if arrivals else None)
    record = (
        records.filter(arrived_at=chosen)
        .defer("token_ids")
        .select_related("server", "template", "template_version")
        .first()
    )
    if record is None:
        return None
    diagnosis = RequestDiagnosis.objects.filter(
        server_id=record.server_id, request_id=request_id, arrived_at=record.arrived_at
    ).first()
    others = [at for at in arrivals if at != record.arrived_at][:OTHERS_LISTED]
    count = len(arrivals) - 1 if len(arrivals) <= OTHERS_LISTED + 1 else records.count() - 1
    return AddressedRequest(DiagnosedRequest(record, diagnosis), others, count)


def lost_tokens_by_cause(
    *,
    since: datetime,
    until: datetime,
    server_id: int | None = None,
    template_id: int | None = None,
    tenant: str | None = None,
    viewer: Viewer = SEES_ALL,
) -> dict[str, int]:
    """Prompt tokens lost per cause by the requests diagnosed that arrived in the minutes from
    `since` to `until` (per-minute rollups: a minute counts when it starts in the window), of one
    server, template or tenant when given, of the traffic the viewer sees."""
    return window_losses(
        since=since, until=until, server_id=server_id, template_id=template_id, tenant=tenant, viewer=viewer
    )[0]


def window_losses(
    *,
    since: datetime,
    until: datetime,
    server_id: int | None = None,
    template_id: int | None = None,
    tenant: str | None = None,
    viewer: Viewer = SEES_ALL,
) -> tuple[dict[str, int], Reuse]:
    """lost_tokens_by_cause's sums, and from the same rows its hit rate's (Reuse: the diagnosed
    prompt tokens and the reused ones)."""
    scope = {"server_id": server_id, "template_id": template_id, "tenant": tenant}
    parts = [
        part.filter(**{name: value for name, value in scope.items() if value is not None})
        for part in _loss_rollups(since=since, until=until, viewer=viewer)
    ]
    sums = {cause: Sum(column) for cause, column in LOST_COLUMNS.items()}
    reuse = {"prompt_": Sum("diagnosed_prompt_tokens"), "reused_": Sum("reused_tokens")}
    (found,) = _summed(parts, keys=(), sums={**sums, **reuse})
    lost = {cause: found[cause] or 0 for cause in sums}
    return lost, Reuse(found["prompt_"] or 0, found["reused_"] or 0)


def _loss_minutes(*, since: datetime, until: datetime, viewer: Viewer) -> QuerySet[LossMinute]:
    return viewer.traffic(LossMinute.objects.all()).filter(minute__gte=since, minute__lt=until)


def _loss_rollups(*, since: datetime, until: datetime, viewer: Viewer) -> list[QuerySet[Any]]:
    """The loss rollups of the minutes from `since` to `until`: the whole hours from the hours, the
    minutes around them from the minutes. A week of a fleet's minutes was millions of rows to sum
    per request (bench/bench_pages.py); its hours are at most servers x templates x 168."""
    first = since.replace(minute=0, second=0, microsecond=0)
    first += timedelta(hours=1) if first < since else timedelta(0)
    last = until.replace(minute=0, second=0, microsecond=0)
    if first >= last:
        return [_loss_minutes(since=since, until=until, viewer=viewer)]
    hours = viewer.traffic(LossHour.objects.all()).filter(hour__gte=first, hour__lt=last)
    return [
        _loss_minutes(since=since, until=first, viewer=viewer),
        hours,
        _loss_minutes(since=last, until=until, viewer=viewer),
    ]


def _loss_sums(*, since: datetime, until: datetime, viewer: Viewer) -> list[QuerySet[Any]]:
    """_loss_rollups' rows as read for sums per server or in total: from the sums per server and
    tenant (ServerLossMinute, ServerLossHour: an hour of a fleet is servers x 60 rows, not x templates
    too) and, for a viewer of some tenants, the rows of its templates on other servers from the
    per-template rollups (Viewer.loss_hours: the rows traffic() lets it see)."""
    first = since.replace(minute=0, second=0, microsecond=0)
    first += timedelta(hours=1) if first < since else timedelta(0)
    last = until.replace(minute=0, second=0, microsecond=0)
    spans: list[tuple[type[Any], type[Any], Q]] = (
        [(LossMinute, ServerLossMinute, Q(minute__gte=since, minute__lt=until))]
        if first >= last
        else [
            (LossMinute, ServerLossMinute, Q(minute__gte=since, minute__lt=first)),
            (LossHour, ServerLossHour, Q(hour__gte=first, hour__lt=last)),
            (LossMinute, ServerLossMinute, Q(minute__gte=last, minute__lt=until)),
        ]
    )
    return [
        part
        for fine, summed, within in spans
        for part in viewer.loss_hours(summed.objects.filter(within), fine.objects.filter(within))
    ]


def _summed(
    parts: list[QuerySet[Any]], *, keys: tuple[str, ...], sums: dict[str, Sum]
) -> list[dict[str, Any]]:
    """`sums` per value of `keys` (one row of them all when none) over the rows of every part."""
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for part in parts:
        rows = part.values(*keys).annotate(**sums) if keys else [part.aggregate(**sums)]
        for row in rows:
            total = found.setdefault(tuple(row[key] for key in keys), {key: row[key] for key in keys})
            for name in sums:  # a sum over no rows is None: 0 here
                total[name] = total.get(name, 0) + (row[name] or 0)
    return list(found.values())


LOSS_GROUPS = {
    "server": ("server__name",),
    "template": ("template__name",),
    "template_version": ("template__name", "template_version__commit_sha"),
    "tenant": ("tenant",),
}
"""What lost tokens can be broken down by, and the columns that name each group."""


@dataclass(frozen=True, slots=True)
class LossRow:
    """One group's (or one group-minute's) requests, funnel and lost tokens by cause."""

    group: tuple[str | None, ...]
    minute: datetime | None
    requests: int
    unexpected_hits: int
    funnel: dict[str, int]
    lost: dict[str, int]


def losses(
    *, since: datetime, until: datetime, by: str, per_minute: bool = False, viewer: Viewer = SEES_ALL
) -> list[LossRow]:
    """Lost tokens by cause and the funnel, per group of `by` (a LOSS_GROUPS key), per minute or
    over the whole window; the groups that lost most first (per minute: in time order)."""
    names = LOSS_GROUPS[by]
    keys = (*names, "minute") if per_minute else names
    parts = (
        [_loss_minutes(since=since, until=until, viewer=viewer)]
        if per_minute
        else _loss_rollups(since=since, until=until, viewer=viewer)
    )
    rows = _summed(parts, keys=keys, sums={**_SUMS, "requests_": Sum("requests"),
                                           "unexpected_hits_": Sum("unexpected_hits")})  # fmt: skip
    found = [_loss_row(row, names, per_minute=per_minute) for row in rows]
    if per_minute:
        return sorted(found, key=lambda row: (row.minute, [str(part) for part in row.group]))
    return sorted(found, key=lambda row: (-sum(row.lost.values()), [str(part) for part in row.group]))


_FUNNEL = (
    "prompt_tokens",
    "seen_before_tokens",
    "resident_anywhere_tokens",
    "resident_here_tokens",
    "reused_tokens",
)
_SUMS = {f"{column}_": Sum(column) for column in (*_FUNNEL, *LOST_COLUMNS.values())}


def _loss_row(row: dict[str, Any], names: tuple[str, ...], *, per_minute: bool) -> LossRow:
    return LossRow(
        group=tuple(row[name] for name in names),
        minute=row["minute"] if per_minute else None,
        requests=row["requests_"],
        unexpected_hits=row["unexpected_hits_"],
        funnel={column: row[f"{column}_"] for column in _FUNNEL},
        lost={cause: row[f"{column}_"] for cause, column in LOST_COLUMNS.items() if row[f"{column}_"]},
    )


@dataclass(frozen=True, slots=True)
class RoutingGroup:
    """Servers that can serve each other's prefixes (one model, block size and hash algorithm):
    how much of what was resident somewhere among them the router's choices reused."""

    model: str
    block_size: int | None
    hash_algo: str
    servers: list[str]
    requests: int
    resident_anywhere_tokens: int
    reused_tokens: int
    routed_elsewhere_tokens: int

    @property
    def effectiveness(self) -> float | None:
        """reused / resident anywhere; None before anything was resident."""
        if not self.resident_anywhere_tokens:
            return None
        return self.reused_tokens / self.resident_anywhere_tokens


def routing_effectiveness(
    *, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> list[RoutingGroup]:
    """Per group of compatible servers with diagnosed requests in the window, the tokens routing
    lost most first."""
    sums = {"requests": Sum("requests"), "anywhere": Sum("resident_anywhere_tokens"),
            "reused": Sum("reused_tokens"), "routed": Sum("routed_elsewhere_tokens")}  # fmt: skip
    parts = _loss_sums(since=since, until=until, viewer=viewer)
    per_server = {row["server_id"]: row for row in _summed(parts, keys=("server_id",), sums=sums)}
    groups: dict[tuple[str, int | None, str], list[Server]] = {}
    for server in Server.objects.filter(pk__in=per_server).order_by("name"):
        groups.setdefault((server.model, server.block_size, server.hash_algo), []).append(server)
    found = [
        RoutingGroup(
            model=model,
            block_size=block_size,
            hash_algo=hash_algo,
            servers=[s.name for s in members],
            requests=sum(per_server[s.pk]["requests"] for s in members),
            resident_anywhere_tokens=sum(per_server[s.pk]["anywhere"] for s in members),
            reused_tokens=sum(per_server[s.pk]["reused"] for s in members),
            routed_elsewhere_tokens=sum(per_server[s.pk]["routed"] for s in members),
        )
        for (model, block_size, hash_algo), members in groups.items()
    ]
    return sorted(found, key=lambda group: (-group.routed_elsewhere_tokens, group.model))


@dataclass(frozen=True, slots=True)
class TenantAudit:
    """One tenant's isolation: what its salt cost (the same tokens were resident under another
    salt) and its unexpected hits (more cached than its own salt could have had resident)."""

    tenant: str
    requests: int
    prompt_tokens: int
    reused_tokens: int
    salt_tokens: int
    unexpected_hits: int
    lost_tokens: int = 0  # every cause's, the tail below one block included

    @property
    def hit_rate(self) -> float | None:
        """Reused over prompt tokens of its diagnosed requests; None when they had none."""
        return self.reused_tokens / self.prompt_tokens if self.prompt_tokens else None

    @property
    def hit_percent(self) -> float | None:
        rate = self.hit_rate
        return None if rate is None else 100 * rate


def tenant_audit(*, since: datetime, until: datetime, viewer: Viewer = SEES_ALL) -> list[TenantAudit]:
    """Every tenant with diagnosed requests in the window, unexpected hits first, then salt cost."""
    sums = {"requests": Sum("requests"), "prompt": Sum("prompt_tokens"), "reused": Sum("reused_tokens"),
            "salt": Sum("salt_tokens"), "unexpected": Sum("unexpected_hits"),
            **{f"lost_{cause}": Sum(column) for cause, column in LOST_COLUMNS.items()}}  # fmt: skip
    rows = _summed(_tenant_loss_rollups(since=since, until=until, viewer=viewer), keys=("tenant",), sums=sums)
    found = [
        TenantAudit(
            row["tenant"],
            row["requests"],
            row["prompt"],
            row["reused"],
            row["salt"],
            row["unexpected"],
            lost_tokens=sum(row[f"lost_{cause}"] for cause in LOST_COLUMNS),
        )
        for row in rows
    ]
    return sorted(found, key=lambda row: (-row.unexpected_hits, -row.salt_tokens, row.tenant))


def _tenant_loss_rollups(*, since: datetime, until: datetime, viewer: Viewer) -> list[QuerySet[Any]]:
    """_loss_rollups() for sums per tenant, read from the loss sums per server and tenant where they
    serve: whole hours from ServerLossHour, whole quarter hours around them from ServerLossQuarter, the
    minutes around those from LossMinute (an hour's window was up to 118 loss minutes of every server,
    template and version; now 28 at most). Viewer.loss_hours says which rows of the sums the viewer
    sees, and reads the rest (tenant-less rows of its templates on others' servers) from the rollups
    per template."""
    quarters = _ceil_quarter(since), _floor_quarter(until)
    if quarters[0] >= quarters[1]:
        return [_loss_minutes(since=since, until=until, viewer=viewer)]
    hours = _ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
    spans = [(quarters[0], hours[0]), (hours[1], quarters[1])] if hours[0] < hours[1] else [quarters]
    parts = [_loss_minutes(since=since, until=quarters[0], viewer=viewer),
             _loss_minutes(since=quarters[1], until=until, viewer=viewer)]  # fmt: skip
    for start, end in spans:
        if start < end:
            quarter, minute = ServerLossQuarter.objects.all(), LossMinute.objects.all()
            parts += viewer.loss_hours(quarter.filter(minute__gte=start, minute__lt=end),
                                       minute.filter(minute__gte=start, minute__lt=end))  # fmt: skip
    if hours[0] < hours[1]:
        hour_span = {"hour__gte": hours[0], "hour__lt": hours[1]}
        parts += viewer.loss_hours(
            ServerLossHour.objects.filter(**hour_span), LossHour.objects.filter(**hour_span)
        )
    return parts


def _ceil_quarter(moment: datetime) -> datetime:
    floor = _floor_quarter(moment)
    return floor if floor == moment else floor + QUARTER


def _floor_quarter(moment: datetime) -> datetime:
    return moment.replace(minute=moment.minute - moment.minute % 15, second=0, microsecond=0)


def unexpected_hits(
    *,
    since: datetime,
    until: datetime | None = None,
    tenant: str | None = None,
    limit: int = 50,
    viewer: Viewer = SEES_ALL,
) -> list[RequestDiagnosis]:
    """The latest requests since `since` (before `until` when given) that reused more than their own
    salt could have had resident (salts are known to be dropped on some cache paths), newest first."""
    hits = viewer.traffic(RequestDiagnosis.objects.all()).filter(unexpected_hit=True, arrived_at__gte=since)
    if until is not None:
        hits = hits.filter(arrived_at__lt=until)
    if tenant is not None:
        hits = hits.filter(tenant=tenant)
    return list(hits.select_related("server", "template").order_by("-arrived_at")[:limit])


@dataclass(frozen=True, slots=True)
class SharedPrefixSample:
    """The latest request of one tenant that began with a shared first block, by its key."""

    tenant: str
    server_name: str
    request_id: str
    arrived_at: datetime


@dataclass(frozen=True, slots=True)
class SharedPrefix:
    """A first block that requests of several tenants sent with no cache salt: each of them can
    reuse (and time) what the others put in the cache."""

    model: str
    first_block: int  # the uint64 wire hash, as KV events carry it
    tenants: list[str]
    templates: list[str]
    requests: int
    last_seen_at: datetime
    samples: list[SharedPrefixSample]  # the latest request of each tenant, by tenant

    @property
    def hash_hex(self) -> str:
        return f"{self.first_block:016x}"


_LATEST_ROW = "ORDER BY s.last_seen_at DESC, s.last_server_id DESC, s.last_request_id DESC"
# The window's rows (minutes at its edges, hours between); the first blocks of two tenants or more
# among them, the most requests first (hashed sums: no sort of the window's rows); then those blocks'
# rows summed per tenant, with its latest request. Grouped by the first block before the model:
# integers sort faster than text.
_SHARED_SQL = f"""
WITH seen AS (
    SELECT model, first_block, tenant, template_id, requests, last_seen_at, last_server_id, last_request_id
    FROM traffic_unsaltedprefixminute WHERE ({{minutes}}) AND {{seen}}
    UNION ALL
    SELECT model, first_block, tenant, template_id, requests, last_seen_at, last_server_id, last_request_id
    FROM traffic_unsaltedprefixhour WHERE hour >= %(first)s AND hour < %(last)s AND {{seen}}
), per_tenant AS (
    SELECT first_block, model, tenant, sum(requests) AS requests FROM seen GROUP BY 1, 2, 3
), shared AS (
    SELECT first_block, model FROM per_tenant GROUP BY 1, 2 HAVING count(*) >= 2
    ORDER BY sum(requests) DESC, model, first_block LIMIT %(limit)s
), latest AS (
    SELECT s.first_block, s.model, s.tenant, array_agg(DISTINCT s.template_id) AS template_ids,
           sum(s.requests) AS requests, max(s.last_seen_at) AS last_seen_at,
           (array_agg(s.last_server_id {_LATEST_ROW}))[1] AS server_id,
           (array_agg(s.last_request_id {_LATEST_ROW}))[1] AS request_id
    FROM seen s JOIN shared USING (first_block, model) GROUP BY 1, 2, 3
)
SELECT l.model, l.first_block, l.tenant,
       ARRAY(SELECT t.name FROM prompts_template t WHERE t.id = ANY(l.template_ids)),
       l.requests, l.last_seen_at, srv.name, l.request_id
FROM latest l JOIN fleet_server srv ON srv.id = l.server_id
"""


def shared_unsalted_prefixes(
    *, since: datetime, until: datetime, limit: int = 20, viewer: Viewer = SEES_ALL
) -> list[SharedPrefix]:
    """The first blocks (per model) that unsalted requests of two tenants or more began with in the
    minutes from `since` to `until`, the most requests first; from the unsalted prefix rollups, which
    keep the first blocks two requests sent in the same hour (UnsaltedPrefixTotals says why). Of the
    traffic the viewer sees: a viewer of one tenant sees none shared with another."""
    first, last = _ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
    edges = [(since, first), (last, until)] if first < last else [(since, until)]
    seen, params = viewer.tenanted_sql()
    minutes = " OR ".join(f"(minute >= %(since{i})s AND minute < %(until{i})s)" for i in range(len(edges)))
    for i, (start, end) in enumerate(edges):
        params |= {f"since{i}": start, f"until{i}": end}
    params |= {"first": first, "last": last, "limit": limit}
    with connection.cursor() as cursor:
        cursor.execute(_SHARED_SQL.format(minutes=minutes, seen=seen), params)
        rows = cursor.fetchall()
    groups: dict[tuple[str, int], list[tuple[Any, ...]]] = {}
    for row in sorted(rows):  # by model, first block and tenant
        groups.setdefault((row[0], row[1]), []).append(row)
    # As the query's LIMIT ranks them: the most requests first, then by model and the stored (signed) hash.
    ranked = sorted(groups.items(), key=lambda group: (-sum(row[4] for row in group[1]), group[0]))
    return [_shared_prefix(model, block, found) for (model, block), found in ranked]


def _shared_prefix(model: str, block: int, rows: list[tuple[Any, ...]]) -> SharedPrefix:
    """One first block's rows of _SHARED_SQL (one per tenant, in tenant order) as a SharedPrefix."""
    samples = [SharedPrefixSample(row[2], row[6], row[7], row[5]) for row in rows]
    templates = sorted({name for row in rows for name in row[3]})
    requests, last_seen_at = sum(row[4] for row in rows), max(row[5] for row in rows)
    return SharedPrefix(
        model, block % 2**64, [row[2] for row in rows], templates, requests, last_seen_at, samples
    )


def _ceil_hour(moment: datetime) -> datetime:
    floor = moment.replace(minute=0, second=0, microsecond=0)
    return floor if floor == moment else floor + timedelta(hours=1)


def recent_misses(*, since: datetime, limit: int = 15, viewer: Viewer = SEES_ALL) -> list[RequestDiagnosis]:
    """The diagnosed requests since `since` that lost the most reusable prompt tokens (the tail
    below one block is not reusable, so it does not count), most first, then newest: a walk of the
    diagnoses' index of that order (RequestDiagnosis.REUSABLE_LOST), stopped at `limit`."""
    return list(
        viewer.traffic(RequestDiagnosis.objects.all())
        .filter(arrived_at__gte=since)
        .annotate(reusable_lost=REUSABLE_LOST)
        .filter(reusable_lost__gt=0)
        .select_related("server", "template")
        .order_by("-reusable_lost", "-arrived_at")[:limit]
    )


def server_funnel(
    *, server_id: int, since: datetime, until: datetime, viewer: Viewer = SEES_ALL
) -> dict[str, int]:
    """One server's diagnosed requests in the window and their funnel (prompt, seen before, resident
    anywhere, resident here, reused tokens) with the tokens routing lost (resident on another server)."""
    parts = [
        part.filter(server_id=server_id) for part in _loss_rollups(since=since, until=until, viewer=viewer)
    ]
    (sums,) = _summed(parts, keys=(), sums={"requests": Sum("diagnosed"),
                                            "routed_elsewhere_tokens": Sum("routed_elsewhere_tokens"),
                                            **{column: Sum(column) for column in _FUNNEL}})  # fmt: skip
    return {name: value or 0 for name, value in sums.items()}
