"""The traffic families of Prefixscope's /metrics: delivered reuse and lost tokens by cause, TTFT
histograms and cache killers, read from the hour rollups (never raw rows), one query a table.

Counters count since midnight UTC: they start again at zero each day, which rate() and increase()
take as a counter reset, so that a day's sum stays a bounded read of at most 24 hours of rollups.
Every label is bounded (app/domain/toplabels.py): the top PREFIXSCOPE_METRICS_TOP_N by prompt tokens.
"""

from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Max, Q, Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.domain.toplabels import bounded, summed, top_values
from app.prompts.models import CacheKiller, Template, VersionCheck
from app.regressions.owners import template_owner
from app.traffic.models import LossMinute, LossTotals, RequestDiagnosis, TenantSalt

NONE = "none"  # a request without a template, or without a tenant
CAUSES = [cause.value for cause in RequestDiagnosis.Cause]
# The dimensions of the token families: labels, and the metric name's middle word.
DIMENSIONS: dict[str, tuple[str, ...]] = {
    "template": ("template",),
    "template_version": ("template", "version"),
    "server": ("server", "model"),
    "tenant": ("tenant",),
}
_SUMMED = [
    "requests",
    "gateway_cache_hits",
    "diagnosed_prompt_tokens",
    "seen_before_tokens",
    "reused_tokens",
] + [f"{cause}_tokens" for cause in CAUSES]
assert all(hasattr(LossTotals, column) for column in _SUMMED)

_LOSS_SQL = f"""
SELECT s.name, s.model, coalesce(t.name, ''), coalesce(left(v.commit_sha, 12), ''), l.tenant,
       {", ".join(f"sum(l.{column})" for column in _SUMMED)}
FROM traffic_losshour l
JOIN fleet_server s ON s.id = l.server_id
LEFT JOIN prompts_template t ON t.id = l.template_id
LEFT JOIN prompts_templateversion v ON v.id = l.template_version_id
WHERE l.hour >= %(since)s AND l.hour < %(until)s
GROUP BY 1, 2, 3, 4, 5
"""
# The baseline the hit-rate alerts compare the last half hour with: the six whole hours before the
# hour of 30 minutes ago, from the hour rollups, which a Prometheus started a minute ago cannot have.
BASELINE_HOURS = 6
BASELINE_LEFT_OUT = timedelta(minutes=30)
# A version predicted to break the cache is live when a request named it this recently.
LIVE_WINDOW = timedelta(minutes=30)


def _summed_buckets(column: str) -> str:
    """A cumulative TTFT histogram column (the bounds and the total) summed position by position."""
    positions = range(1, len(TTFT_BUCKETS_SECONDS) + 2)
    return "ARRAY[" + ", ".join(f"coalesce(sum(h.{column}[{i}]), 0)" for i in positions) + "]"


_BUCKET_SUMS = f"{_summed_buckets('client_ttft_buckets')}, {_summed_buckets('server_ttft_buckets')}"
_TTFT_SQL = f"""
SELECT coalesce(t.name, ''), sum(h.client_ttft_sum_seconds), sum(h.server_ttft_sum_seconds), {_BUCKET_SUMS}
FROM traffic_hourrollup h LEFT JOIN prompts_template t ON t.id = h.template_id
WHERE h.hour >= %(since)s AND cardinality(h.client_ttft_buckets) > 0
GROUP BY 1
"""


def start_of_day(now: datetime) -> datetime:
    return datetime.combine(now.astimezone(UTC).date(), time(), tzinfo=UTC)


def _rows(sql: str, since: datetime, until: datetime | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, {"since": since, "until": until or datetime.max.replace(tzinfo=UTC)})
        rows: list[tuple[Any, ...]] = cursor.fetchall()
    return rows


Labelled = list[tuple[dict[str, str], dict[str, float]]]


def _loss_rows(since: datetime, until: datetime | None = None) -> Labelled:
    return [
        ({"server": r[0], "model": r[1] or NONE, "template": r[2] or NONE, "version": r[3] or NONE,
          "tenant": r[4] or NONE}, dict(zip(_SUMMED, map(float, r[5:]), strict=True)))
        for r in _rows(_LOSS_SQL, since, until)
    ]  # fmt: skip


