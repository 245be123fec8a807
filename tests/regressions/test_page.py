"""A regression's page draws the rollups: its scope's hit rate per minute is the loss minutes summed
over the scope, its capacity drop's figures are the server minutes and its cache_config_info pulls;
the numbers as a table and a CSV."""

import csv
import io
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from app.domain.misses import OF_REUSABLE
from app.fleet.models import Server
from app.prompts.models import DeployMarker, Template, TemplateVersion, VersionCheck
from app.regressions.models import Regression
from app.traffic.models import LossMinute, MetricSeries, ScrapeSample, ServerMinute
from app.traffic.services.partitions import maintain_partitions
from tests.support.factories import a_server
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


def _minute_ago(minutes: int) -> datetime:
    return timezone.now().astimezone(UTC).replace(second=0, microsecond=0) - timedelta(minutes=minutes)


def _regression(**fields: Any) -> Regression:
    now = timezone.now()
    figures = {"rate_before": 0.8, "rate_after": 0.1, "rate_now": 0.1, "requests_before": 300,
               "requests_after": 200, "confidence": 0.9999,
               "detected_at": now, "updated_at": now}  # fmt: skip
    return Regression.objects.create(**(figures | fields))


def _loss(
    server: Server, template: Template | None, at: datetime, *, prompt: int, reused: int, **more: Any
) -> None:
    LossMinute.objects.create(
        server=server,
        template=template,
        minute=at,
        requests=3,
        diagnosed=3,
        diagnosed_prompt_tokens=prompt,
        prompt_tokens=prompt,
        reused_tokens=reused,
        **more,
    )


def _csv(client: Client, path: str) -> dict[datetime, list[str]]:
    response = client.get(path)
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    rows = list(csv.reader(io.StringIO(response.content.decode())))
    return {datetime.fromisoformat(row[0]): row[1:] for row in rows[1:]}


def test_the_hit_rate_drawn_is_the_scopes_loss_minutes_summed(signed_in: Client) -> None:
    a, b = (a_server(name=name) for name in ("vllm-a", "vllm-b"))
    support, other = Template.objects.create(name="support"), Template.objects.create(name="other")
    changed_at = _minute_ago(20)
    suspect = TemplateVersion.objects.create(
        template=support,
        commit_sha="c0ffee" + "0" * 34,
        committed_at=changed_at - timedelta(minutes=5),
        first_seen_at=changed_at + timedelta(seconds=20),
    )
    deployed = TemplateVersion.objects.create(
        template=support, commit_sha="beef" + "0" * 36, committed_at=changed_at - timedelta(hours=3)
    )
    DeployMarker.objects.create(template_version=deployed, deployed_at=changed_at - timedelta(minutes=40))
    for ago in range(60, 0, -1):
        at = _minute_ago(ago)
        if ago % 7 == 0:
            continue  # a minute without traffic: drawn as a gap, not a zero
        good = at < changed_at
        _loss(a, support, at, prompt=1300 + ago, reused=(800 if good else 100) + ago, new_content_tokens=300)
        _loss(b, support, at, prompt=500, reused=400 if good else 20, tenant="acme")
        _loss(a, other, at, prompt=1000, reused=1000)  # another template's: not the scope's
    regression = _regression(
        scope=Regression.Scope.TEMPLATE,
        template=support,
        changed_at=changed_at,
        kind=Regression.Kind.TEMPLATE_COMMIT,
        suspect_version=suspect,
    )

    response = signed_in.get(f"/regressions/{regression.pk}/")
    assert response.status_code == 200
    chart = response.context["charts"][0]
    drawn = dict(zip(chart.times, chart.series[0].values, strict=True))
    rows = LossMinute.objects.filter(template=support)
    expected = {  # of the reusable tokens: each request's own new content is no loss
        at: sum(r.reused_tokens for r in rows if r.minute == at)
        / sum(r.diagnosed_prompt_tokens - r.new_content_tokens for r in rows if r.minute == at)
        for at in {r.minute for r in rows}
    }
    assert {at: v for at, v in drawn.items() if v is not None} == pytest.approx(expected)
    assert len(expected) > 40 and chart.times[0] == min(expected)  # the scope's first minute, 40 min before
    assert all(drawn[at] is None for at in chart.times if at not in expected)  # gaps stay gaps
    by_name = {s.name: s.values for s in chart.series}
    assert {v for at, v in zip(chart.times, by_name["rate_before"], strict=True) if at < changed_at} == {0.8}
    assert {v for at, v in zip(chart.times, by_name["rate_after"], strict=True) if at >= changed_at} == {0.1}

    markers = chart.data["markers"]
    assert markers[0] | {"label": ""} == {"at": changed_at.isoformat(), "id": "change", "kind": "change",
                                          "href": "#figures", "label": ""}  # fmt: skip
    assert [m["id"] for m in markers[1:]] == [str(suspect.pk), str(deployed.pk)]
    assert "(the suspect)" in markers[1]["label"] and "(deploy)" in markers[2]["label"]
    assert f'id="{chart.data_id}"' in response.content.decode()
    assert escape(OF_REUSABLE) in response.content.decode() and chart.note.startswith("Reused / reusable")
    answer = signed_in.get(f"/api/v1/regressions/{regression.pk}").json()
    assert answer["hit_rate_definition"] == OF_REUSABLE

    exported = _csv(signed_in, f"/regressions/{regression.pk}/?chart=hit-rate&format=csv")
    assert {at: float(cells[0]) for at, cells in exported.items() if cells[0]} == pytest.approx(expected)
    assert signed_in.get(f"/regressions/{regression.pk}/?chart=nope&format=csv").status_code == 404


