"""The What-if page: the window in its URL, its question found or queued, its progress polled, its
answers (calibration, capacity curve, routing, the other families) and their CSV; per tenant."""

import csv
import io
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

import app.whatif.tasks  # noqa: F401 - registers the task a question queues (eager here)
from app.core.models import Membership
from app.core.tenancy import SEES_ALL
from app.domain.replay.whatif import CAPACITY_FACTORS
from app.prompts.models import Template
from app.whatif import questions
from app.whatif.models import WhatIfQuestion
from app.whatif.results import to_json
from app.whatif.shown import shown
from tests.support.factories import a_server
from tests.support.users import fleet_viewer
from tests.support.virtual_fleet import VirtualRun, run_virtually
from tests.whatif.test_ask import demo

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("eager")]


def _url(run: VirtualRun, start: int, end: int, **scope: str) -> str:
    window = {"since": f"{run.at(start):%Y-%m-%dT%H:%M:%SZ}", "until": f"{run.at(end):%Y-%m-%dT%H:%M:%SZ}"}
    return "/whatif/?" + urlencode({"scope": "fleet", **scope, **window}, safe=":")


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_a_running_question_shows_its_progress_then_its_answers(tmp_path: Path) -> None:
    cut = [{"at": 60, "capacity_cut": {"server": 3, "num_blocks": 28}}]
    run = run_virtually(demo(180, cut), tmp_path, scrape_every=15)
    question = WhatIfQuestion.objects.create(
        scope="fleet", since=run.at(75), until=run.at(181), state="running", progress=0.4
    )  # a worker on it: the page reads it, queues no other
    client = _client(fleet_viewer("operator"))

    running = client.get(_url(run, 75, 181))

    assert running.context["question"] == question and WhatIfQuestion.objects.count() == 1
    assert b'hx-trigger="every 1s"' in running.content and b"40 %" in running.content
    questions.answer(question_id=question.pk)  # the worker done
    done = client.get(_url(run, 75, 181), headers={"HX-Request": "true"})
    body = done.content.decode()
    assert body.strip().startswith('<section id="whatif-answer"') and "hx-trigger" not in body
    assert 'class="badge trust-good">good<' in body
    assert "Restore virtual-3 to 256 blocks" in body  # the capacity cut, given back
    assert body.count('id="chart-capacity-data"') == body.count('id="chart-routing-data"') == 1
    assert 'id="block_sizes-table"' in body and 'id="salts-table"' in body  # token ids kept, acme salted
    assert "queueing" in body  # what the TTFT estimate leaves out
    assert "priced at " in body and "prefill tokens a second" in body  # the rate the answers used
    assert (
        "3 \N{MULTIPLICATION SIGN} 256, 1 \N{MULTIPLICATION SIGN} 28" in body
    )  # today's blocks per server, told apart


def test_a_relative_window_is_stated_in_the_url_and_queues_one_question(tmp_path: Path) -> None:
    run_virtually(demo(60), tmp_path, scrape_every=15)
    client = _client(fleet_viewer("operator"))

    moved = client.get("/whatif/?scope=template&name=support&minutes=5")
    assert moved.status_code == 302 and "since=" in moved["Location"] and "minutes" not in moved["Location"]
    first = client.get(moved["Location"])
    again = client.get(moved["Location"])

    assert first.status_code == again.status_code == 200
    assert first.context["question"] == again.context["question"]  # read again, not asked again
    assert WhatIfQuestion.objects.get().scope == "template"


def test_a_question_with_nothing_to_replay_shows_its_reason(tmp_path: Path) -> None:
    run = run_virtually(demo(60), tmp_path)  # no /metrics pulled: KV blocks unknown

    page = _client(fleet_viewer("operator")).get(_url(run, 0, 61))

    assert page.context["question"].state == "failed"
    assert (
        "Not answered: no request of the fleet to replay in the window (KV blocks unknown"
        in page.content.decode()
    )
    assert b"Ask again" in page.content


