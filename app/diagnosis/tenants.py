"""The tenants' audit: what each tenant's salt cost, its unexpected hits, and the first blocks
several tenants sent unsalted."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.db.models import Sum

from app.core.tenancy import SEES_ALL, Viewer
from app.rollups.visibility import visible_sql
from app.rollups.windows import ceil_hour, summed, tenant_loss_rollups
from app.traffic.models import (
    LOST_COLUMNS,
    UnsaltedPrefixMinute,
)


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
    rows = summed(tenant_loss_rollups(since=since, until=until, viewer=viewer), keys=("tenant",), sums=sums)
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
    first, last = ceil_hour(since), until.replace(minute=0, second=0, microsecond=0)
    edges = [(since, first), (last, until)] if first < last else [(since, until)]
    found = visible_sql(viewer, UnsaltedPrefixMinute)  # the hours' columns are the minutes'
    seen, params = found.sql, dict(found.params)
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
