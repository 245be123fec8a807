"""What a drop is attributed to: the shift in the causes of the lost tokens, and for a template, the
version that took its traffic over at the change (the suspect commit), with the runners-up."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from app.prompts.models import DeployMarker, TemplateVersion
from app.regressions.models import Regression
from app.regressions.series import Minute, ScopeKey, version_requests
from app.traffic.models import KVEvent, RequestRecord

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
    """Each cause's lost tokens as a share of the prompt tokens: before the change, in the first
    SHIFT_WINDOW after it ("after": what names the drop; the after segment runs to the end of the
    window, and a restart minutes later would otherwise show in it), and since it ("since": whether
    a new process stayed short of blocks)."""
    return {"before": _shares(before), "after": _shares(_first(after)), "since": _shares(after)}


SHIFT_WINDOW = timedelta(minutes=2)  # the change's own minute (it may be mixed) and the next


def _first(after: Sequence[Minute]) -> Sequence[Minute]:
    return [minute for minute in after if minute.minute < after[0].minute + SHIFT_WINDOW] if after else after


def _shares(minutes: Sequence[Minute]) -> dict[str, float]:
    prompt = sum(minute.prompt_tokens for minute in minutes)
    lost: dict[str, int] = {}
    for minute in minutes:
        for cause, tokens in minute.lost.items():
            lost[cause] = lost.get(cause, 0) + tokens
    return {cause: round(tokens / prompt, 4) for cause, tokens in sorted(lost.items())} if prompt else {}


def kind_of(shift: dict[str, dict[str, float]]) -> Kind:
    """The kind named by the cause that rose the most just after the change (below_block and cold
    name none). A new process (a restart or a capacity drop: its first minutes miss as `restarted`
    or `evicted`) is a capacity drop when evictions rose more than restarted misses since it: a
    restart warms up again, a smaller cache keeps evicting."""
    cause = _most_risen(shift["before"], shift["after"])
    kind = _KIND_OF_CAUSE.get(cause, Kind.UNKNOWN) if cause else Kind.UNKNOWN
    if kind in (Kind.RESTART, Kind.CAPACITY) and "since" in shift:
        since = _most_risen(shift["before"], shift["since"], among=("evicted", "restarted"))
        kind = Kind.CAPACITY if since == "evicted" else Kind.RESTART
    return kind


def kind_at(key: ScopeKey, shift: dict[str, dict[str, float]], *, changed_at: datetime) -> Kind:
    """The kind of a scope's drop: on a server whose KV events start a new epoch at the change, a
    new process (every miss of its first minutes is its empty cache's, whichever cause the diagnosis
    names: a salt's prefixes too), a capacity drop or a restart as kind_of tells them apart;
    otherwise the cause that rose the most (kind_of)."""
    if key[0] == Regression.Scope.SERVER and key[2] is not None and restarted_near(key[2], changed_at):
        since = _most_risen(shift["before"], shift["since"], among=("evicted", "restarted"))
        return Kind.CAPACITY if since == "evicted" else Kind.RESTART
    return kind_of(shift)


def _most_risen(
    before: dict[str, float], after: dict[str, float], among: Sequence[str] | None = None
) -> str | None:
    rises = {cause: after.get(cause, 0.0) - before.get(cause, 0.0) for cause in among or after}
    cause = max(rises, key=lambda name: rises[name], default=None)
    return cause if cause is not None and rises[cause] > 0 else None


def confirmed(kind: Kind, key: ScopeKey, after: Sequence[Minute], *, changed_at: datetime) -> bool:
    """Whether what the causes name happened at the change. A restart is a new process: the
    server's KV events start a new epoch there. So is a capacity drop (vLLM sizes its cache at
    start-up); evictions rising without one are a larger working set (a template commit's new
    prefixes, say), not the server's doing. A salt rotation is the tenant's requests carrying a salt
    they did not carry before; `salt` misses without one are prefixes another tenant's salt computed
    first."""
    if kind in (Kind.CAPACITY, Kind.RESTART):
        return key[2] is not None and restarted_near(key[2], changed_at)
    if kind == Kind.SALT_ROTATION:
        records = RequestRecord.objects.filter(tenant=key[3])
        earlier = records.filter(arrived_at__gte=changed_at - SALT_WINDOW, arrived_at__lt=changed_at)
        later = records.filter(arrived_at__gte=changed_at, arrived_at__lt=changed_at + SALT_WINDOW)
        salts = set(earlier.values_list("salt_hash", flat=True).distinct())
        return bool(later.exclude(salt_hash__in=salts).exists())
    return True


SALT_WINDOW = timedelta(minutes=10)
# The change's minute is the first after the drop, and a restart inside a minute may leave it mixed:
# the new epoch's first event is looked for from the minute before to the end of the shift's window.
RESTART_SLACK = timedelta(minutes=1)
EPOCH_LOOKBACK = timedelta(hours=1)  # the epoch the server was in before: its events of the last hour


def restarted_near(server_id: int, changed_at: datetime) -> bool:
    """Whether the server's KV events start a new epoch (a new process) close to the change."""
    start, end = changed_at - RESTART_SLACK, changed_at + SHIFT_WINDOW
    events = KVEvent.objects.filter(server_id=server_id)
    earlier = (
        events.filter(emitted_at__gte=start - EPOCH_LOOKBACK, emitted_at__lt=start)
        .order_by("-emitted_at")
        .values_list("epoch", flat=True)
        .first()
    )
    if earlier is None:  # no events before it: nothing says the epoch changed here
        return False
    return events.filter(emitted_at__gte=start, emitted_at__lt=end, epoch__gt=earlier).exists()


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
