"""A template regression's evidence: a before/after pair of its requests with their Compare permalink
and the first token where the after one departs, the suspect version's diff line by line (moved lines
told apart), and the cache killers its traffic showed since the change, frozen onto the regression
(``evidence["killers"]``) while it is open."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet

from app.compare.killers import killers_between
from app.compare.selectors import RecordKey
from app.compare.services import ComparisonError, SideInput, create_comparison
from app.domain.difflines import DiffLine, LineKind, diff_lines
from app.domain.divergence import shared_leading_blocks
from app.prompts.models import CacheKiller
from app.regressions.models import Regression
from app.traffic.models import RequestDiagnosis, RequestRecord


def before_after_pair(
    template_id: int, *, changed_at: datetime, now: datetime, version_id: int | None = None
) -> dict[str, Any]:
    """The template's first request on the suspect version `version_id` (the after), and the last
    request of the same tenant before it on another version (the before, the version the suspect
    took over from), compared (a permalink saved by Compare); ``diverged_at`` is where the two
    prompts first differ, the commit's change. The change's minute is where the rate fell, not when
    the suspect went live: either may come first, so the pair is placed by versions, not by that
    minute. Without a suspect: the first request from the change's minute on that lost tokens to
    the prompt changing, and the last of its tenant before that minute on another version. {} when
    either is missing (in the detection's window before the change)."""
    since = changed_at - timedelta(minutes=settings.PREFIXSCOPE_REGRESSION_WINDOW_MINUTES)
    diagnoses = RequestDiagnosis.objects.filter(template_id=template_id, arrived_at__gte=since)
    after = _after(diagnoses, changed_at=changed_at, version_id=version_id)
    if after is None:
        return {}
    earlier = diagnoses.filter(tenant=after.tenant, unknown="")
    if version_id is None:
        earlier = earlier.filter(arrived_at__lt=changed_at)
    else:
        earlier = earlier.filter(arrived_at__lt=after.arrived_at)
    if after.template_version_id is not None:  # Django keeps the rows without a version here
        earlier = earlier.exclude(template_version_id=after.template_version_id)
    before = earlier.select_related("server", "template_version").order_by("-arrived_at").first()
    if before is None:
        return {}
    pair: dict[str, Any] = {
        "before": _key(before),
        "after": _key(after),
        "diverged_at": _departs_at(before, after),
    }
    try:
        compared = create_comparison(
            a=SideInput(record=RecordKey(before.server_id, before.request_id, before.arrived_at)),
            b=SideInput(record=RecordKey(after.server_id, after.request_id, after.arrived_at)),
            now=now,
        )
    except ComparisonError:  # a record gone meanwhile (retention): the pair without its permalink
        return pair
    if compared.saved:
        pair["compare_slug"] = compared.comparison.slug
    return pair


def _after(
    diagnoses: QuerySet[RequestDiagnosis], *, changed_at: datetime, version_id: int | None
) -> RequestDiagnosis | None:
    if version_id is not None:
        on_suspect = diagnoses.filter(template_version_id=version_id)
    else:
        on_suspect = diagnoses.filter(arrived_at__gte=changed_at, cause=RequestDiagnosis.Cause.PROMPT_CHANGED)
    return on_suspect.select_related("server", "template_version").order_by("arrived_at").first()


def _departs_at(before: RequestDiagnosis, after: RequestDiagnosis) -> int | None:
    """The first token where the two prompts differ: from their token ids while both are kept,
    else to block precision from their block hashes (the first block that differs), else where
    the after request departed from its nearest earlier one, as diagnosed."""
    records = {
        (server, request): (tokens, hashes)
        for server, request, tokens, hashes in RequestRecord.objects.filter(
            Q(server_id=before.server_id, request_id=before.request_id, arrived_at=before.arrived_at)
            | Q(server_id=after.server_id, request_id=after.request_id, arrived_at=after.arrived_at)
        ).values_list("server_id", "request_id", "token_ids", "block_hashes")
    }
    first = records.get((before.server_id, before.request_id))
    second = records.get((after.server_id, after.request_id))
    if first is None or second is None:
        return after.diverged_at
    if first[0] is not None and second[0] is not None:
        return _common_prefix(first[0], second[0])
    if first[1] and second[1] and after.server.block_size:
        return shared_leading_blocks(first[1], second[1]) * after.server.block_size
    return after.diverged_at


def _common_prefix(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def _key(diagnosis: RequestDiagnosis) -> dict[str, Any]:
    version = diagnosis.template_version
    return {
        "server": diagnosis.server.name,
        "request_id": diagnosis.request_id,
        "arrived_at": diagnosis.arrived_at.isoformat(),
        "version": version.commit_sha if version else None,
    }


@dataclass(frozen=True, slots=True)
class PairRequest:
    """One request of a regression's before/after pair."""

    server: str
    request_id: str
    arrived_at: datetime
    version: str | None  # its template version's commit sha; None: traffic without one


@dataclass(frozen=True, slots=True)
class EvidencePair:
    """A template regression's before/after pair: where the after one departs, and their Compare."""

    before: PairRequest
    after: PairRequest
    departs_at_token: int | None
    compare_slug: str | None


def evidence_pair(regression: Regression) -> EvidencePair | None:
    """The pair stored with the regression (``evidence["pair"]``), None when it has none. A pair
    stored before versions were kept with it has them looked up (None once its records are gone)."""
    pair = regression.evidence.get("pair") or {}
    if "before" not in pair or "after" not in pair:
        return None
    return EvidencePair(
        before=_pair_request(pair["before"]),
        after=_pair_request(pair["after"]),
        departs_at_token=pair.get("diverged_at"),
        compare_slug=pair.get("compare_slug") or None,
    )


def _pair_request(stored: dict[str, Any]) -> PairRequest:
    arrived_at = datetime.fromisoformat(stored["arrived_at"])
    version = stored.get("version")
    if "version" not in stored:
        version = (
            RequestDiagnosis.objects.filter(
                server__name=stored["server"], request_id=stored["request_id"], arrived_at=arrived_at
            )
            .values_list("template_version__commit_sha", flat=True)
            .first()
        )
    return PairRequest(stored["server"], stored["request_id"], arrived_at, version)


def diff_rows(diff: str) -> list[tuple[DiffLine, str]]:
    """The suspect's diff lines marked (app/domain/difflines.py), each with what the page says of a
    moved line: where its other end is."""
    lines = diff_lines(diff)
    return [(line, _moved_note(i, line)) for i, line in enumerate(lines)]


def _moved_note(index: int, line: DiffLine) -> str:
    if line.partner is None:
        return ""
    where = "above" if line.partner < index else "below"
    return f"moved here from {where}" if line.kind == LineKind.MOVED_TO else f"moved {where}"


def freeze_killers(regression: Regression, *, now: datetime) -> None:
    """Search the regression's own requests since its change (of its server or tenant, for a
    narrower template scope; the killer window back at most) for killers, and copy them into its
    evidence beside those frozen before (the same killer's figures updated, a killer no longer found
    kept): a later search never rewrites this copy once the regression is resolved. At most once
    every PREFIXSCOPE_KILLER_EVERY_SECONDS, as the template's own search runs. Not the template's
    stored killers: searched over the last hour, they hold killers and samples of the traffic before
    the change (an earlier regression's, a previous run's). Keys of sample requests only, as the
    killers keep them: their text is decoded when shown."""
    if regression.template_id is None or not _search_due(regression, now):
        return
    since = max(regression.changed_at, now - timedelta(minutes=settings.PREFIXSCOPE_KILLER_WINDOW_MINUTES))
    Scope = Regression.Scope
    found = killers_between(
        template_id=regression.template_id, since=since, until=now, now=now,
        server_id=regression.server_id if regression.scope == Scope.TEMPLATE_SERVER else None,
        tenant=regression.tenant if regression.scope == Scope.TEMPLATE_TENANT else None,
    )[:FROZEN_KILLERS]  # fmt: skip
    regression.evidence = store_evidence(regression.pk, "killers_searched_at", lambda _: now.isoformat())
    if found:
        fresh = [_frozen(killer) for killer in found]
        regression.evidence = store_evidence(
            regression.pk, "killers", lambda kept: _merged(kept or [], fresh)
        )


def _search_due(regression: Regression, now: datetime) -> bool:
    searched = regression.evidence.get("killers_searched_at")
    every = timedelta(seconds=settings.PREFIXSCOPE_KILLER_EVERY_SECONDS)
    return searched is None or now - datetime.fromisoformat(searched) >= every


FROZEN_KILLERS = 10
_KILLER_FIELDS = (
    "salt_hash", "model", "block_size", "mode", "position_token", "block_index", "kind", "requests",
    "requests_affected", "continuations", "tokens_lost", "straddle_tokens", "samples",
)  # fmt: skip
# A killer found again: the same block of the same compatibility record. Not its token: where the
# requests since the change start to differ moves within the varying value as the window grows (a
# timestamp's minute, then its ten minutes).
_IDENTITY = ("salt_hash", "model", "block_size", "mode", "block_index")


def _frozen(killer: CacheKiller) -> dict[str, Any]:
    found_at = killer.computed_at.isoformat()
    return {field: getattr(killer, field) for field in _KILLER_FIELDS} | {
        "found_at": found_at,
        "seen_at": found_at,
    }


def _merged(kept: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fresh killers over the kept ones, the costliest FROZEN_KILLERS of them. A kept killer
    found again keeps when it was first found, and its class: what varies at one place of the
    suspect's text does not change while the regression lasts, where the requests a later search
    decodes may tell it less well (fewer of them, other versions among them)."""
    by_identity = {_identity(killer): killer for killer in kept}
    for killer in fresh:
        first = by_identity.get(_identity(killer), killer)
        by_identity[_identity(killer)] = killer | {"found_at": first["found_at"], "kind": first["kind"]}
    return sorted(by_identity.values(), key=lambda k: -k["tokens_lost"])[:FROZEN_KILLERS]


def _identity(killer: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(killer[field] for field in _IDENTITY)


@dataclass(frozen=True, slots=True)
class FrozenKiller:
    killer: CacheKiller  # not stored: the template's own rows are replaced by each search
    found_at: datetime  # the search that first found it with the regression


def frozen_killers(regression: Regression) -> list[FrozenKiller]:
    """The killers frozen with the regression, the one nearest the pair's divergence first (it
    names what varies there), then costliest first."""
    if regression.template_id is None:
        return []
    found = [
        FrozenKiller(
            CacheKiller(template_id=regression.template_id, computed_at=datetime.fromisoformat(k["seen_at"]),
                        **{field: k[field] for field in _KILLER_FIELDS}),
            datetime.fromisoformat(k["found_at"]),
        )
        for k in regression.evidence.get("killers", [])
    ]  # fmt: skip
    diverged = regression.evidence.get("pair", {}).get("diverged_at")
    if diverged is not None:
        found.sort(
            key=lambda f: (f.killer.position_token is None, abs((f.killer.position_token or 0) - diverged))
        )
    return found


def store_evidence(regression_id: int, key: str, change: Callable[[Any], Any]) -> dict[str, Any]:
    """Set one key of a regression's evidence to ``change(its value now, or None)``, the row locked
    meanwhile so that writers of other keys (the killers, the webhook's outcome) keep theirs; returns
    the evidence as stored. A regression deleted meanwhile: nothing stored, {} returned."""
    with transaction.atomic():
        row = Regression.objects.select_for_update().filter(pk=regression_id).only("evidence").first()
        if row is None:
            return {}
        stored = {**row.evidence, key: change(row.evidence.get(key))}
        if stored != row.evidence:
            Regression.objects.filter(pk=regression_id).update(evidence=stored)
    return stored
