"""A routing change (the router switched from prefix-aware to round-robin) opens one regression on the
fleet, confirmed by the templates' requests no longer landing where they did; a fleet without one, or
with another fault, opens none of that kind. Traffic stored and diagnosed as a deployment does it
(tests/support/virtual_fleet.py)."""

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from app.regressions.attribution import ROUTING_MIN_FALL
from app.regressions.models import Regression
from tests.regressions.test_detection import demo, detected
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db(transaction=True)

Kind, Scope = Regression.Kind, Regression.Scope
ROUTING_AT = 600
# 64 blocks a server: room for the prefixes prefix-aware routing sends each server (a template and
# tenant or two), not for all six that round-robin sends each: the change costs reuse for good.
TIGHT = demo()["servers"] | {"num_blocks": 64}


def routing_change(**changes: Any) -> dict[str, Any]:
    timeline = [{"at": ROUTING_AT, "routing_change": {"routing": "round_robin"}}]
    return demo(duration=900, servers=TIGHT, timeline=timeline) | changes


def test_a_routing_change_opens_one_routing_regression_on_the_fleet(tmp_path: Path) -> None:
    run = detected(routing_change(), tmp_path)

    [routing] = Regression.objects.all()
    assert (routing.scope, routing.kind, routing.expected) == (Scope.FLEET, Kind.ROUTING, False)
    assert abs(routing.changed_at - run.at(ROUTING_AT)) <= timedelta(minutes=1)
    assert routing.detected_at - run.at(ROUTING_AT) <= timedelta(minutes=3)
    assert routing.rate_before - routing.rate_after >= 0.15
    # The confirmation: before the change, each template and tenant stayed on its server; after
    # it, round-robin sent three quarters of them elsewhere.
    placed = routing.evidence["routing"]
    assert placed["stayed_before"] > 0.95
    assert placed["stayed_after"] < placed["stayed_before"] - ROUTING_MIN_FALL
    # What the diagnosis said of the lost tokens: routed to a server without the prefix, or
    # evicted from one that took it in once and had no room to keep it.
    after, before = routing.cause_shift["after"], routing.cause_shift["before"]
    moved = ("routed_elsewhere", "evicted")
    assert sum(after.get(c, 0) for c in moved) > sum(before.get(c, 0) for c in moved) + 0.15

    client = Client()
    client.force_login(fleet_viewer("engineer"))  # one who sees every tenant, as the admin does
    page = client.get(reverse("regressions:detail", args=[routing.pk])).content.decode()
    assert "Routing change on the fleet" in page
    assert f"{round(placed['stayed_after'] * 100)} % landed on the servers they had landed on before" in page
    assert "since the change" in page  # the whole segment's causes, beside the first minutes'


def test_the_same_tight_fleet_without_a_routing_change_opens_none(tmp_path: Path) -> None:
    detected(routing_change(timeline=[]), tmp_path)
    assert not Regression.objects.exists()


def test_a_template_commit_and_a_routing_change_are_each_attributed_to_their_own(tmp_path: Path) -> None:
    """`volatile_top` on `support` at minute 5, the router's change at minute 10: the commit stays
    its template's (with its suspect), the routing change the fleet's, and neither takes the other."""
    volatile_top = {"at": 300, "template": "support", "change": {"fault": "volatile_top"}}
    timeline = [volatile_top, *routing_change()["timeline"]]
    run = detected(routing_change(timeline=timeline), tmp_path)

    found = sorted(Regression.objects.values_list("scope", "template__name", "kind", "changed_at"))
    assert [(scope, template, kind) for scope, template, kind, _ in found] == [
        (Scope.FLEET, None, Kind.ROUTING),
        (Scope.TEMPLATE, "support", Kind.TEMPLATE_COMMIT),
    ]
    changed = {kind: at for _, _, kind, at in found}
    assert abs(changed[Kind.TEMPLATE_COMMIT] - run.at(300)) <= timedelta(minutes=1)
    assert abs(changed[Kind.ROUTING] - run.at(ROUTING_AT)) <= timedelta(minutes=1)
