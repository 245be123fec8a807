"""What a drop is attributed to: the shift in the causes of the lost tokens, and for a template, the
version that took its traffic over at the change (the suspect commit), with the runners-up."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from app.prompts.models import DeployMarker, TemplateVersion
from app.regressions.models import Regression
from app.regressions.series import Minute, ScopeKey, version_requests
from app.traffic.models import RequestRecord

Kind = Regression.Kind

# The cause whose share of the prompt tokens rose the most names the kind of the regression.
_KIND_OF_CAUSE = {
    "prompt_changed": Kind.TEMPLATE_COMMIT,
    "evicted": Kind.CAPACITY,
    "routed_elsewhere": Kind.ROUTING,
    "salt": Kind.SALT_ROTATION,
    "restarted": Kind.RESTART,
}
EXPECTED_KINDS = {Kind.SALT_ROTATION, Kind.RESTART}
"""Transient by nature (the cache warms again under the new salt or process): labelled expected."""

SCOPE_KINDS: dict[str, set[Regression.Kind]] = {
    Regression.Scope.TEMPLATE: {Kind.TEMPLATE_COMMIT},
    Regression.Scope.TEMPLATE_SERVER: {Kind.TEMPLATE_COMMIT},
    Regression.Scope.TEMPLATE_TENANT: {Kind.TEMPLATE_COMMIT},
    Regression.Scope.SERVER: {Kind.CAPACITY, Kind.ROUTING, Kind.RESTART},
    Regression.Scope.TENANT: {Kind.SALT_ROTATION},
    Regression.Scope.FLEET: {Kind.ROUTING, Kind.UNKNOWN},
}
"""The kinds each scope opens a regression for: a template is regressed by its commits, a server by
its capacity, routing or restarts, a tenant by its salt; the fleet by a routing change (every server
at once) or what names no cause."""

SUSPECT_MIN_GAIN = 0.1  # of the template's requests: a version that took less did not cause a drop


def cause_shift(before: Sequence[Minute], after: Sequence[Minute]) -> dict[str, dict[str, float]]:
    """Each cause's lost tokens as a share of the prompt tokens, before and after the change."""
    return {"before": _shares(before), "after": _shares(after)}


def _shares(minutes: Sequence[Minute]) -> dict[str, float]:
    prompt = sum(minute.prompt_tokens for minute in minutes)
    lost: dict[str, int] = {}
    for minute in minutes:
        for cause, tokens in minute.lost.items():
            lost[cause] = lost.get(cause, 0) + tokens
    return {cause: round(tokens / prompt, 4) for cause, tokens in sorted(lost.items())} if prompt else {}


def kind_of(shift: dict[str, dict[str, float]]) -> Kind:
    """The kind named by the cause that rose the most (below_block and cold name none)."""
    before, after = shift["before"], shift["after"]
    rises = {cause: after.get(cause, 0.0) - before.get(cause, 0.0) for cause in after}
    cause = max(rises, key=lambda name: rises[name], default=None)
    if cause is None or rises[cause] <= 0:
        return Kind.UNKNOWN
    return _KIND_OF_CAUSE.get(cause, Kind.UNKNOWN)


def confirmed(kind: Kind, key: ScopeKey, after: Sequence[Minute], *, changed_at: datetime) -> bool:
    """Whether what the causes name happened at the change. A capacity drop is a new process with
    fewer blocks (vLLM sizes its cache at start-up): its first requests are `restarted`; evictions
    rising without one are a larger working set (a template commit's new prefixes, say), not the
    server's doing. A salt rotation is the tenant's requests carrying a salt they did not carry
    before; `salt` misses without one are prefixes another tenant's salt computed first."""
    if kind == Kind.CAPACITY:
        return any(minute.lost.get("restarted") for minute in after[:RESTART_MINUTES])
    if kind == Kind.SALT_ROTATION:
        records = RequestRecord.objects.filter(tenant=key[3])
        earlier = records.filter(arrived_at__gte=changed_at - SALT_WINDOW, arrived_at__lt=changed_at)
        later = records.filter(arrived_at__gte=changed_at, arrived_at__lt=changed_at + SALT_WINDOW)
        salts = set(earlier.values_list("salt_hash", flat=True).distinct())
        return bool(later.exclude(salt_hash__in=salts).exists())
    return True


SALT_WINDOW = timedelta(minutes=10)
RESTART_MINUTES = 3  # a capacity drop's restart shows in the first minutes after the change


def suspects(
    template_id: int,
    *,
    changed_at: datetime,
    since: datetime,
    until: datetime,
    server_id: int | None = None,
    tenant: str | None = None,
) -> list[dict[str, Any]]:
    """The versions of the template whose share of its requests (on one server or of one tenant when
    given) rose across the change, most first: each with its gain, when it went live (its first
    deploy marker or first request) and how long before the change that was."""
    per_version = version_requests(template_id, since=since, until=until, server_id=server_id, tenant=tenant)
    shares = _shares_across(per_version, changed_at)
    versions = TemplateVersion.objects.in_bulk([version for version in shares if version is not None])
    found = []
    for version_id, gain in shares.items():
        version = versions.get(version_id) if version_id is not None else None
        if version is None or gain <= 0:
            continue
        live_at = _live_at(version)
        found.append(
            {
                "version_id": version.pk,
                "commit_sha": version.commit_sha,
                "message": version.message.splitlines()[0] if version.message else "",
                "gain": round(gain, 4),
                "live_at": live_at.isoformat() if live_at else None,
                "minutes_before_change": round((changed_at - live_at) / timedelta(minutes=1), 1)
                if live_at
                else None,
            }
        )
    return sorted(
        found, key=lambda candidate: (-candidate["gain"], abs(candidate["minutes_before_change"] or 0))
    )


def _shares_across(
    per_version: dict[int | None, list[tuple[datetime, int]]], changed_at: datetime
) -> dict[int | None, float]:
    """Each version's share of the requests after the change less its share before."""
    before = {
        version: sum(n for minute, n in rows if minute < changed_at) for version, rows in per_version.items()
    }
    after = {
        version: sum(n for minute, n in rows if minute >= changed_at) for version, rows in per_version.items()
    }
    total_before, total_after = sum(before.values()) or 1, sum(after.values()) or 1
    return {version: after[version] / total_after - before[version] / total_before for version in per_version}


def _live_at(version: TemplateVersion) -> datetime | None:
    deployed = DeployMarker.objects.filter(template_version=version).order_by("deployed_at").first()
    moments = [moment for moment in (deployed and deployed.deployed_at, version.first_seen_at) if moment]
    return min(moments) if moments else None
