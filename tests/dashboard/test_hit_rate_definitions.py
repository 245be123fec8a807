"""Every page and API answer that shows a hit rate says which one it is, in the words of the one
place that defines them (app/domain/misses.py), hosted-API requests said included where mixed in."""

import pytest
from django.template.loader import render_to_string
from django.test import Client
from django.utils.html import escape

from app.api.whatif import AnswersOut
from app.domain.misses import (
    HIT_RATE_DEFINITIONS,
    OF_COUNTERS,
    OF_HOSTED,
    OF_PROMPT,
    OF_RECORDED,
    OF_REPLAYED,
    OF_REQUEST,
    OF_REUSABLE,
    OF_UNCHANGED,
)
from tests.support.factories import a_server
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


def test_every_definition_names_what_it_is_a_share_of() -> None:
    assert all(" / " in text for text in HIT_RATE_DEFINITIONS.values())
    assert "hosted" in OF_RECORDED and "cache read / input tokens" in OF_RECORDED
    assert HIT_RATE_DEFINITIONS["hosted"] == OF_HOSTED


@pytest.mark.parametrize(
    ("url", "definitions"),
    [
        ("/", [OF_RECORDED, OF_COUNTERS, OF_HOSTED]),
        ("/templates/", [OF_RECORDED]),
        ("/tenants/", [OF_PROMPT, "hosted-API requests included"]),
        ("/requests/", [OF_REQUEST]),
        ("/servers/vllm-0/", [OF_RECORDED, OF_COUNTERS]),
        ("/regressions/", [OF_REUSABLE, OF_UNCHANGED, OF_RECORDED]),
    ],
)
def test_each_page_with_a_hit_rate_states_its_definition(
    signed_in: Client, url: str, definitions: list[str]
) -> None:
    a_server(name="vllm-0")
    html = signed_in.get(url).content.decode()
    for definition in definitions:
        assert escape(definition) in html or definition in html, f"{url} does not say {definition!r}"


def test_the_whatif_answers_say_they_are_replayed() -> None:
    html = render_to_string("whatif/_answers.html", {"rows": [], "first": "KV blocks", "id": "x"})
    assert f'title="{escape(OF_REPLAYED)}">Hit rate' in html
    assert AnswersOut.model_fields["hit_rate_definition"].default == OF_REPLAYED


@pytest.mark.parametrize(
    ("metric", "scope", "definition"),
    [
        ("hit_rate", "fleet", OF_RECORDED),
        ("engine_hit_rate", "server", OF_COUNTERS),
        ("requests", "fleet", None),
    ],
)
def test_a_hit_rate_series_answers_its_definition(
    signed_in: Client, metric: str, scope: str, definition: str | None
) -> None:
    server = a_server(name="vllm-0")
    id = str(server.pk) if scope == "server" else ""
    answer = signed_in.get("/api/v1/series", {"metric": metric, "scope": scope, "id": id}).json()
    assert answer["definition"] == definition


def test_a_tenants_hit_rate_series_is_of_its_diagnosed_requests(signed_in: Client) -> None:
    answer = signed_in.get("/api/v1/series", {"metric": "hit_rate", "scope": "tenant", "id": "acme"}).json()
    assert (
        answer["definition"].startswith(OF_PROMPT) and "hosted-API requests included" in answer["definition"]
    )


def test_the_fleet_api_says_what_each_of_its_hit_rates_is(signed_in: Client) -> None:
    answer = signed_in.get("/api/v1/fleet/hit-rates").json()
    stated = {rate["name"]: rate["hit_rate_definition"] for rate in answer["hit_rates"]}
    assert stated == {"recorded": OF_RECORDED, "counters": OF_COUNTERS, "hosted": OF_HOSTED}


def test_the_request_list_says_what_each_hit_rate_is(signed_in: Client) -> None:
    answer = signed_in.get("/api/v1/requests").json()
    assert answer["hit_rate_definition"] == OF_REQUEST
