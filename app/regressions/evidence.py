"""A template regression's evidence: a before/after pair of its requests with their Compare permalink
and the first token where the after one departs, the suspect version's diff line by line, and the
cache killers its traffic shows since the change."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.compare.selectors import RecordKey
from app.compare.services import ComparisonError, SideInput, create_comparison
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
    diagnoses = RequestDiagnosis.objects.filter(template_id=template_id).select_related("server")
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
    return {
        "server": diagnosis.server.name,
        "request_id": diagnosis.request_id,
        "arrived_at": diagnosis.arrived_at.isoformat(),
    }


@dataclass(frozen=True, slots=True)
class DiffLine:
    text: str
    kind: str  # "added", "removed", "hunk" or "" (context)


def diff_lines(diff: str) -> list[DiffLine]:
    """A unified diff's lines, marked: what the commit added, removed, and the hunks' heads."""
    marked = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            kind = "file"
        elif line.startswith("+"):
            kind = "added"
        elif line.startswith("-"):
            kind = "removed"
        elif line.startswith("@@"):
            kind = "hunk"
        else:
            kind = ""
        marked.append(DiffLine(line, kind))
    return marked


def killers_since(regression: Regression) -> list[CacheKiller]:
    """The template's cache killers found in traffic since the change, most tokens lost first; the
    one nearest the pair's divergence first of all (it names what varies there)."""
    if regression.template_id is None:
        return []
    found = list(
        CacheKiller.objects.filter(
            template_id=regression.template_id, window_end__gt=regression.changed_at
        ).order_by("-tokens_lost")[:10]
    )
    diverged = regression.evidence.get("pair", {}).get("diverged_at")
    if diverged is not None:
        found.sort(key=lambda k: (k.position_token is None, abs((k.position_token or 0) - diverged)))
    return found
