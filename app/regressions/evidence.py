"""A template regression's evidence: a before/after pair of its requests with their Compare permalink
and the first token where the after one departs, the suspect version's diff line by line (moved lines
told apart), and the cache killers its traffic showed since the change, frozen onto the regression
(``evidence["killers"]``) while it is open."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import transaction

from app.compare.selectors import RecordKey
from app.compare.services import ComparisonError, SideInput, create_comparison
from app.domain.difflines import DiffLine, LineKind, diff_lines
from app.prompts.models import CacheKiller
from app.regressions.models import Regression
from app.traffic.models import RequestDiagnosis


def before_after_pair(
    template_id: int, *, changed_at: datetime, now: datetime, version_id: int | None = None
) -> dict[str, Any]:
    """The first request after the change that lost tokens to the prompt changing (of `version_id`,
    the suspect, when given: the change's minute may still hold requests of the version before),
    and the last one of the same template and tenant before the change, compared (a permalink saved
    by Compare)."""
    diagnoses = RequestDiagnosis.objects.filter(template_id=template_id).select_related(
        "server", "template_version"
    )
    changed = diagnoses.filter(arrived_at__gte=changed_at, cause=RequestDiagnosis.Cause.PROMPT_CHANGED)
    if version_id is not None:
        changed = changed.filter(template_version_id=version_id)
    after = changed.order_by("arrived_at").first()
    if after is None:
        return {}
    before = (
        diagnoses.filter(arrived_at__lt=changed_at, tenant=after.tenant, unknown="")
        .order_by("-arrived_at")
        .first()
    )
    if before is None:
        return {}
    pair: dict[str, Any] = {"before": _key(before), "after": _key(after), "diverged_at": after.diverged_at}
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


def freeze_killers(regression: Regression) -> None:
    """Copy the template's killers found since the change into the regression's evidence, beside
    those frozen before (the same killer's figures updated, a killer no longer found kept): later
    searches replace the template's killers, never this copy once the regression is resolved.
    Keys of sample requests only, as the killers keep them: their text is decoded when shown."""
    if regression.template_id is None:
        return
    found = CacheKiller.objects.filter(
        template_id=regression.template_id, window_end__gt=regression.changed_at
    ).order_by("-tokens_lost")[:FROZEN_KILLERS]
    if found:
        fresh = [_frozen(killer) for killer in found]
        regression.evidence = store_evidence(
            regression.pk, "killers", lambda kept: _merged(kept or [], fresh)
        )


FROZEN_KILLERS = 10
_KILLER_FIELDS = (
    "salt_hash", "model", "block_size", "mode", "position_token", "block_index", "kind", "requests",
    "requests_affected", "continuations", "tokens_lost", "straddle_tokens", "samples",
)  # fmt: skip
_IDENTITY = ("salt_hash", "model", "block_size", "mode", "position_token", "block_index")


def _frozen(killer: CacheKiller) -> dict[str, Any]:
    found_at = killer.computed_at.isoformat()
    return {field: getattr(killer, field) for field in _KILLER_FIELDS} | {
        "found_at": found_at,
        "seen_at": found_at,
    }


def _merged(kept: list[dict[str, Any]], fresh: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The fresh killers over the kept ones (a kept killer found again keeps when it was first
    found), the costliest FROZEN_KILLERS of them."""
    by_identity = {_identity(killer): killer for killer in kept}
    for killer in fresh:
        first = by_identity.get(_identity(killer), killer)["found_at"]
        by_identity[_identity(killer)] = killer | {"found_at": first}
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
