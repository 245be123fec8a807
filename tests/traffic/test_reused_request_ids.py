"""A client that reuses a request id: records of one id on one server further apart than the ingest
merges are different requests, and the request page and API address exactly one of them."""

import re
from datetime import datetime, timedelta
from html import unescape as html_unescape

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from app.traffic.models import RequestRecord
from app.traffic.services.record_rows import JOIN_WINDOW
from collectors.records import RequestFacts
from tests.support.factories import a_server, facts, ingested
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


@pytest.fixture
def reused(client: Client) -> tuple[Client, list[RequestFacts]]:
    """demo-0-000020 sent twice to vllm-0, half an hour apart (a demo restarted), with other prompts:
    both inside the requests explorer's default last hour however long the test takes to list them."""
    a_server(name="vllm-0")
    # A whole second back, so that the newest arrival is never after the explorer's "now" (a quarter
    # second past now was, for a listing made within it).
    now = (timezone.now() - timedelta(seconds=1)).replace(microsecond=250_000)
    sent = [
        facts(
            request_id="demo-0-000020",
            arrived_at=now - timedelta(minutes=30),
            server="vllm-0",
            tenant="acme",
            prompt_tokens=300,
            cached_tokens=0,
        ),
        facts(
            request_id="demo-0-000020",
            arrived_at=now,
            server="vllm-0",
            tenant="globex",
            prompt_tokens=500,
            cached_tokens=64,
        ),
    ]
    for one in sent:
        ingested(one, source="gateway", now=now)
    client.force_login(fleet_viewer("engineer"))
    return client, sent


def test_records_of_one_id_further_apart_than_the_join_window_stay_two_requests(
    reused: tuple[Client, list[RequestFacts]],
) -> None:
    _, sent = reused
    assert sent[1].arrived_at - sent[0].arrived_at > JOIN_WINDOW
    stored = RequestRecord.objects.filter(request_id="demo-0-000020").order_by("arrived_at")
    assert [(r.tenant, r.prompt_tokens) for r in stored] == [("acme", 300), ("globex", 500)]


@pytest.mark.parametrize("suffix", ["", "/diagnosis"])
def test_the_api_answers_one_request_the_latest_and_links_the_other(
    reused: tuple[Client, list[RequestFacts]], suffix: str
) -> None:
    client, sent = reused

    answer = client.get(f"/api/v1/requests/vllm-0/demo-0-000020{suffix}")

    assert answer.status_code == 200
    found = answer.json()
    assert isinstance(found, dict)
    arrived = datetime.fromisoformat(found["arrived_at"])
    assert (found["tenant"], arrived) == ("globex", sent[1].arrived_at)
    assert found["same_id"]["count"] == 1
    (other,) = found["same_id"]["others"]
    older = client.get(other["url"]).json()
    assert (older["tenant"], older["same_id"]["count"]) == ("acme", 1)
    assert older["same_id"]["others"][0]["arrived_at"] == found["arrived_at"]


def test_an_arrival_no_request_of_the_id_has_is_a_404(reused: tuple[Client, list[RequestFacts]]) -> None:
    client, sent = reused
    at = (sent[0].arrived_at + timedelta(seconds=1)).isoformat()
    answer = client.get("/api/v1/requests/vllm-0/demo-0-000020", {"at": at})
    assert answer.status_code == 404


def test_the_request_page_shows_one_request_and_says_the_id_was_reused(
    reused: tuple[Client, list[RequestFacts]],
) -> None:
    client, _ = reused

    page = client.get(reverse("dashboard:request-detail", args=["vllm-0", "demo-0-000020"]))

    html = page.content.decode()
    assert page.status_code == 200 and html.count("<h2>Arrived ") == 1
    assert "globex" in html and "acme" not in html
    assert "Same id reused: 1 other request" in html
    link = page.context["others"][0][1]
    older = client.get(link).content.decode()
    assert "acme" in older and "globex" not in older and "Same id reused: 1 other request" in older
    listed = client.get(reverse("dashboard:requests")).content.decode()
    links = re.findall(r'href="([^"]*demo-0-000020/\?at=[^"]*)"', listed)
    shown = [client.get(html_unescape(link)).context["found"][0].record.tenant for link in links]
    assert sorted(shown) == ["acme", "globex"]  # the explorer links each row to its own request
