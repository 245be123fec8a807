"""Regressions found in the demo scenario's traffic, stored and diagnosed as a deployment does it
(tests/support/virtual_fleet.py), against what the scenario injected and when."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.core.management import call_command

from app.prompts.models import TemplateVersion
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from simulator.scenario import resolve_scenario
from tests.support.virtual_fleet import VirtualRun, run_virtually

pytestmark = pytest.mark.django_db(transaction=True)

Kind, Scope = Regression.Kind, Regression.Scope


def demo(**changes: Any) -> dict[str, Any]:
    with resolve_scenario("demo").open() as file:
        found: dict[str, Any] = yaml.safe_load(file)
    return found | changes


def detected(definition: dict[str, Any], tmp_path: Path, **options: Any) -> VirtualRun:
    return run_virtually(
        definition, tmp_path, every_minute=lambda now: detect_regressions(now=now), **options
    )


def fault_commit(run: VirtualRun, template: str, at: float) -> str:
    """The sha of the template's commit at virtual second `at` (the scenario's change)."""
    return next(c.sha for c in run.commits if c.template == template and abs(c.time - at) < 1)


def opened(scope: str, **fields: Any) -> list[Regression]:
    return list(Regression.objects.filter(scope=scope, **fields))


def test_the_demo_opens_a_regression_per_fault_each_with_its_cause(tmp_path: Path) -> None:
    run = detected(demo(), tmp_path)

    support = opened(Scope.TEMPLATE, template__name="support")
    assert len(support) == 1
    assert support[0].kind == Kind.TEMPLATE_COMMIT
    assert support[0].suspect_version == TemplateVersion.objects.get(
        commit_sha=fault_commit(run, "support", 300)
    )
    assert abs(support[0].changed_at - run.at(300)) <= timedelta(minutes=1)
    assert (
        support[0].cause_shift["after"]["prompt_changed"]
        > 0.5
        > support[0].cause_shift["before"].get("prompt_changed", 0)
    )
    assert support[0].rate_before > 0.5 > support[0].rate_after
    assert support[0].lost_tokens_per_hour > 0 and support[0].prefill_rate_source == "measured"

    agent = opened(Scope.TEMPLATE, template__name="agent")
    assert [r.suspect_version.commit_sha for r in agent if r.suspect_version] == [
        fault_commit(run, "agent", 780)
    ]
    assert not opened(Scope.TEMPLATE, template__name="billing")  # its edit kept the stable part

    # The salt rotation costs each prefix one miss under the new salt: too brief to open anything,
    # and never a template's regression; were it longer, its tenant's, expected.
    assert all((r.kind, r.expected) == (Kind.SALT_ROTATION, True) for r in opened(Scope.TENANT))

    cut = opened(Scope.SERVER, server__name="virtual-3")
    assert [r.kind for r in cut] == [Kind.CAPACITY]
    assert abs(cut[0].changed_at - run.at(960)) <= timedelta(minutes=1)

    restarted = opened(Scope.SERVER, server__name="virtual-1")
    assert all(r.kind == Kind.RESTART and r.expected for r in restarted)
    assert not opened(Scope.FLEET)
    # Each template commit is its template's, not its servers' or tenants' too; the slower prefills
    # of each fault are its hit rate's regression, not a TTFT one.
    assert not opened(Scope.TEMPLATE_SERVER) and not opened(Scope.TEMPLATE_TENANT)
    assert not Regression.objects.filter(metric=Regression.Metric.TTFT).exists()
    assert not Regression.objects.filter(kind=Kind.ROUTING).exists()  # the router did not change


def test_fault_free_traffic_opens_none(tmp_path: Path) -> None:
    detected(demo(timeline=[]), tmp_path)
    assert not Regression.objects.exists()


def test_a_backfill_over_history_finds_what_online_detection_found(tmp_path: Path) -> None:
    run = detected(demo(duration=720, timeline=demo()["timeline"][:3]), tmp_path)
    identity = ("scope", "template_id", "server_id", "tenant", "metric", "changed_at")
    online = sorted(Regression.objects.values_list(*identity))
    lifecycle = sorted(Regression.objects.values_list(*identity, "state", "resolution"))
    assert online  # volatile_top and the salt rotation

    Regression.objects.all().delete()
    call_command("detect_regressions", since=run.start.isoformat())
    call_command("detect_regressions", since=run.start.isoformat())  # a rerun opens none twice

    assert sorted(Regression.objects.values_list(*identity)) == online
    # The same states too (the backfill's last run is the online detection's last minute, or after).
    assert sorted(Regression.objects.values_list(*identity, "state", "resolution")) == lifecycle