def token_families(now: datetime) -> Iterator[Metric]:
    """Requests, prompt tokens, shared-prefix tokens, reused tokens and lost tokens by cause, per
    dimension: the delivered hit ratio is rate(reused) / rate(prompt). Then each template's owner
    and the templates' and tenants' baselines, under the same bounded labels."""
    rows = _loss_rows(start_of_day(now))
    top_n = settings.PREFIXSCOPE_METRICS_TOP_N
    kept = {
        label: top_values(((labels[label], v["diagnosed_prompt_tokens"]) for labels, v in rows), top_n)
        for label in ("template", "version", "server", "tenant")
    }
    kept["model"] = frozenset(labels["model"] for labels, _ in rows)  # models are few: never folded
    for dimension, names in DIMENSIONS.items():
        totals = summed(
            (tuple(bounded(labels[name], kept[name]) for name in names), values) for labels, values in rows
        )
        yield from _dimension_families(dimension, list(names), totals)
    yield _template_owners(kept["template"])
    yield _predicted_breaks(now, kept["template"])
    yield _tenant_salts()
    yield from _baseline_families(now, kept)


def _template_owners(kept: frozenset[str]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(
        "prefixscope_template_owner_info",
        "1 per template, labelled with the owner its alerts are routed to (its repository).",
        labels=["template", "owner_kind", "owner"],
    )
    for template in Template.objects.filter(name__in=kept).select_related("repository"):
        owner = template_owner(template)
        family.add_metric([template.name, owner.kind, owner.name], 1.0)
    return family


def _predicted_breaks(now: datetime, kept: frozenset[str]) -> GaugeMetricFamily:
    """Per template, its versions whose check (made at import) predicts fewer reusable blocks and
    that requests named within LIVE_WINDOW: first seen then, or diagnosed then (the loss minutes).
    Templates past the top N are summed under `other`; a template with none has no sample."""
    family = GaugeMetricFamily(
        "prefixscope_template_versions_predicted_to_break",
        "Versions of the template whose template check predicted fewer reusable prefix blocks and that "
        f"received requests in the last {LIVE_WINDOW.seconds // 60} minutes.",
        labels=["template"],
    )
    since = now - LIVE_WINDOW
    diagnosed = LossMinute.objects.filter(minute__gte=since, requests__gt=0).values("template_version_id")
    live = VersionCheck.objects.filter(head_blocks__lt=F("base_blocks")).filter(
        Q(version__first_seen_at__gte=since) | Q(version_id__in=diagnosed)
    )
    counts: dict[str, float] = {}
    for name in live.values_list("version__template__name", flat=True):
        label = bounded(name, kept)
        counts[label] = counts.get(label, 0.0) + 1.0
    for label, count in sorted(counts.items()):
        family.add_metric([label], count)
    return family


def _tenant_salts() -> CounterMetricFamily:
    """Per tenant, the salts it sent; for the top N tenants by their latest request, so that a tenant
    that just rotated (a salt seen now) is always among them."""
    family = CounterMetricFamily(
        "prefixscope_tenant_salts",
        "Cache salts (unsalted counts as one) the tenant's requests carried since it was first seen: "
        "a rise is a salt rotation.",
        labels=["tenant"],
    )
    found = (
        TenantSalt.objects.values("tenant")
        .annotate(n=Count("id"), last=Max("last_seen_at"))
        .order_by("-last")[: settings.PREFIXSCOPE_METRICS_TOP_N]
    )
    for row in found:
        family.add_metric([row["tenant"]], float(row["n"]))
    return family


def _baseline_families(now: datetime, kept: dict[str, frozenset[str]]) -> Iterator[GaugeMetricFamily]:
    """Per template and tenant: the delivered hit ratio of the baseline hours and the prompt tokens
    it rests on (a rule asks for enough of them before it compares: no history, no alert)."""
    until = (now - BASELINE_LEFT_OUT).replace(minute=0, second=0, microsecond=0)
    rows = _loss_rows(until - timedelta(hours=BASELINE_HOURS), until)
    for dimension in ("template", "tenant"):
        ratio = GaugeMetricFamily(
            f"prefixscope_{dimension}_baseline_hit_ratio",
            f"Delivered hit ratio of the {BASELINE_HOURS} whole hours before the hour of 30 minutes ago.",
            labels=[dimension],
        )
        volume = GaugeMetricFamily(
            f"prefixscope_{dimension}_baseline_prompt_tokens",
            "Diagnosed prompt tokens of the baseline hours: the history the baseline rests on.",
            labels=[dimension],
        )
        totals = summed(((labels[dimension],), values) for labels, values in rows)
        for (name,), values in totals.items():
            prompt = values["diagnosed_prompt_tokens"]
            if name in kept[dimension] and name != NONE and prompt > 0:
                ratio.add_metric([name], values["reused_tokens"] / prompt)
                volume.add_metric([name], prompt)
        yield from (ratio, volume)


def _dimension_families(
    dimension: str, names: list[str], totals: dict[tuple[str, ...], dict[str, float]]
) -> Iterator[CounterMetricFamily]:
    prefix = f"prefixscope_{dimension}"
    plain = {
        "requests": ("requests", "Requests diagnosed or not, since midnight UTC."),
        "prompt_tokens": ("diagnosed_prompt_tokens", "Prompt tokens of diagnosed requests, since midnight."),
        "shared_prefix_tokens": (
            "seen_before_tokens", "Leading prompt tokens seen before under the same salt (reusable).",
        ),
        "reused_tokens": (
            "reused_tokens",
            "Prompt tokens the engine delivered from its prefix cache (a hosted API: its cache read "
            "tokens). Hit rate = reused / prompt tokens; for a hosted API: cache read / input tokens.",
        ),
        "gateway_cache_answers": (
            "gateway_cache_hits", "Requests a gateway answered from its semantic cache: never prefix reuse.",
        ),
    }  # fmt: skip
    for suffix, (column, help_text) in plain.items():
        family = CounterMetricFamily(f"{prefix}_{suffix}", help_text, labels=names)
        for key, values in totals.items():
            family.add_metric(list(key), values[column])
        yield family
    lost = CounterMetricFamily(
        f"{prefix}_lost_tokens",
        "Prompt tokens not reused, by cause, since midnight UTC; new_content, below_block and "
        "below_minimum were never reusable (not losses).",
        labels=[*names, "cause"],
    )  # fmt: skip
    for key, values in totals.items():
        for cause in CAUSES:
            lost.add_metric([*key, cause], values[f"{cause}_tokens"])
    yield lost


def ttft_families(now: datetime) -> Iterator[HistogramMetricFamily]:
    """Time to first token per template, as the clients saw it and as vLLM measured it."""
    rows = _rows(_TTFT_SQL, start_of_day(now))
    kept = top_values(((r[0] or NONE, float(r[3][-1])) for r in rows), settings.PREFIXSCOPE_METRICS_TOP_N)
    for index, measured_by in enumerate(("client", "server")):
        family = HistogramMetricFamily(
            f"prefixscope_template_ttft_{measured_by}_seconds",
            f"Time to first token per template as the {measured_by} measured it, since midnight UTC.",
            labels=["template"],
        )
        folded = summed(
            (bounded(r[0] or NONE, kept), {"sum": float(r[1 + index] or 0), **_buckets(r[3 + index])})
            for r in rows
        )
        for template, values in folded.items():
            buckets = [(repr(bound), values[repr(bound)]) for bound in TTFT_BUCKETS_SECONDS]
            family.add_metric([template], [*buckets, ("+Inf", values["+Inf"])], sum_value=values["sum"])
        yield family


def _buckets(cumulative: Sequence[int]) -> dict[str, float]:
    bounds = [repr(bound) for bound in TTFT_BUCKETS_SECONDS] + ["+Inf"]
    return {bound: float(count) for bound, count in zip(bounds, cumulative, strict=True)}


def killer_families() -> Iterator[GaugeMetricFamily]:
    """The cache killers found in each template's recent traffic: one sample per killer (its
    template, kind and block), the tokens it costs; templates past the top N are left out."""
    found = (
        CacheKiller.objects.values("template__name", "kind", "block_index")
        .annotate(tokens=Sum("tokens_lost"), requests=Sum("requests_affected"), n=Count("id"))
        .order_by()
    )
    rows = list(found)
    kept = top_values(
        ((r["template__name"], float(r["tokens"])) for r in rows), settings.PREFIXSCOPE_METRICS_TOP_N
    )
    lost = GaugeMetricFamily(
        "prefixscope_cache_killer_lost_tokens",
        "Prompt tokens a stable text at the killer's position would have reused, in its window.",
        labels=["template", "kind", "block"],
    )
    count = GaugeMetricFamily(
        "prefixscope_cache_killers", "Cache killers found per template and kind.", labels=["template", "kind"]
    )
    per_kind = summed(((bounded(r["template__name"], kept), r["kind"]), {"n": float(r["n"])}) for r in rows)
    for r in rows:
        if r["template__name"] in kept:
            lost.add_metric([r["template__name"], r["kind"], str(r["block_index"])], float(r["tokens"]))
    for (template, kind), values in per_kind.items():
        count.add_metric([template, kind], values["n"])
    yield lost
    yield count
