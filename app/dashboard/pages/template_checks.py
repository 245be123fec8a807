"""The template checks on a template's page: per version, what its check (app/prompts/templatecheck,
stored as VersionCheck when the version was imported) predicted, beside what was observed after it
went live (app/diagnosis/observed.py), both in prompt tokens an hour prefilled again; and the chart
that draws the two per version."""

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.core.tenancy import Viewer
from app.diagnosis.observed import Live, Observed, observed_effects
from app.prompts.models import VersionCheck
from app.prompts.selectors import LiveVersion

VERDICTS = {"passed": "passed", "failed": "failed", "error": "could not run"}


def signed_tokens(value: float | None) -> str:
    """Tokens an hour, signed, as the page's other changes are ("-60.0 percentage points"); "—" for
    none."""
    return "—" if value is None else f"{value:+,.0f}"


@dataclass(frozen=True, slots=True)
class CheckRow:
    """A version of the versions table, its check (None: never checked) and its observed effect
    (None: never live, or live in the minute under way)."""

    live: LiveVersion
    check: VersionCheck | None
    observed: Observed | None

    @property
    def verdict(self) -> str:
        return VERDICTS.get(self.check.verdict, self.check.verdict) if self.check else "not checked"

    @property
    def finding(self) -> str:
        """Why: the error of a check that could not run, else its first error's message with its
        line (its first finding's when none is an error); "" when it found nothing."""
        if self.check is None:
            return ""
        if self.check.verdict == VersionCheck.Verdict.ERROR:
            return self.check.error
        found = self.check.findings or []
        first = next((f for f in found if f.get("level") == "error"), found[0] if found else None)
        if first is None:
            return ""
        line = first.get("line")
        return f"line {line}: {first.get('message', '')}" if line else str(first.get("message", ""))

    @property
    def predicted(self) -> float | None:
        return self.check.predicted_tokens_per_hour if self.check else None

    @property
    def observed_tokens(self) -> float | None:
        return self.observed.tokens_per_hour if self.observed else None

    @property
    def difference(self) -> str:
        """Observed minus predicted, with the share of the prediction it is: "+6,000 (+12 %)"."""
        predicted, observed = self.predicted, self.observed_tokens
        if predicted is None or observed is None:
            return "—"
        share = f" ({100 * (observed - predicted) / abs(predicted):+.0f} %)" if predicted else ""
        return signed_tokens(observed - predicted) + share

    @property
    def price(self) -> str:
        """The prediction in money and GPU time: "$1.90/h · 3,200 GPU-s/h"; "not priced" for a check
        made without the template's traffic; "" for no check."""
        if self.check is None:
            return ""
        money, gpu = self.check.predicted_cost_per_hour, self.check.predicted_gpu_seconds_per_hour
        if money is None or gpu is None:
            return "not priced"
        sign = "-" if money < 0 else ""
        return f"{sign}${abs(money):,.2f}/h · {gpu:,.0f} GPU-s/h"

    @property
    def observed_note(self) -> str:
        """Why a version live is not measured ("" for one never live: its row says so already)."""
        live = self.live.live_at is not None
        return "too little traffic" if live and self.observed_tokens is None else ""

    @property
    def shown_predicted(self) -> str:
        return signed_tokens(self.predicted)

    @property
    def shown_observed(self) -> str:
        return signed_tokens(self.observed_tokens)


def check_rows(
    template_id: int, versions: list[LiveVersion], *, now: datetime, viewer: Viewer
) -> list[CheckRow]:
    """The versions table's rows, in `versions`' order: each version's check and observed effect."""
    checks = {c.version_id: c for c in VersionCheck.objects.filter(version__in=[v.version for v in versions])}
    lives = [Live(v.version.pk, v.live_at) for v in versions if v.live_at is not None]
    observed = observed_effects(template_id=template_id, lives=lives, now=now, viewer=viewer)
    return [CheckRow(v, checks.get(v.version.pk), observed.get(v.version.pk)) for v in versions]


@dataclass(frozen=True, slots=True)
class ChecksChart:
    """Predicted and observed tokens an hour per version, oldest left: what static/charts/charts.js
    draws as bars (`kind: "bars"`); its numbers are the versions table's."""

    rows: list[CheckRow]
    slug: str = "checks"

    @property
    def data(self) -> dict[str, Any]:
        drawn = [r for r in reversed(self.rows) if r.predicted is not None or r.observed_tokens is not None]
        return {
            "kind": "bars", "unit": "tokens",
            "categories": [r.live.version.commit_sha[:7] for r in drawn],
            "series": [
                {"name": "predicted", "label": "Predicted by its check",
                 "values": [r.predicted for r in drawn]},
                {"name": "observed", "label": "Observed after it went live",
                 "values": [r.observed_tokens for r in drawn]},
            ] if drawn else [],
        }  # fmt: skip

    @property
    def data_id(self) -> str:
        return f"{self.slug}-data"
