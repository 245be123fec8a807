"""Reads of request records, their diagnoses and the diagnoses' per-minute and per-hour sums."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Count, F, Max, Q, QuerySet, Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.fleet.models import Server
from app.traffic.models import (
    REUSABLE_LOST,
    LossHour,
    LossMinute,
    RequestDiagnosis,
    RequestRecord,
    ServerLossHour,
    ServerLossMinute,
)

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


def diagnosed_requests(
    *, server_name: str, request_id: str, viewer: Viewer = SEES_ALL
) -> list[DiagnosedRequest]:
    """The records of one server and request id (one per arrival) the viewer sees, newest first, with
    their diagnoses. Token ids are not read: prompt text stays in the database."""
    records = (
        viewer.traffic(RequestRecord.objects.all())
        .filter(server__name=server_name, request_id=request_id)
        .defer("token_ids")
        .select_related("server", "template", "template_version")
        .order_by("-arrived_at")
    )
    found = list(records)
    diagnoses = {
        d.arrived_at: d
        for d in RequestDiagnosis.objects.filter(
            server__name=server_name, request_id=request_id, arrived_at__in=[r.arrived_at for r in found]
        )
    }
    return [DiagnosedRequest(record, diagnoses.get(record.arrived_at)) for record in found]


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
    scope = {"server_id": server_id, "template_id": template_id, "tenant": tenant}
    parts = [
        part.filter(**{name: value for name, value in scope.items() if value is not None})
        for part in _loss_rollups(since=since, until=until, viewer=viewer)
    ]
    (sums,) = _summed(parts, keys=(), sums={cause: Sum(column) for cause, column in LOST_COLUMNS.items()})
    return {cause: tokens or 0 for cause, tokens in sums.items()}


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
    rows = _summed(_loss_rollups(since=since, until=until, viewer=viewer), keys=("tenant",), sums=sums)
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


SHARED_PREFIX_LOOKBACK = timedelta(hours=1)
"""How far back the shared-prefix audit reads raw request records: there is no rollup of prefixes."""


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
    samples: list[RequestRecord]  # the latest request of each tenant

    @property
    def hash_hex(self) -> str:
        return f"{self.first_block:016x}"


def shared_unsalted_prefixes(
    *, since: datetime, until: datetime, limit: int = 20, viewer: Viewer = SEES_ALL
) -> list[SharedPrefix]:
    """The first blocks (per model) that unsalted requests of two tenants or more began with, in the
    last SHARED_PREFIX_LOOKBACK of the window at most, the most requests first. Of the traffic the
    viewer sees: a viewer of one tenant sees none shared with another."""
    since = max(since, until - SHARED_PREFIX_LOOKBACK)
    unsalted = (
        viewer.traffic(RequestRecord.objects.all())
        .filter(arrived_at__gte=since, arrived_at__lt=until, salt_hash="", block_hashes__0__isnull=False)
        .exclude(tenant="")
        .annotate(first_block=F("block_hashes__0"))
    )
    groups = list(
        unsalted.values("model", "first_block")
        .annotate(tenant_count=Count("tenant", distinct=True), requests=Count("*"),
                  tenants=ArrayAgg("tenant", distinct=True, order_by="tenant"),
                  templates=ArrayAgg("template__name", distinct=True, order_by="template__name"),
                  last_seen_at=Max("arrived_at"))
        .filter(tenant_count__gte=2)
        .order_by("-requests", "model", "first_block")[:limit]
    )  # fmt: skip
    samples: dict[tuple[str, int], list[RequestRecord]] = {}
    latest = (
        unsalted.filter(first_block__in=[group["first_block"] for group in groups])
        .defer("token_ids", "block_hashes", "neutral_hashes")
        .select_related("server")
        .order_by("model", "first_block", "tenant", "-arrived_at")
        .distinct("model", "first_block", "tenant")
    )
    for record in latest:
        samples.setdefault((record.model, record.first_block), []).append(record)
    return [
        SharedPrefix(group["model"], group["first_block"] % 2**64, group["tenants"],
                     [name for name in group["templates"] if name], group["requests"],
                     group["last_seen_at"], samples.get((group["model"], group["first_block"]), []))
        for group in groups
    ]  # fmt: skip


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
