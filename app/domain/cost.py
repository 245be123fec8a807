"""One cost model for the whole product: prompt tokens a scope lost to misses a cache could have
served, per hour of a window, prefilled at the rate measured over the same window (app/domain/prefill.py),
in GPU-seconds and money.

Every figure is of one scope (the fleet, a server, a template, a tenant, a template on a server or
for a tenant) and one window: the same scope and window give the same figure wherever it is shown.
Per hour means the tokens lost in the window over the window's length, idle minutes included: what
the window cost, not what a busy minute of it would cost an hour.

A regression's headline is a part of its scope's figure over the window since its change: the lost
tokens over what the scope lost at its hit rate before the change (`OverBefore`), what reverting or
fixing the change wins back; the rest it lost before the change too. Both come from the same sums
over the same window, per hour alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from app.domain.misses import NOT_LOSSES
from app.domain.prefill import PrefillSums, prefill_tokens_per_second

# No cache could have served them (never seen, or never reusable: app/domain/misses.py): never counted.
NEVER_SERVABLE = ("cold", *sorted(NOT_LOSSES))
TEMPLATE_ONLY = ("prompt_changed",)  # a template's own: counted in a template's scopes alone
COUNTS = {
    True: "prompt tokens its requests lost to every miss a cache could have served "
    "(all causes but cold and what is never reusable: new content, shorter than one block or the "
    "provider's minimum)",
    False: "prompt tokens its requests lost to every miss a cache could have served, but to a prompt "
    "changing, its templates' (all causes but cold, what is never reusable and prompt changed)",
}


@dataclass(frozen=True, slots=True)
class Pricing:
    """The configured figures: a prefill rate where the window measures none, and a GPU-hour's price."""

    tokens_per_second: float
    gpu_hour_price: float


@dataclass(frozen=True, slots=True)
class Reuse:
    """A scope's hit-rate sums over a window: its diagnosed prompt tokens and those reused."""

    prompt_tokens: int
    reused_tokens: int


@dataclass(frozen=True, slots=True)
class OverBefore:
    """Of a window's counted lost tokens, those over what its scope lost at its rate before a change:
    (rate before - the window's rate) x the window's prompt tokens, per hour of the window."""

    rate_before: float
    rate: float  # the window's: reused over prompt tokens, as the rate before was measured
    tokens: int
    tokens_per_hour: float
    gpu_seconds_per_hour: float
    money_per_hour: float


@dataclass(frozen=True, slots=True)
class Cost:
    """What a scope's lost reuse cost over a window, and what it counts (`counts`, in words)."""

    since: datetime
    until: datetime
    counts: str
    lost_tokens: int
    tokens_per_hour: float
    prefill_tokens_per_second: float
    rate_source: str  # "measured" (its requests' TTFT over uncached tokens) or "configured"
    gpu_seconds_per_hour: float
    money_per_hour: float
    gpu_hour_price: float
    over_before: OverBefore | None = None  # when priced against a rate before (a regression's)


def prefill_price(
    tokens_per_hour: float, *, tokens_per_second: float, gpu_hour_price: float
) -> tuple[float, float]:
    """GPU-seconds and money an hour to prefill ``tokens_per_hour`` at ``tokens_per_second``: the
    conversion every figure of the product uses (a lost token and a predicted one alike)."""
    gpu_seconds = tokens_per_hour / tokens_per_second
    return gpu_seconds, gpu_seconds / 3600 * gpu_hour_price


@dataclass(frozen=True, slots=True)
class PrefillRate:
    """The prefill rate a scope is priced at, and where it comes from."""

    tokens_per_second: float
    source: str  # "measured" (its requests' TTFT over uncached tokens) or "configured"


def prefill_rate(prefill: PrefillSums, pricing: Pricing) -> PrefillRate:
    """The rate `prefill` measures (app/domain/prefill.py), else the configured one."""
    measured = prefill_tokens_per_second(prefill)
    if measured is None:
        return PrefillRate(pricing.tokens_per_second, "configured")
    return PrefillRate(measured, "measured")


