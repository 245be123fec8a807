"""Reads of the diagnoses' answers: lost tokens by cause and by group, the funnel, routing's
effectiveness, unexpected hits and the recent misses, from the loss sums (app/rollups/windows.py)."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.domain.cost import Reuse
from app.fleet.models import Server
from app.rollups.windows import loss_minutes, loss_rollups, loss_sums, summed
from app.traffic.models import (
    FUNNEL_COLUMNS,
    LOST_COLUMNS,
    REUSABLE_LOST,
    RequestDiagnosis,
)


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
        for part in loss_rollups(since=since, until=until, viewer=viewer)
    ]
    sums = {cause: Sum(column) for cause, column in LOST_COLUMNS.items()}
    reuse = {"prompt_": Sum("diagnosed_prompt_tokens"), "reused_": Sum("reused_tokens")}
    (found,) = summed(parts, keys=(), sums={**sums, **reuse})
    lost = {cause: found[cause] or 0 for cause in sums}
    return lost, Reuse(found["prompt_"] or 0, found["reused_"] or 0)


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
        [loss_minutes(since=since, until=until, viewer=viewer)]
        if per_minute
        else loss_rollups(since=since, until=until, viewer=viewer)
    )
    rows = summed(parts, keys=keys, sums={**_SUMS, "requests_": Sum("requests"),
                                           "unexpected_hits_": Sum("unexpected_hits")})  # fmt: skip
    found = [_loss_row(row, names, per_minute=per_minute) for row in rows]
    if per_minute:
        return sorted(found, key=lambda row: (row.minute, [str(part) for part in row.group]))
    return sorted(found, key=lambda row: (-sum(row.lost.values()), [str(part) for part in row.group]))


_SUMS = {f"{column}_": Sum(column) for column in (*FUNNEL_COLUMNS, *LOST_COLUMNS.values())}


def _loss_row(row: dict[str, Any], names: tuple[str, ...], *, per_minute: bool) -> LossRow:
    return LossRow(
        group=tuple(row[name] for name in names),
        minute=row["minute"] if per_minute else None,
        requests=row["requests_"],
        unexpected_hits=row["unexpected_hits_"],
        funnel={column: row[f"{column}_"] for column in FUNNEL_COLUMNS},
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
    parts = loss_sums(since=since, until=until, viewer=viewer)
    per_server = {row["server_id"]: row for row in summed(parts, keys=("server_id",), sums=sums)}
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
        part.filter(server_id=server_id) for part in loss_rollups(since=since, until=until, viewer=viewer)
    ]
    sums = {
        "requests": Sum("diagnosed"),
        "routed_elsewhere_tokens": Sum("routed_elsewhere_tokens"),
        **{column: Sum(column) for column in FUNNEL_COLUMNS},
    }
    (found,) = summed(parts, keys=(), sums=sums)
    return {name: value or 0 for name, value in found.items()}
