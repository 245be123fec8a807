"""The Templates list and a template's page: their numbers equal those computed here from the stored
request records and diagnoses, the version markers sit where the versions went live, and a version's
panel shows its diff (the moved line marked) and its effect."""

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db.models import Sum
from django.test import Client, override_settings
from django.utils import timezone
from django.utils.html import escape

from app.core.models import Membership
from app.domain.cost import NEVER_SERVABLE
from app.domain.kvmemory import KvCacheShape
from app.domain.misses import OF_RECORDED
from app.prompts.models import Template
from app.prompts.services import record_deploy
from app.regressions.models import Regression
from app.rollups.refresh import refresh_loss_minutes
from app.traffic.models import LOST_COLUMNS, HourRollup, MinuteRollup, RequestDiagnosis, RequestRecord
from tests.support.template_traffic import History, a_template_history
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


@pytest.fixture
def history(tmp_path: Path) -> History:
    return a_template_history(tmp_path)


def hit_rate(**where: object) -> float:
    """Delivered hit rate of the stored records: their cached over prompt tokens."""
    found = RequestRecord.objects.filter(cached_tokens__isnull=False, **where).aggregate(
        cached=Sum("cached_tokens"), prompt=Sum("prompt_tokens")
    )
    return float(found["cached"] / found["prompt"])


def lost(**where: object) -> dict[str, int]:
    found = RequestDiagnosis.objects.filter(**where).aggregate(
        **{cause: Sum(column) for cause, column in LOST_COLUMNS.items()}
    )
    return {cause: tokens or 0 for cause, tokens in found.items()}


def row_of(html: str, element_id: str) -> list[str]:
    row = html[html.index(f'id="{element_id}"') :]
    return [
        re.sub(r"<[^>]+>", "", cell).strip()
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row[: row.index("</tr>")], re.S)
    ]


def test_the_pages_ask_for_a_login(client: Client, history: History) -> None:
    assert client.get("/templates/").status_code == 302
    assert client.get(f"/templates/{history.support.pk}/").status_code == 302


def test_the_list_shows_each_templates_hit_rate_and_lost_tokens_from_its_records(
    signed_in: Client, history: History
) -> None:
    html = signed_in.get("/templates/").content.decode()
    cells = row_of(html, f"template-{history.support.pk}")
    name, requests, rate, _trend, change, lost_tokens, regressions = cells
    assert name == "support" and requests == "40"
    assert rate == f"{100 * hit_rate(template=history.support):.1f} %" == "50.0 %"  # 80 % then 20 %
    assert change == "—"  # nothing in the hour before
    assert lost_tokens == f"{sum(lost(template=history.support).values()):,}" != "0"
    assert regressions == "0"
    billing = row_of(html, f"template-{history.billing.pk}")
    assert billing[2] == f"{100 * hit_rate(template=history.billing):.1f} %"
    assert 'href="/templates/repositories/"' in html  # the repositories moved below the list


@pytest.mark.parametrize(
    ("sort", "first"), [("hit_rate", "billing"), ("-hit_rate", "support"), ("name", "billing")]
)
def test_the_list_sorts_by_the_column_in_the_url(
    signed_in: Client, history: History, sort: str, first: str
) -> None:
    html = signed_in.get("/templates/", {"sort": sort, "window": "6h"}).content.decode()
    body = html[html.index("<tbody>") :]
    names = re.findall(r'<td><a href="/templates/\d+/\?[^"]*">(\w+)</a>', body)
    assert names[0] == first
    assert "window=6h" in html and f'<input type="hidden" name="sort" value="{sort}">' in html


def test_the_change_compares_with_the_window_before(signed_in: Client, history: History) -> None:
    since = history.start + timedelta(minutes=10)
    params = {
        "window": "custom",
        "since": f"{since:%Y-%m-%dT%H:%M}",
        "until": f"{since + timedelta(minutes=10):%Y-%m-%dT%H:%M}",
    }
    html = signed_in.get("/templates/", params).content.decode()
    cells = row_of(html, f"template-{history.support.pk}")
    assert cells[2] == "20.0 %" and cells[4] == "-60.0 pp"