def test_a_tenant_sees_its_own_answers_and_never_another_tenants_scope(tmp_path: Path) -> None:
    run = run_virtually(demo(120), tmp_path, scrape_every=15)
    Template.objects.filter(name="billing").update(tenant="globex")
    acme = User.objects.create_user("acme-engineer")
    Membership.objects.create(user=acme, tenant="acme")
    admins = _client(fleet_viewer("operator")).get(_url(run, 0, 121))

    mine = _client(acme).get(_url(run, 0, 121))

    assert mine.context["question"] != admins.context["question"]  # the admin's counts every tenant
    acme_requests = sum(1 for r in run.planned if r.tenant == "acme")
    assert mine.context["shown"].answers.requests == acme_requests < admins.context["shown"].answers.requests
    assert _client(acme).get(_url(run, 0, 121, scope="template", name="billing")).status_code == 404
    assert _client(acme).get(_url(run, 0, 121, scope="group", name="nobody")).status_code == 404


def test_the_capacity_and_routing_tables_download_as_csv(tmp_path: Path) -> None:
    run = run_virtually(demo(120), tmp_path, scrape_every=15)
    client = _client(fleet_viewer("operator"))
    questions.queue(
        scope=questions.scope_of(WhatIfQuestion(scope="fleet")), since=run.at(0), until=run.at(121),
        viewer=SEES_ALL, asked_by_id=None,
    )  # fmt: skip

    capacity = client.get(_url(run, 0, 121) + "&format=csv&table=capacity")
    routing = client.get(_url(run, 0, 121) + "&format=csv&table=routing")

    assert (
        capacity["Content-Type"].startswith("text/csv")
        and "whatif-fleet-capacity.csv" in capacity["Content-Disposition"]
    )
    rows = list(csv.DictReader(io.StringIO(capacity.content.decode())))
    assert [float(r["factor"]) for r in rows] == list(CAPACITY_FACTORS)
    today = next(r for r in rows if r["factor"] == "1")
    assert today["blocks_per_server"] == "256" and float(today["saved_tokens_per_hour"]) == 0
    stored = questions.answers_of(WhatIfQuestion.objects.get())
    assert stored is not None
    assert [float(r["hit_rate"]) for r in rows] == [round(a.hit_rate or 0, 4) for a in stored.capacity]
    policies = [r["answer"] for r in csv.DictReader(io.StringIO(routing.content.decode()))]
    assert policies == [a.label for a in stored.routing] and "prefix-aware" in policies
    assert client.get(_url(run, 0, 121) + "&format=csv&table=salts").status_code == 404


@pytest.mark.parametrize(
    "query", ["scope=planet", "scope=template", "minutes=lots", "minutes=0", "since=yesterday&until=now",
              "since=2026-01-02T00:00:00Z&until=2026-01-01T00:00:00Z",
              "since=2026-01-01T00:00:00Z&until=2026-01-03T00:00:00Z"],
)  # fmt: skip
def test_a_url_asking_nothing_answerable_is_a_400_that_says_why(query: str) -> None:
    page = _client(fleet_viewer("operator")).get(f"/whatif/?{query}")

    assert page.status_code == 400
    assert b'id="whatif-problem"' in page.content
    assert not WhatIfQuestion.objects.exists()


