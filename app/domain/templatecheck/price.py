"""A template change priced with the template's live traffic: the prompt tokens an hour its requests
would reuse less (or more) after the commit, in GPU-seconds and money at the measured prefill rate,
through the product's one conversion (app/domain/cost.py).

The model: a request reuses ``reused`` tokens now, of a stable prefix of ``B`` reusable tokens, so
it reaches the share ``f = min(reused, B) / B`` of it (eviction and routing take the rest). After a
commit that leaves ``H`` reusable tokens, a shrinking prefix keeps ``f x H`` (what came after the
departure is gone, repeats of a whole prompt included), a growing one adds ``f x (H - B)``, and an
edit that keeps the length costs one refill and nothing an hour.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.domain.cost import prefill_price
from app.domain.templatecheck.change import Change


@dataclass(frozen=True, slots=True)
class Traffic:
    """A template's traffic as the server reports it (GET /api/v1/templates/traffic)."""

    name: str
    requests: int
    requests_per_hour: float
    reused_tokens_per_request: float
    prompt_tokens_per_request: float
    block_size: int | None
    prefill_tokens_per_second: float
    prefill_rate_source: str
    gpu_hour_price: float
    window_hours: float


@dataclass(frozen=True, slots=True)
class Predicted:
    """A change's price: reused tokens per request before and after, and the prompt tokens an hour
    prefilled again (negative: saved), in GPU-seconds and money."""

    requests_per_hour: float
    reused_before: float
    reused_after: float
    tokens_per_hour: float
    gpu_seconds_per_hour: float
    money_per_hour: float
    prefill_tokens_per_second: float
    prefill_rate_source: str
    window_hours: float


def predict(traffic: Traffic, change: Change, *, block_size: int) -> Predicted:
    """The change's price at the traffic's rate (the model in the module's docstring)."""
    before = traffic.reused_tokens_per_request
    base, head = change.base_blocks * block_size, change.head_blocks * block_size
    reach = min(before, base) / base if base else 1.0
    if head < base:
        after = reach * head
    elif head > base:
        after = before + reach * (head - base)
    else:
        after = before
    per_hour = (before - after) * traffic.requests_per_hour
    gpu, money = prefill_price(
        per_hour, tokens_per_second=traffic.prefill_tokens_per_second, gpu_hour_price=traffic.gpu_hour_price
    )
    return Predicted(
        traffic.requests_per_hour, before, after, per_hour, gpu, money,
        traffic.prefill_tokens_per_second, traffic.prefill_rate_source, traffic.window_hours,
    )  # fmt: skip
