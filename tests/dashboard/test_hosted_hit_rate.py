"""The hosted-API requests' own hit rate (cache read / input tokens, as their providers report them),
shown apart on the Fleet page and answered by the fleet API: records sent through the real REST
ingest in the providers' documented usage shapes, summed by the rollups, read from them."""

import json
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from django.utils.html import escape

from app.api.services import create_ingest_token
from app.dashboard.reads.fleet import fleet_headline
from app.domain.misses import HIT_RATE_DEFINITIONS, OF_HOSTED, OF_RECORDED
from app.fleet.models import Server
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import MinuteRollup
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


def _records(at: str) -> list[dict[str, object]]:
    def record(n: int, server: str, usage: dict[str, object], **fields: object) -> dict[str, object]:
        return {"server": server, "request_id": f"h-{n}", "arrived_at": at, "model": "m", "usage": usage,
                **fields}  # fmt: skip

    return [
        # A vLLM server's own request: 900 of 1,000 prompt tokens cached.
        record(0, "vllm-0", {"prompt_tokens": 1000, "prompt_tokens_details": {"cached_tokens": 900}}),
        # Anthropic: 3,000 read of 100 + 3,000 + 900 input tokens.
        record(1, "anthropic-api", {"input_tokens": 100, "cache_read_input_tokens": 3000,
                                    "cache_creation_input_tokens": 900}, provider="anthropic"),
        # Bedrock Converse: nothing read of 500 + 1,500 written.
        record(2, "bedrock-api", {"inputTokens": 500, "cacheReadInputTokens": 0,
                                  "cacheWriteInputTokens": 1500,
                                  "cacheDetails": [{"ttl": "1h", "inputTokens": 1500}]}),
        # Answered by a gateway's semantic cache: no provider saw it, so in no hosted figure.
        record(3, "openai-api", {"prompt_tokens": 3000, "prompt_tokens_details": {"cached_tokens": 0}},
               provider="openai", response_headers={"x-portkey-cache-status": "SEMANTIC HIT"}),
    ]  # fmt: skip


@pytest.fixture
def reported(client: Client) -> None:
    at = (timezone.now() - timedelta(minutes=10)).isoformat()
    token = create_ingest_token(name="apps")
    answer = client.post("/api/v1/requests", json.dumps(_records(at)), content_type="application/json",
                         headers={"Authorization": f"Bearer {token}"})  # fmt: skip
    assert answer.status_code == 200 and answer.json()["stored"] == 4, answer.content
    refresh_minute_rollups(since=timezone.now() - timedelta(hours=1), until=timezone.now())


def test_the_hosted_rate_is_their_cache_reads_of_their_input_from_the_rollups(reported: None) -> None:
    summed = MinuteRollup.objects.all()
    assert sum(r.hosted_cached_tokens for r in summed) == 3000
    assert sum(r.hosted_known_prompt_tokens for r in summed) == 6000
    now = timezone.now()
    head = fleet_headline(servers=Server.objects.all(), now=now, since=now - timedelta(hours=1), until=now)
    assert head.window.hosted == pytest.approx(3000 / 6000)
    # The recorded requests' rate keeps every one of them, the vLLM server's and the gateway's answer too.
    assert head.window.requests == pytest.approx((900 + 3000) / (1000 + 4000 + 2000 + 3000))


def test_the_fleet_page_shows_it_apart_with_its_definition(reported: None, client: Client) -> None:
    client.force_login(fleet_viewer("engineer"))
    html = client.get("/").content.decode()
    card = html[html.index('id="hosted-rate"') :]
    card = card[: card.index("</div>")]
    assert '<p class="figure">50 %</p>' in card
    assert escape(OF_HOSTED) in card


def test_the_fleet_api_answers_each_rate_with_its_definition(reported: None, client: Client) -> None:
    client.force_login(fleet_viewer("engineer"))
    answer = client.get("/api/v1/fleet/hit-rates")
    assert answer.status_code == 200, answer.content
    rates = {rate["name"]: rate for rate in answer.json()["hit_rates"]}
    assert rates["hosted"]["hit_rate"] == pytest.approx(0.5)
    assert rates["hosted"]["hit_rate_definition"] == OF_HOSTED
    assert rates["recorded"]["hit_rate"] == pytest.approx(0.39)
    assert rates["recorded"]["hit_rate_definition"] == OF_RECORDED
    assert rates["counters"]["hit_rate"] is None  # no server's counters were pulled
    assert all(rate["hit_rate_definition"] == HIT_RATE_DEFINITIONS[name] for name, rate in rates.items())


def test_a_window_of_no_hosted_traffic_says_so(client: Client) -> None:
    client.force_login(fleet_viewer("engineer"))
    rates = {r["name"]: r["hit_rate"] for r in client.get("/api/v1/fleet/hit-rates").json()["hit_rates"]}
    assert rates == {"recorded": None, "counters": None, "hosted": None}
    html = client.get("/").content.decode()
    card = html[html.index('id="hosted-rate"') :]
    assert re.search(r'<p class="figure">—</p>\s*<p[^>]*>No hosted-API usage reported', card)


@pytest.mark.parametrize(
    "window",
    [
        {"since": "2026-12-06T12:00:00Z", "until": "2026-12-06T11:00:00Z"},  # backwards
        {"since": "2026-10-01T00:00:00Z", "until": "2026-12-06T00:00:00Z"},  # over 31 days
    ],
)
def test_a_window_that_cannot_be_read_is_refused_with_its_reason(
    client: Client, window: dict[str, str]
) -> None:
    client.force_login(fleet_viewer("engineer"))
    answer = client.get("/api/v1/fleet/hit-rates", window)
    assert answer.status_code == 400 and answer.json()["code"] == "bad_window"
