from datetime import UTC, datetime, timedelta

import pytest

from app.domain.cost import Pricing, Reuse, price_lost_tokens
from app.domain.prefill import PrefillSums

SINCE = datetime(2026, 1, 1, tzinfo=UTC)
PRICING = Pricing(tokens_per_second=10_000, gpu_hour_price=3.6)
LOST = {"prompt_changed": 6000, "evicted": 3000, "cold": 500, "below_block": 200}


@pytest.mark.parametrize(("template_scope", "counted"), [(True, 9000), (False, 3000)])
def test_a_template_counts_its_prompt_changes_other_scopes_do_not(template_scope: bool, counted: int) -> None:
    cost = price_lost_tokens(
        LOST,
        since=SINCE,
        until=SINCE + timedelta(minutes=30),
        prefill=PrefillSums(),
        pricing=PRICING,
        template_scope=template_scope,
    )
    assert cost.lost_tokens == counted
    assert cost.tokens_per_hour == counted * 2  # half an hour: idle minutes of it included
    assert (cost.rate_source, cost.prefill_tokens_per_second) == ("configured", 10_000)
    assert cost.gpu_seconds_per_hour == pytest.approx(counted * 2 / 10_000)
    assert cost.money_per_hour == pytest.approx(cost.gpu_seconds_per_hour / 1000)


def test_the_rate_measured_over_the_window_prices_it() -> None:
    xs = [float(x) for x in range(0, 4000, 100)]  # uncached tokens; TTFT 10 ms + x / 5000 s
    sums = PrefillSums(
        count=len(xs),
        x=sum(xs),
        y=sum(0.01 + x / 5000 for x in xs),
        xx=sum(x * x for x in xs),
        xy=sum(x * (0.01 + x / 5000) for x in xs),
    )
    cost = price_lost_tokens(
        LOST,
        since=SINCE,
        until=SINCE + timedelta(hours=2),
        prefill=sums,
        pricing=PRICING,
        template_scope=True,
    )
    assert cost.rate_source == "measured"
    assert cost.prefill_tokens_per_second == pytest.approx(5000)
    assert cost.gpu_seconds_per_hour == pytest.approx(4500 / 5000)


def test_an_empty_window_costs_nothing() -> None:
    cost = price_lost_tokens(
        LOST, since=SINCE, until=SINCE, prefill=PrefillSums(), pricing=PRICING, template_scope=True
    )
    assert cost.tokens_per_hour == 0.0


@pytest.mark.parametrize(
    ("rate_before", "reused", "over"),
    [(0.8, 4000, 3200), (0.4, 4000, 0), (1.0, 0, 9000)],  # 0.8 x 9000 - 4000; never below 0; at most all
)
def test_a_regression_wins_back_what_its_scope_lost_over_its_rate_before(
    rate_before: float, reused: int, over: int
) -> None:
    cost = price_lost_tokens(
        LOST,
        since=SINCE,
        until=SINCE + timedelta(minutes=30),
        prefill=PrefillSums(),
        pricing=PRICING,
        template_scope=True,
        before=(rate_before, Reuse(prompt_tokens=9000, reused_tokens=reused)),
    )
    assert cost.over_before is not None
    assert (cost.lost_tokens, cost.over_before.tokens) == (9000, over)
    assert cost.over_before.tokens_per_hour == over * 2  # per hour as the scope's figure is
    assert cost.over_before.money_per_hour == pytest.approx(cost.money_per_hour * over / 9000)


def test_outside_a_template_the_rate_before_is_over_the_prompts_its_reuse_could_serve() -> None:
    # A server's rate leaves out the tokens of prompts changing and of tails (6000 + 200 of 9000).
    cost = price_lost_tokens(
        LOST,
        since=SINCE,
        until=SINCE + timedelta(hours=1),
        prefill=PrefillSums(),
        pricing=PRICING,
        template_scope=False,
        before=(0.9, Reuse(prompt_tokens=9000, reused_tokens=1000)),
    )
    assert cost.over_before is not None
    assert cost.over_before.rate == pytest.approx(1000 / 2800)
    assert cost.over_before.tokens == round(0.9 * 2800 - 1000)
