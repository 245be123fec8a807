"""What a drop is attributed to: the shift in the causes of the lost tokens, and for a template, the
version that took its traffic over at the change (the suspect commit), with the runners-up; for a
server or the fleet, whether the router still sends each template's requests where it sent them."""

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Sum

from app.domain.misses import is_loss
from app.domain.placement import share_stayed
from app.prompts.models import DeployMarker, TemplateVersion
from app.regressions.models import Regression
from app.regressions.series import Minute, ScopeKey, version_requests
from app.traffic.models import KVEvent, LossMinute, RequestRecord

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


def since_change(
    shift: dict[str, dict[str, float]], after: Sequence[Minute], *, changed_at: datetime
) -> dict[str, dict[str, float]]:
    """The shift with its "since" read again over the minutes since the change up to now (an open
    regression's: whether what its first minutes showed lasted), and its "after" too while the window
    holds the change's minute: a regression the deploy check opened before its first minutes were
    diagnosed has them only later."""
    if not after:
        return shift
    first = _shares(_first(after)) if after[0].minute == changed_at else shift["after"]
    return {**shift, "after": first, "since": _shares(after)}


def _shares(minutes: Sequence[Minute]) -> dict[str, float]:
    prompt = sum(minute.prompt_tokens for minute in minutes)
    lost: dict[str, int] = {}
    for minute in minutes:
        for cause, tokens in minute.lost.items():
            if is_loss(cause):  # a longer question is no regression's kind
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


def kind_at(
    key: ScopeKey,
    shift: dict[str, dict[str, float]],
    *,
    changed_at: datetime,
    placed: dict[str, float] | None = None,
) -> Kind:
    """The kind of a scope's drop: on a server whose KV events start a new epoch at the change, a
    new process (every miss of its first minutes is its empty cache's, whichever cause the diagnosis
    names: a salt's prefixes too), a capacity drop or a restart as kind_of tells them apart; on a
    server or the fleet whose requests the router stopped sending where it sent them (`placed`,
    placement()), a routing change, whether its misses are `routed_elsewhere` or `evicted` (once a
    server has stored a prefix it was newly sent, and evicted it for want of room, the diagnosis
    names its next miss an eviction); otherwise the cause that rose the most (kind_of)."""
    if key[0] == Regression.Scope.SERVER and key[2] is not None and restarted_near(key[2], changed_at):
        since = _most_risen(shift["before"], shift["since"], among=("evicted", "restarted"))
        return Kind.CAPACITY if since == "evicted" else Kind.RESTART
    kind = kind_of(shift)
    if kind in (Kind.CAPACITY, Kind.ROUTING) and routing_moved(placed):
        return Kind.ROUTING
    return kind


def _most_risen(
    before: dict[str, float], after: dict[str, float], among: Sequence[str] | None = None
) -> str | None:
    rises = {cause: after.get(cause, 0.0) - before.get(cause, 0.0) for cause in among or after}
    cause = max(rises, key=lambda name: rises[name], default=None)
    return cause if cause is not None and rises[cause] > 0 else None


def confirmed(
    kind: Kind,
    key: ScopeKey,
    after: Sequence[Minute],
    *,
    changed_at: datetime,
    placed: dict[str, float] | None = None,
) -> bool:
    """Whether what the causes name happened at the change. A restart is a new process: the
    server's KV events start a new epoch there. So is a capacity drop (vLLM sizes its cache at
    start-up); evictions rising without one are a larger working set (a template commit's new
    prefixes, say), not the server's doing. A salt rotation is the tenant's requests carrying a salt
    they did not carry before; `salt` misses without one are prefixes another tenant's salt computed
    first. A routing change is the templates' requests landing elsewhere than before (`placed`, from
    placement()); `routed_elsewhere` misses without one are prefixes the router never kept together."""
    if kind == Kind.ROUTING:
        return routing_moved(placed)
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


ROUTING_SCOPES = (Regression.Scope.SERVER, Regression.Scope.FLEET)
ROUTING_LOOKBACK = timedelta(minutes=30)  # how the router placed the requests before: lately
ROUTING_MIN_GROUP_REQUESTS = 10  # of a template and tenant on each side: fewer, and its spread is noise
ROUTING_MIN_FALL = 0.25  # of the share of requests that stayed: less is what routing does anyway


def may_be_routing(key: ScopeKey, shift: dict[str, dict[str, float]]) -> bool:
    """Whether a drop could be a routing change's: a server's or the fleet's whose misses rose as
    `routed_elsewhere` or `evicted` (what placement() is read for, and only then)."""
    return key[0] in ROUTING_SCOPES and kind_of(shift) in (Kind.CAPACITY, Kind.ROUTING)