def test_a_capacity_drop_shows_its_servers_blocks_and_evictions_before_and_after(signed_in: Client) -> None:
    maintain_partitions(now=timezone.now())
    server = a_server(name="vllm-cut", num_gpu_blocks=28)
    changed_at = _minute_ago(30)
    config = {
        blocks: MetricSeries.objects.create(
            server=server, name="vllm:cache_config_info", kind="gauge",
            labels={"block_size": "16", "num_gpu_blocks": str(blocks), "engine": "0"},
        )
        for blocks in (256, 28)
    }  # fmt: skip
    for ago in range(60, 0, -1):
        at = _minute_ago(ago)
        after = at >= changed_at
        ServerMinute.objects.create(
            server=server, minute=at, scrapes=4, evictions=(40 + ago % 5) if after else ago % 3
        )
        _loss(server, None, at, prompt=1000, reused=300 if after else 950)
        ScrapeSample.objects.create(
            server=server, series=config[28 if after else 256], scraped_at=at + timedelta(seconds=5), value=1
        )
    regression = _regression(
        scope=Regression.Scope.SERVER, server=server, changed_at=changed_at, kind=Regression.Kind.CAPACITY
    )

    response = signed_in.get(f"/regressions/{regression.pk}/")
    capacity = response.context["capacity"]
    minutes = ServerMinute.objects.filter(server=server)
    before_cut = [m.evictions for m in minutes if m.minute < changed_at]
    after_cut = [m.evictions for m in minutes if m.minute >= changed_at]
    assert (capacity.before.kv_blocks, capacity.after.kv_blocks) == (256, 28)
    assert capacity.before.evictions_per_minute == pytest.approx(sum(before_cut) / len(before_cut))
    assert capacity.after.evictions_per_minute == pytest.approx(sum(after_cut) / len(after_cut))
    drawn = dict(zip(capacity.chart.times, capacity.chart.series[0].values, strict=True))
    assert {at: v for at, v in drawn.items() if v is not None} == {m.minute: m.evictions for m in minutes}
    page = response.content.decode()
    assert "Capacity: no template version" in page and "from 256 to 28 blocks" in page
    assert "Suspect commit" not in page
    exported = _csv(signed_in, f"/regressions/{regression.pk}/?chart=evictions&format=csv")
    assert {at: float(c[0]) for at, c in exported.items() if c[0]} == {m.minute: m.evictions for m in minutes}

    listed = signed_in.get("/regressions/").content.decode()
    assert "capacity drop: no template version" in listed


def test_the_suspects_prediction_before_the_deploy_is_shown_beside_the_measured_cost(
    signed_in: Client,
) -> None:
    support = Template.objects.create(name="support")
    suspect = TemplateVersion.objects.create(
        template=support, commit_sha="c" * 40, committed_at=_minute_ago(90)
    )
    regression = _regression(
        scope=Regression.Scope.TEMPLATE, template=support, changed_at=_minute_ago(30),
        kind=Regression.Kind.TEMPLATE_COMMIT, suspect_version=suspect,
    )  # fmt: skip
    path = f"/regressions/{regression.pk}/"
    assert 'id="regression-prediction"' not in signed_in.get(path).content.decode()  # never checked
    check = VersionCheck.objects.create(
        version=suspect, checked_at=_minute_ago(80), verdict="failed", requests_per_hour=12_400.0,
        predicted_tokens_per_hour=25_000_000.0, predicted_gpu_seconds_per_hour=3_200.0,
        predicted_cost_per_hour=1.9,
    )  # fmt: skip

    html = signed_in.get(path).content.decode()

    shown = html[html.index('id="regression-prediction"') :]
    shown = shown[: shown.index("</tr>")]
    assert "<strong>+25,000,000</strong> prefill tokens an hour, 3,200 GPU-seconds and $1.90 an hour" in shown
    assert f"checked {check.checked_at:%Y-%m-%d %H:%M} UTC, verdict: " in shown and ">failed</span>" in shown
    assert f'href="/templates/{support.pk}/?version={suspect.pk}#version-row-{suspect.pk}"' in shown
    assert "12,400 requests an hour" in shown