def test_the_hit_rate_chart_is_the_records_rate_per_minute(signed_in: Client, history: History) -> None:
    path = f"/templates/{history.support.pk}/"
    answer = signed_in.get(path, {"chart": "hit-rate", "format": "csv"})
    rows = {row[0]: row[1:] for row in csv.reader(io.StringIO(answer.content.decode()))}
    assert rows["time"] == ["hit_rate"]
    for minute in (0, 9, 10, 19):
        at = history.start + timedelta(minutes=minute)
        expected = hit_rate(
            template=history.support, arrived_at__gte=at, arrived_at__lt=at + timedelta(minutes=1)
        )
        assert float(rows[at.isoformat()][0]) == expected
    html = signed_in.get(path).content.decode()
    # The four over the window, and the versions' predicted vs observed (version two's observed).
    assert html.count('<figure class="chart"') == 5
    assert "50.0 %" in html[html.index('class="headline"') :]


def test_version_markers_sit_where_each_version_went_live(signed_in: Client, history: History) -> None:
    html = signed_in.get(f"/templates/{history.support.pk}/").content.decode()
    script = re.search(r'id="hit-rate-data" type="application/json">(.*?)</script>', html, re.S)
    assert script is not None
    data = json.loads(script[1])
    records = RequestRecord.objects.order_by("arrived_at")
    first = {sha: records.filter(template_version__commit_sha=sha)[0].arrived_at
             for sha in (history.one.commit_sha, history.two.commit_sha)}  # fmt: skip
    marks = {m["id"]: m["at"] for m in data["markers"]}
    assert marks == {str(history.one.pk): first[history.one.commit_sha].isoformat(),
                     str(history.two.pk): first[history.two.commit_sha].isoformat()}  # fmt: skip
    assert first[history.two.commit_sha] == history.start + timedelta(minutes=10, seconds=5)