def placement(
    key: ScopeKey, *, since: datetime, changed_at: datetime, until: datetime
) -> dict[str, float] | None:
    """How much of each template's requests of each tenant (what a prefix-aware router keeps on the
    servers holding its prefix) still landed on the servers they landed on before the change, from
    the loss rollups (app/domain/placement.py): `stayed_after` across the change, and `stayed_before`
    between the two halves of the ROUTING_LOOKBACK before it (what the router does on its own,
    thin groups' noise with it: random routing scatters as much before as after). A server's: of the
    groups it served on either side. None without a group of ROUTING_MIN_GROUP_REQUESTS on each side.
    Requests without a template are left out: nothing here says which of them share a prefix."""
    start = max(since, changed_at - ROUTING_LOOKBACK)
    middle = start + (changed_at - start) / 2
    rows = (
        LossMinute.objects.filter(minute__gte=start, minute__lt=until, template__isnull=False)
        .values_list("template_id", "tenant", "server_id", "minute")
        .annotate(requests_=Sum("requests"))
        .order_by()
    )
    groups = {(t, tenant) for t, tenant, server, _, _ in rows if key[2] in (None, server)}
    first: dict[tuple[int, str], dict[int, int]] = {}
    second: dict[tuple[int, str], dict[int, int]] = {}
    later: dict[tuple[int, str], dict[int, int]] = {}
    for template_id, tenant, server_id, minute, requests in rows:
        if (template_id, tenant) in groups:
            part = first if minute < middle else second if minute < changed_at else later
            spread = part.setdefault((template_id, tenant), {})
            spread[server_id] = spread.get(server_id, 0) + requests
    earlier = {group: _summed(first.get(group, {}), second.get(group, {})) for group in groups}
    before = share_stayed(first, second, min_requests=ROUTING_MIN_GROUP_REQUESTS // 2)
    after = share_stayed(earlier, later, min_requests=ROUTING_MIN_GROUP_REQUESTS)
    if before is None or after is None:
        return None
    return {"stayed_before": round(before, 4), "stayed_after": round(after, 4)}


def _summed(a: dict[int, int], b: dict[int, int]) -> dict[int, int]:
    return {server: a.get(server, 0) + b.get(server, 0) for server in a.keys() | b.keys()}


def routing_moved(placed: dict[str, float] | None) -> bool:
    """Whether the share of requests that stayed where they landed fell by ROUTING_MIN_FALL at the
    change (placement()); False without the figures to say."""
    return placed is not None and placed["stayed_before"] - placed["stayed_after"] >= ROUTING_MIN_FALL


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
        if version is None or gain <= 0 or restores_good_text(version):
            continue  # a revert takes the traffic back: never a drop's suspect
        found.append(candidate(version, gain=gain, changed_at=changed_at))
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


def candidate(version: TemplateVersion, *, gain: float, changed_at: datetime) -> dict[str, Any]:
    """A suspect version as a regression keeps it: its commit, its gain in the template's share of
    requests, when it went live before the change and how long before it that was."""
    live_at = live_at_before(version, changed_at)
    return {
        "version_id": version.pk,
        "commit_sha": version.commit_sha,
        "message": version.message.splitlines()[0] if version.message else "",
        "gain": round(gain, 4),
        "live_at": live_at.isoformat() if live_at else None,
        "minutes_before_change": round((changed_at - live_at) / timedelta(minutes=1), 1) if live_at else None,
    }


# A version deployed (or first requested) just after the minute its drop is placed at is still its
# cause: the change's minute is a floor, the deploy inside it.
LIVE_SLACK = timedelta(minutes=1)


def live_at_before(version: TemplateVersion, changed_at: datetime) -> datetime | None:
    """When the version went live for this change: its latest deploy marker up to the change (a
    re-deploy of an old version moves it), else its first request; None when neither is known."""
    markers = DeployMarker.objects.filter(template_version=version, deployed_at__lte=changed_at + LIVE_SLACK)
    latest = markers.order_by("-deployed_at").values_list("deployed_at", flat=True).first()
    return latest or version.first_seen_at


def restores_good_text(version: TemplateVersion) -> bool:
    """Whether the version's text is an earlier version's that no regression suspects: a revert, or a
    re-deploy of a known-good text (a version with no text imported restores nothing)."""
    if not version.content:
        return False
    same = TemplateVersion.objects.filter(
        template_id=version.template_id, committed_at__lt=version.committed_at, content=version.content
    )
    return same.exists() and not Regression.objects.filter(suspect_version__in=same).exists()
