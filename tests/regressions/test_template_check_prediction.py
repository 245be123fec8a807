"""The template check's price of a fault commit, made with the traffic before it shipped, against what
the regression it caused measured after (issue 25: within 25 %), on the demo scenario run virtually
(tests/support/virtual_fleet.py: the same prompts, routing, caches and pipeline as `make run`)."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.diagnosis.template_traffic import TrafficWindow, template_traffic
from app.domain.templatecheck.price import Traffic
from app.prompts.models import Template
from app.prompts.templatecheck.run import CheckRequest, run_check
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from simulator.scenario import resolve_scenario
from tests.support.virtual_fleet import VirtualRun, run_virtually

pytestmark = pytest.mark.django_db(transaction=True)
LEAD = 300  # virtual seconds of traffic before the first fault: the window the check prices with


def demo() -> dict[str, Any]:
    with resolve_scenario("demo").open() as file:
        found: dict[str, Any] = yaml.safe_load(file)
    return found


def traffic_before(run: VirtualRun, name: str, until: float) -> Traffic:
    """The template's traffic over the scenario's seconds before `until`, as the server reports it."""
    window = TrafficWindow(run.at(0), run.at(until), run.at(until - 60))
    [row] = template_traffic([Template.objects.get(name=name)], window=window)
    return Traffic(row.name, row.requests, row.requests_per_hour, row.reused_tokens_per_request,
                   row.prompt_tokens_per_request, row.block_size, row.prefill_tokens_per_second,
                   row.prefill_rate_source, 2.0, window.hours)  # fmt: skip


@pytest.fixture(scope="module")
def measured() -> dict[str, tuple[float, float]]:
    return {}


@pytest.mark.parametrize(("template", "at"), [("support", 300), ("agent", 780)])
def test_the_checks_price_of_a_fault_is_within_a_quarter_of_what_its_regression_measured(
    tmp_path: Path, template: str, at: float
) -> None:
    run = run_virtually(demo(), tmp_path, every_minute=lambda now: detect_regressions(now=now))
    [regression] = Regression.objects.filter(scope=Regression.Scope.TEMPLATE, template__name=template)
    index = next(i for i, c in enumerate(run.commits) if c.template == template and c.time == at)
    before = traffic_before(run, template, at)
    request = CheckRequest(
        str(tmp_path / "templates"), run.commits[index - 1].sha, run.commits[index].sha, run.at(at),
        traffic=lambda names: {template: before},
    )  # fmt: skip

    [result] = [r for r in run_check(request, cache=tmp_path / "cache").results if r.name == template]

    assert result.predicted is not None and regression.lost_tokens_per_hour is not None
    predicted, lost = result.predicted.tokens_per_hour, regression.lost_tokens_per_hour
    print(f"{template}: predicted {predicted:,.0f} tokens/h before the commit, measured {lost:,.0f} after")
    assert abs(predicted - lost) <= 0.25 * lost