def counted_tokens(lost: Mapping[str, int], *, template_scope: bool) -> int:
    """The lost tokens (per cause) the model counts: every cause but those no cache could have
    served, and, outside a template's scopes, but a prompt changing (its template's cost)."""
    left_out = NEVER_SERVABLE if template_scope else NEVER_SERVABLE + TEMPLATE_ONLY
    return sum(tokens for cause, tokens in lost.items() if cause not in left_out)


def price_lost_tokens(
    lost: Mapping[str, int],
    *,
    since: datetime,
    until: datetime,
    prefill: PrefillSums,
    pricing: Pricing,
    template_scope: bool,
    before: tuple[float, Reuse] | None = None,
) -> Cost:
    """The cost of a scope's lost tokens per cause (`lost`) over [since, until): the counted tokens
    an hour of the window (0 for an empty window); GPU-seconds at the prefill rate `prefill`
    measures, else the configured one; money at the configured GPU-hour price. With `before` (a
    rate before a change, and the window's Reuse), also the part of them over that rate."""
    tokens = counted_tokens(lost, template_scope=template_scope)
    hours = (until - since) / timedelta(hours=1)
    per_hour = tokens / hours if hours > 0 else 0.0
    priced = prefill_rate(prefill, pricing)
    rate = priced.tokens_per_second
    gpu, money = prefill_price(per_hour, tokens_per_second=rate, gpu_hour_price=pricing.gpu_hour_price)
    over = None
    if before is not None:
        excess = over_rate_before(lost, before[1], rate_before=before[0], template_scope=template_scope)
        over_hour = excess / hours if hours > 0 else 0.0
        over = OverBefore(
            before[0], window_rate(lost, before[1], template_scope=template_scope), excess, over_hour,
            *prefill_price(over_hour, tokens_per_second=rate, gpu_hour_price=pricing.gpu_hour_price),
        )  # fmt: skip
    return Cost(
        since=since,
        until=until,
        counts=COUNTS[template_scope],
        lost_tokens=tokens,
        tokens_per_hour=per_hour,
        prefill_tokens_per_second=rate,
        rate_source=priced.source,
        gpu_seconds_per_hour=gpu,
        money_per_hour=money,
        gpu_hour_price=pricing.gpu_hour_price,
        over_before=over,
    )


def _reusable_prompt(lost: Mapping[str, int], reuse: Reuse, *, template_scope: bool) -> int:
    """The prompt tokens a scope's hit rate is measured over: a template's all its diagnosed ones;
    other scopes' without those no reuse of theirs could serve (app/regressions/series.py)."""
    left_out = 0 if template_scope else sum(lost.get(cause, 0) for cause in ("prompt_changed", *NOT_LOSSES))
    return max(reuse.prompt_tokens - left_out, 0)


def window_rate(lost: Mapping[str, int], reuse: Reuse, *, template_scope: bool) -> float:
    """The scope's hit rate over the window, as its regressions measure one (0 without traffic)."""
    prompt = _reusable_prompt(lost, reuse, template_scope=template_scope)
    return min(reuse.reused_tokens, prompt) / prompt if prompt else 0.0


def over_rate_before(
    lost: Mapping[str, int], reuse: Reuse, *, rate_before: float, template_scope: bool
) -> int:
    """Of the counted lost tokens (counted_tokens), those over what the scope would have lost at
    `rate_before`: rate_before x its prompt tokens - the tokens it reused, at least 0, at most all
    those counted (a drop cannot win back more than was lost)."""
    prompt = _reusable_prompt(lost, reuse, template_scope=template_scope)
    excess = rate_before * prompt - min(reuse.reused_tokens, prompt)
    return round(min(max(excess, 0.0), counted_tokens(lost, template_scope=template_scope)))
