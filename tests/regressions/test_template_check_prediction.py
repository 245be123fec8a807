"""The template check's price of a fault commit, made with the traffic before it shipped, against what
the regression it caused measured after (issue 25: within 25 %), on the demo scenario run virtually
(tests/support/virtual_fleet.py: the same prompts, routing, caches and pipeline as `make run`)."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.diagnosis.template_traffic import TrafficWindow, check_traffic
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
    """The template's traffic over the scenario's whole minutes before `until` (the last minute its
    reuse now), as the server reports it before the commit ships."""
    end = run.at(until).replace(second=0, microsecond=0)
    window = TrafficWindow(run.at(0), end, end - timedelta(minutes=1))
    return check_traffic([Template.objects.get(name=name)], window=window)[name]


def predicted_and_measured(tmp_path: Path, template: str, at: float) -> tuple[float, float]:
    """The check's price of the scenario's commit of `template` at virtual second `at`, with the
    traffic before it, and the lost tokens an hour its regression measured after it."""
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
    return result.predicted.tokens_per_hour, regression.lost_tokens_per_hour


def test_volatile_tops_price_is_within_a_quarter_of_what_its_regression_measured(tmp_path: Path) -> None:
    predicted, measured = predicted_and_measured(tmp_path, "support", 300)

    assert abs(predicted - measured) <= 0.25 * measured, (
        f"predicted {predicted:,.0f}, measured {measured:,.0f}"
    )


def test_unsorted_tools_price_is_an_upper_bound_of_what_its_regression_measured(tmp_path: Path) -> None:
    """The price counts every token after the departure as lost; with five tools in a random order,
    later requests often repeat the first tools of an earlier one, and the caches reuse those blocks
    (a replay of the traffic would count them: issue 26). Measured: 199,760 predicted against
    145,357 (+37 %), the miss listed in issue 25's note."""
    predicted, measured = predicted_and_measured(tmp_path, "agent", 780)

    assert measured <= predicted <= 1.5 * measured, f"predicted {predicted:,.0f}, measured {measured:,.0f}"