def test_a_family_not_answered_says_why_in_a_line(tmp_path: Path) -> None:
    run = run_virtually(demo(60), tmp_path, scrape_every=15)
    question = questions.queue(
        scope=questions.scope_of(WhatIfQuestion(scope="fleet")), since=run.at(0), until=run.at(61),
        viewer=SEES_ALL, asked_by_id=None,
    )  # fmt: skip
    question.refresh_from_db()
    answers = questions.answers_of(question)
    assert answers is not None and answers.block_sizes and answers.block_sizes_left_out == ()
    servers = tuple(s.name for s in answers.servers)
    client = _client(fleet_viewer("operator"))
    # Today's block size not among the answered ones (a fleet at 128, say): changes against the fleet's
    untold = tuple(replace(a, label=a.label.removesuffix(" (today)")) for a in answers.block_sizes)
    (_, sizes_family, _) = shown(replace(answers, block_sizes=untold)).families
    assert untold[0].hit_rate is not None and answers.as_was.hit_rate is not None
    assert sizes_family.rows[0].change == f"{100 * (untold[0].hit_rate - answers.as_was.hit_rate):+.1f}"
    # Blocks re-cut over the servers that kept their token ids; one left out, its changes against their own
    today = next(a for a in answers.block_sizes if a.label.endswith("(today)"))
    others = replace(today, hit_rate=(today.hit_rate or 0) + 0.05)  # the others' replay reused more
    sizes = tuple(others if a is today else a for a in answers.block_sizes)
    question.answers = to_json(replace(answers, block_sizes=sizes, block_sizes_left_out=servers[-1:]))
    question.save()

    partly = client.get(_url(run, 0, 61)).content.decode()

    note = partly.split('id="whatif-block_sizes-note">', 1)[1].split("</p>", 1)[0]
    assert f"{servers[-1]} kept no token ids for some of its requests" in note
    table = partly.split('id="block_sizes-table"', 1)[1].split("</table>", 1)[0]
    today_row = table.split('class="here"', 1)[1].split("</tr>", 1)[0]
    assert "+0.0" in today_row  # against the others' own today, not the fleet's
    question.answers = to_json(replace(answers, block_sizes=(), block_sizes_left_out=servers))
    question.save()

    body = client.get(_url(run, 0, 61)).content.decode()

    assert "Not answered: no server kept the token ids of all its requests" in body
    assert 'id="block_sizes-table"' not in body and "whatif-block_sizes-note" not in body


def test_the_fleet_a_servers_group_and_a_template_link_to_their_what_if() -> None:
    server = a_server(name="vllm-0", block_size=16)
    template = Template.objects.create(name="support")
    client = _client(fleet_viewer("operator"))

    links = {
        "/": "scope=fleet&amp;minutes=10",
        f"/servers/{server.name}/": f"scope=group&amp;name={server.group}&amp;minutes=10",
        f"/templates/{template.pk}/": "scope=template&amp;name=support&amp;minutes=10",
    }

    for page, query in links.items():
        assert f'href="/whatif/?{query}" id="whatif-link"' in client.get(page).content.decode(), page


def test_answers_kept_in_an_older_shape_are_asked_again_once(tmp_path: Path) -> None:
    run = run_virtually(demo(60), tmp_path, scrape_every=15)
    since, until = run.at(0).replace(microsecond=0), run.at(61).replace(microsecond=0)
    stale = WhatIfQuestion.objects.create(
        scope="fleet", since=since, until=until, state="done", progress=1.0, answers={"requests": 3},
        finished_at=run.at(61),
    )  # fmt: skip
    client = _client(fleet_viewer("operator"))

    first = client.get(_url(run, 0, 61))
    again = client.get(_url(run, 0, 61))

    assert first.status_code == again.status_code == 200
    asked = WhatIfQuestion.objects.exclude(pk=stale.pk)
    assert asked.count() == 1 and asked.get().state == WhatIfQuestion.State.DONE  # one new, answered
    assert again.context["question"] == asked.get()
    assert questions.answers_of(stale) is None


def test_a_question_no_worker_finished_is_said_failed_not_polled_for_ever(tmp_path: Path) -> None:
    run = run_virtually(demo(60), tmp_path, scrape_every=15)
    since, until = run.at(0).replace(microsecond=0), run.at(61).replace(microsecond=0)
    lost = WhatIfQuestion.objects.create(
        scope="fleet", since=since, until=until, state="running", progress=0.3
    )
    WhatIfQuestion.objects.filter(pk=lost.pk).update(asked_at=timezone.now() - timedelta(minutes=31))
    client = _client(fleet_viewer("operator"))

    page = client.get(_url(run, 0, 61))

    lost.refresh_from_db()
    assert lost.state == WhatIfQuestion.State.FAILED and "Celery worker" in lost.error
    assert page.context["question"] == lost and b"Ask again" in page.content
    assert b'hx-trigger="every 1s"' not in page.content