def test_a_versions_panel_shows_its_diff_and_its_effect(signed_in: Client, history: History) -> None:
    path = f"/templates/{history.support.pk}/"
    asked_at = timezone.now()
    html = signed_in.get(path, {"version": history.two.pk}).content.decode()
    answered_at = timezone.now()
    panel = html[
        html.index('id="version-panel"') : html.index("</section>", html.index('id="version-panel"'))
    ]
    assert '<span id="diff-' in panel
    assert re.search(r'class="diff-moved-to">\+Current time: \{\{ now \}\}', panel)  # moved to the top
    assert re.search(r'class="diff-moved-from">-Current time: \{\{ now \}\}', panel)
    assert re.search(r'class="diff-added">\+Be kind\.', panel)
    # Version two went live ten minutes in, twenty minutes ago: twenty minutes either side.
    live, span = history.start + timedelta(minutes=10), timedelta(minutes=20)
    before = hit_rate(template=history.support, arrived_at__gte=live - span, arrived_at__lt=live)
    after = hit_rate(template=history.support, arrived_at__gte=live, arrived_at__lt=live + span)
    assert f"{100 * before:.1f} %" in panel and f"{100 * after:.1f} %" in panel
    assert "-60.0 percentage points" in panel
    # The windows run from the live minute to the page's own minute: twenty, or one more when the
    # clock turned a minute since the history was written (a loaded machine). The rates are the
    # same either way: all the traffic lies within ten minutes of the live minute.
    floors = (moment.replace(second=0, microsecond=0) for moment in (asked_at, answered_at))
    minutes = {(floor - live) // timedelta(minutes=1) for floor in floors}
    assert any(f"<td>{m} min before</td>" in panel for m in minutes), (minutes, panel)
    fragment = signed_in.get(
        path, {"version": history.two.pk}, headers={"HX-Request": "true", "HX-Target": "version-panel"}
    )
    assert fragment.content.decode().lstrip().startswith('<section id="version-panel"')


def test_miss_causes_and_cost_come_from_the_diagnoses(signed_in: Client, history: History) -> None:
    html = signed_in.get(f"/templates/{history.support.pk}/").content.decode()
    causes = lost(template=history.support)
    labels = dict(RequestDiagnosis.Cause.choices)
    section = html[html.index("Why its prompt tokens were lost") :]
    for cause, tokens in causes.items():
        if tokens:
            assert f'<td>{labels[cause]}</td><td class="num">{tokens:,}</td>' in section
    avoidable = sum(t for c, t in causes.items() if c not in NEVER_SERVABLE)
    cost = html[html.index('class="cost"') :]
    assert f"{avoidable:,} in the window" in cost
    # TTFT 0.1 s with 200 tokens uncached, 0.2 s with 800: 600 tokens in 0.1 s.
    assert "6,000 tokens/s, measured from its requests" in cost


def test_the_memory_a_prefix_holds_is_its_reused_tokens_times_the_models_kv_bytes(
    signed_in: Client, history: History
) -> None:
    shape = KvCacheShape(layers=2, kv_heads=4, head_dim=64)
    with override_settings(PREFIXSCOPE_MODEL_KV_SHAPES={"tiny": shape}):
        html = signed_in.get(f"/templates/{history.support.pk}/").content.decode()
    row = html[html.index("GPU memory its prefix holds") :]
    row = row[row.index("<tbody>") :]
    row = row[: row.index("</tr>")]
    reused = 500  # half of 1,000 tokens on average
    assert f'<td class="num">{reused}</td>' in row
    assert f'<td class="num">{2 * 2 * 4 * 64 * 2:,}</td>' in row  # K and V, layers, heads, dim, 2 bytes


def test_a_week_reads_the_hourly_rollups_to_the_same_figures(signed_in: Client, history: History) -> None:
    html = signed_in.get("/templates/", {"window": "7d"}).content.decode()
    assert row_of(html, f"template-{history.support.pk}")[1:3] == ["40", "50.0 %"]


def test_its_unresolved_regressions_are_counted_and_every_one_listed(
    signed_in: Client, history: History
) -> None:
    # Regressions as the detection stores them (it reads the diagnoses' reuse, which these records,
    # without KV events, do not have): one open at version two, one muted, one resolved.
    for i, state in enumerate(("open", "muted", "resolved")):
        at = history.start + timedelta(minutes=10 + i)  # one row per scope and change point
        Regression.objects.create(
            scope="template",
            template=history.support,
            changed_at=at,
            detected_at=at,
            updated_at=at,
            rate_before=0.8,
            rate_after=0.2,
            rate_now=0.2,
            requests_before=20,
            requests_after=20,
            confidence=0.999,
            state=state,
            suspect_version=history.two,
        )
    html = signed_in.get("/templates/").content.decode()
    assert row_of(html, f"template-{history.support.pk}")[6] == "1"  # neither muted nor resolved
    page = signed_in.get(f"/templates/{history.support.pk}/").content.decode()
    for regression in Regression.objects.filter(template=history.support):
        assert f'href="/regressions/{regression.pk}/"' in page
    assert f"<code>{history.two.commit_sha[:7]}</code>" in page


def test_a_deploy_marks_a_version_live_before_its_first_request(signed_in: Client, history: History) -> None:
    deployed = history.start + timedelta(minutes=8)
    record_deploy(template="support", version=history.two.commit_sha[:7], deployed_at=deployed)
    html = signed_in.get(f"/templates/{history.support.pk}/", {"version": history.two.pk}).content.decode()
    script = re.search(r'id="hit-rate-data" type="application/json">(.*?)</script>', html, re.S)
    assert script is not None
    marks = {m["id"]: m for m in json.loads(script[1])["markers"]}
    assert marks[str(history.two.pk)]["at"] == deployed.isoformat()
    assert "(deploy)" in marks[str(history.two.pk)]["label"]
    assert f"live {deployed:%Y-%m-%d %H:%M} UTC</h2>" in html  # its effect measured from the deploy


def rollup_rates(model: type[HourRollup] | type[MinuteRollup], template: Template, times: list[datetime],
                 bucket: timedelta) -> list[float | None]:  # fmt: skip
    """The template's hit rate per bucket, summed here from its rollup rows: cached over the prompt
    tokens of the requests that reported their cached tokens."""
    column = "hour" if model is HourRollup else "minute"
    rates: list[float | None] = []
    for start in times:
        rows = model.objects.filter(
            template=template, **{f"{column}__gte": start, f"{column}__lt": start + bucket}
        )
        found = rows.aggregate(cached=Sum("cached_tokens"), known=Sum("cache_known_prompt_tokens"))
        rates.append(found["cached"] / found["known"] if found["known"] else None)
    return rates


def trend_of(html: str, template: Template) -> dict[str, Any]:
    found = re.search(
        rf'<script id="trend-{template.pk}-data" type="application/json">(.*?)</script>', html, re.S
    )
    assert found is not None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


@pytest.mark.parametrize(("window", "model"), [("1h", MinuteRollup), ("7d", HourRollup)])
def test_each_templates_trend_is_its_rollups_hit_rate_per_bucket(
    signed_in: Client, history: History, window: str, model: type[HourRollup] | type[MinuteRollup]
) -> None:
    html = signed_in.get("/templates/", {"window": window}).content.decode()
    answer = signed_in.get("/templates/", {"window": window, "format": "csv"}).content.decode()

    csv_rows = list(csv.reader(io.StringIO(answer)))
    assert csv_rows[0] == ["time", "billing", "support"]
    for template in (history.support, history.billing):
        data = trend_of(html, template)
        times = [datetime.fromtimestamp(t, UTC) for t in data["times"]]
        bucket = times[1] - times[0]
        assert bucket == (timedelta(hours=1) if window == "7d" else timedelta(minutes=1))
        expected = rollup_rates(model, template, times, bucket)
        assert data["series"][0]["values"] == expected
        assert sum(value is not None for value in expected) >= (1 if window == "7d" else 20)
        column = csv_rows[0].index(template.name)
        assert [float(row[column]) if row[column] else None for row in csv_rows[1:]] == expected
    # Version one reused 80 %, version two 20 %: the minute trend shows the drop.
    support = [v for v in trend_of(html, history.support)["series"][0]["values"] if v is not None]
    if window == "1h":
        assert support[:10] == [0.8] * 10 and support[10:] == [0.2] * 10


def test_the_trends_are_of_the_viewers_tenants(client: Client, history: History) -> None:
    Template.objects.filter(pk=history.support.pk).update(tenant="acme")
    Template.objects.filter(pk=history.billing.pk).update(tenant="globex")
    user = User.objects.create_user("acme-engineer")
    Membership.objects.create(user=user, tenant="acme")
    client.force_login(user)

    html = client.get("/templates/").content.decode()
    answer = client.get("/templates/", {"format": "csv"}).content.decode()

    values = trend_of(html, history.support)["series"][0]["values"]
    assert [v for v in values if v is not None] == [0.8] * 10 + [0.2] * 10
    assert f'id="trend-{history.billing.pk}"' not in html
    assert answer.splitlines()[0] == "time,support"


def test_hits_by_tier_are_per_server_only_and_link_each_server_it_went_to(
    signed_in: Client, history: History
) -> None:
    html = signed_in.get(f"/templates/{history.support.pk}/").content.decode()
    note = html[html.index('id="tier-hits-note"') :]
    note = note[: note.index("</p>")]
    assert "Per server only" in note
    assert f'href="/servers/{history.server.name}/?' in note and note.count("#tier-hits") == 1


def test_the_hit_rate_says_its_definition_and_semantic_cache_answers_are_counted(
    signed_in: Client, history: History
) -> None:
    at = history.start + timedelta(minutes=3, seconds=30)
    for i in range(3):
        RequestDiagnosis.objects.create(
            server=history.server, template=history.support, request_id=f"cached-{i}", arrived_at=at,
            diagnosed_at=at, prompt_tokens=0, unknown=RequestDiagnosis.Unknown.GATEWAY_CACHE,
        )  # fmt: skip
    refresh_loss_minutes(since=history.start, until=timezone.now())
    html = signed_in.get(f"/templates/{history.support.pk}/").content.decode()
    answers = html[html.index('id="gateway-cache"') :]
    assert "<dd>3</dd>" in answers[: answers.index("</div>")]
    definition = html[html.index("hit-rate-definition") :]
    assert escape(OF_RECORDED) in definition[: definition.index("</p>")]
    chart = html[html.index('id="chart-hit-rate"') :]
    assert escape(OF_RECORDED) in chart[: chart.index("</figcaption>")]
