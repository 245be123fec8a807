"""The narrower template scopes (a canary server, a tenant's variant) and the TTFT p90 metric, on
traffic stored and diagnosed as a deployment does it (tests/support/virtual_fleet.py)."""

import random
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from app.prompts.models import TemplateVersion
from app.regressions.models import Regression
from tests.regressions.test_detection import demo, detected, fault_commit
from tests.support.tokens import reader_bearer
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db(transaction=True)

Kind, Metric, Scope = Regression.Kind, Regression.Metric, Regression.Scope
VOLATILE_TOP = demo()["timeline"][:1]  # on `support` at minute 5
# At minute 10 instead: a narrow scope has an eighth of `support`'s requests, and needs the
# detection's minimum of requests (50) before the change as after it.
LATE_VOLATILE_TOP = [{"at": 600, "template": "support", "change": {"fault": "volatile_top"}}]
EIGHT_SERVERS = demo()["servers"] | {"count": 8}


def listed() -> list[tuple[str, str | None, str | None, str, str]]:
    fields = ("scope", "template__name", "server__name", "tenant", "metric")
    return list(Regression.objects.order_by("changed_at").values_list(*fields))


def test_a_canary_on_one_server_opens_on_that_server_s_template_alone(tmp_path: Path) -> None:
    # Eight servers taking turns: the canary's server has an eighth of `support`'s requests, too few
    # to move the template's rate by a minimum drop.
    definition = demo(duration=1260, servers=EIGHT_SERVERS, routing="round_robin", timeline=LATE_VOLATILE_TOP)
    run = detected(definition, tmp_path, held_back=lambda request: request.server != 1)

    assert listed() == [(Scope.TEMPLATE_SERVER, "support", "virtual-1", "", Metric.HIT_RATE)]
    canary = Regression.objects.get()
    assert canary.kind == Kind.TEMPLATE_COMMIT
    assert canary.suspect_version == TemplateVersion.objects.get(commit_sha=fault_commit(run, "support", 600))
    assert abs(canary.changed_at - run.at(600)) <= timedelta(minutes=1)
    assert canary.rate_before > 0.5 > canary.rate_after


def test_a_tenant_s_variant_opens_on_that_tenant_s_template_alone(tmp_path: Path) -> None:
    tenants = [
        {"name": "acme", "weight": 8, "cache_salt": "acme-2026"},
        {"name": "globex", "weight": 1, "cache_salt": None},
    ]
    # A server for each template and tenant (prefix-aware routing): the variant's misses evict
    # nothing of the other tenant's; `globex` has a ninth of `support`'s requests, so its variant
    # takes less than a minimum drop from the template's hit rate (of its reusable tokens, nearly
    # all reused before the change: an eighth of them was a 15-point drop).
    definition = demo(duration=1260, servers=EIGHT_SERVERS, tenants=tenants, timeline=LATE_VOLATILE_TOP)
    run = detected(definition, tmp_path, held_back=lambda request: request.tenant != "globex")

    assert listed() == [(Scope.TEMPLATE_TENANT, "support", None, "globex", Metric.HIT_RATE)]
    variant = Regression.objects.get()
    assert variant.kind == Kind.TEMPLATE_COMMIT
    assert variant.suspect_version == TemplateVersion.objects.get(
        commit_sha=fault_commit(run, "support", 600)
    )
    assert abs(variant.changed_at - run.at(600)) <= timedelta(minutes=1)


def test_a_commit_on_the_whole_template_opens_once_not_per_server_or_tenant(tmp_path: Path) -> None:
    detected(demo(duration=720, timeline=VOLATILE_TOP), tmp_path)

    assert list(Regression.objects.values_list("scope", "template__name", "metric")) == [
        (Scope.TEMPLATE, "support", Metric.HIT_RATE)
    ]


def test_a_slower_server_opens_a_ttft_regression_on_that_server(tmp_path: Path) -> None:
    slow_from = 480
    run = detected(
        demo(duration=1140, timeline=[]),
        tmp_path,
        ttft_factor=lambda request: 3.0 if request.server == 1 and request.at >= slow_from else 1.0,
    )

    [slow] = Regression.objects.select_related("server")
    assert slow.server is not None and slow.ttft_before_seconds and slow.ttft_after_seconds
    assert (slow.metric, slow.scope, slow.server.name) == (Metric.TTFT, Scope.SERVER, "virtual-1")
    assert abs(slow.changed_at - run.at(slow_from)) <= timedelta(minutes=2)
    assert slow.ttft_after_seconds / slow.ttft_before_seconds == pytest.approx(3.0, rel=0.35)
    assert slow.method["ttft_source"] == "client"  # the virtual fleet's records carry the client's
    assert slow.rate_after == pytest.approx(slow.rate_before, abs=0.05)  # the cache did not change
    assert slow.requests_before >= 50 and slow.requests_after >= 50

    bearer = reader_bearer()
    listed = Client().get("/api/v1/regressions?metric=ttft", headers=bearer).json()["items"]
    assert [(r["scope"], r["server"], r["metric"]) for r in listed] == [("server", "virtual-1", "ttft")]
    assert listed[0]["ttft"] == {
        "source": "client", "p90_before_seconds": slow.ttft_before_seconds,
        "p90_after_seconds": slow.ttft_after_seconds, "p90_now_seconds": slow.ttft_now_seconds,
        "ratio": pytest.approx(slow.ttft_after_seconds / slow.ttft_before_seconds),
    }  # fmt: skip
    client = Client()
    client.force_login(fleet_viewer("engineer"))
    page = client.get(reverse("regressions:detail", args=[slow.pk])).content.decode()
    assert "TTFT p90 rise on server virtual-1" in page
    assert f"rose from {slow.ttft_before_seconds:.3f} s to {slow.ttft_after_seconds:.3f} s" in page
    assert "None found: the prefix cache's hit rate held" in page
    listed_page = client.get(reverse("regressions:list")).content.decode()
    assert "TTFT rose, not the cache: no cause found" in listed_page and "Unknown" not in listed_page


def test_thin_bursty_traffic_with_noisy_ttfts_opens_none(tmp_path: Path) -> None:
    """A tenth of the traffic, five idle minutes in every fifteen, and TTFTs that scatter twofold."""
    noise = random.Random(7)
    detected(
        demo(duration=1800, timeline=[]),
        tmp_path,
        keep=lambda request: request.index % 10 == 0 and request.at % 900 < 600,
        ttft_factor=lambda request: noise.uniform(0.5, 2.0),
    )
    assert not Regression.objects.exists()
