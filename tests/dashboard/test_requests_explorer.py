"""The requests explorer, page and API: filters narrow, keyset pages visit every row once in order,
cursors stay with their filters, bad input is a 400 (never a 500), and prompt content stays hidden
from viewers who may not read prompts."""

import base64
import re
from datetime import timedelta, timezone
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from app.domain.misses import is_loss
from app.traffic.explorer import PAGE_SIZE
from app.traffic.models import LOST_COLUMNS, RequestDiagnosis
from tests.support.explorer_traffic import BLOCK, OLD, Sent, newest_first, record_traffic
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db

API = "/api/v1/requests"


@pytest.fixture
def signed_in(client: Client) -> Client:
    client.force_login(fleet_viewer("engineer"))
    return client


@pytest.fixture
def reader() -> Client:
    client = Client()  # not the `client` fixture: a test may hold both viewers
    user = fleet_viewer("reader")
    user.user_permissions.add(Permission.objects.get(codename="read_prompt_text"))
    client.force_login(user)
    return client


def listed(client: Client, **params: str) -> list[tuple[str, str]]:
    """Every row the API lists under these filters, following `next` to the last page."""
    answer = client.get(API, {"limit": "200"} | params).json()
    rows = [(row["server"], row["request_id"]) for row in answer["items"]]
    while answer["next"]:
        answer = client.get(answer["next"]).json()
        rows += [(row["server"], row["request_id"]) for row in answer["items"]]
    return rows


def _hit(s: Sent) -> float:
    return 100 * s.cached_tokens / s.prompt_tokens


def _reusable_lost(d: RequestDiagnosis) -> int:
    return sum(getattr(d, column) for cause, column in LOST_COLUMNS.items() if is_loss(cause))


FILTERS: dict[str, tuple[dict[str, str], Any]] = {
    "server": ({"server": "vllm-a"}, lambda s, d: s.server == "vllm-a"),
    "template": ({"template": "search"}, lambda s, d: s.template == "search"),
    "version": ({"version": OLD[:8]}, lambda s, d: s.version == OLD),
    "version of a template": ({"template": "support", "version": OLD}, lambda s, d: s.version == OLD),
    "tenant": ({"tenant": "globex"}, lambda s, d: s.tenant == "globex"),
    "cause": ({"cause": "new_content"}, lambda s, d: d is not None and d.cause == "new_content"),
    "hit range": ({"hit_min": "10", "hit_max": "60"}, lambda s, d: 10 <= _hit(s) <= 60),
    "missed only": ({"missed": "true"}, lambda s, d: d is not None and _reusable_lost(d) > 0),
    "several": (
        {"server": "vllm-b", "tenant": "acme", "hit_min": "1"},
        lambda s, d: (s.server, s.tenant) == ("vllm-b", "acme") and s.cached_tokens > 0,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", FILTERS)
def test_each_filter_narrows_to_the_requests_it_names(signed_in: Client, name: str) -> None:
    sent = record_traffic()
    diagnoses = {d.request_id: d for d in RequestDiagnosis.objects.all()}
    params, keeps = FILTERS[name]
    expected = newest_first([s for s in sent if keeps(s, diagnoses.get(s.request_id))])
    assert 0 < len(expected) < len(sent)
    assert listed(signed_in, **params) == expected


def test_the_window_ends_before_until_and_leaves_out_what_is_older(signed_in: Client) -> None:
    sent = record_traffic()
    until = max(s.arrived_at for s in sent)
    expected = [s for s in sent if until - timedelta(minutes=15) <= s.arrived_at < until]
    assert 0 < len(expected) < len(sent) - 1
    assert listed(signed_in, window="15m", until=until.isoformat()) == newest_first(expected)
    # Another zone's clock, and pages that pin the window's end in UTC as they follow each other.
    elsewhere = until.astimezone(timezone(timedelta(hours=2))).isoformat()
    assert listed(signed_in, window="15m", until=elsewhere, limit="3") == newest_first(expected)


def test_pages_visit_every_row_once_in_order_through_equal_timestamps(signed_in: Client) -> None:
    sent = record_traffic(count=45)
    assert len({s.arrived_at for s in sent}) < len(sent)  # ties to break across page ends
    pages = []
    answer = signed_in.get(API, {"limit": "4"}).json()
    while True:
        pages.append([(row["server"], row["request_id"]) for row in answer["items"]])
        if not answer["next"]:
            break
        answer = signed_in.get(answer["next"]).json()
    assert [len(page) for page in pages] == [4] * 11 + [1]
    assert [row for page in pages for row in page] == newest_first(sent)


def test_the_page_follows_its_next_link_to_the_last_row(signed_in: Client) -> None:
    sent = record_traffic(count=PAGE_SIZE + 12)
    seen: list[str] = []
    url = "/requests/"
    while url:
        html = signed_in.get(url).content.decode()
        seen += re.findall(r"<code>(req-\d+)</code>", html)
        found = re.search(r'<a href="([^"]+)" hx-get="\1"[^>]*rel="next"', html)
        url = found.group(1).replace("&amp;", "&") if found else ""
    assert seen == [request_id for _, request_id in newest_first(sent)]


def test_a_cursor_is_refused_under_other_filters(signed_in: Client) -> None:
    record_traffic()
    first = signed_in.get(API, {"server": "vllm-a", "limit": "3"}).json()
    assert first["cursor"]
    other = signed_in.get(API, {"server": "vllm-b", "limit": "3", "cursor": first["cursor"]})
    assert other.status_code == 400 and other.json()["code"] == "bad_cursor"
    page = signed_in.get("/requests/", {"server": "vllm-b", "cursor": first["cursor"]})
    assert page.status_code == 400
    assert "other filters" in page.content.decode() and "req-" not in page.content.decode()
    # The same filters and window: accepted, and its rows are vllm-a's alone.
    same = signed_in.get(first["next"]).json()
    assert same["items"] and {row["server"] for row in same["items"]} == {"vllm-a"}


def _token(document: str) -> str:
    return base64.urlsafe_b64encode(document.encode()).decode().rstrip("=")


BAD = {
    "cursor not base64": {"cursor": "%%%"},
    "cursor not json": {"cursor": _token("not json")},
    "cursor a list": {"cursor": _token("[1, 2]")},
    "cursor without zone": {"cursor": _token('{"a": "2026-01-01T00:00", "s": 1, "r": "x", "f": "0"}')},
    "cursor wrong types": {"cursor": _token('{"a": "2026-01-01T00:00Z", "s": "1", "r": 5, "f": "0"}')},
    "hit not a number": {"hit_min": "lots"},
    "hit above 100": {"hit_max": "150"},
    "hit range upside down": {"hit_min": "80", "hit_max": "20"},
    "unknown window": {"window": "2y"},
    "until not a time": {"until": "yesterday"},
    "unknown server": {"server": "nosuch"},
    "unknown template": {"template": "nosuch"},
    "version not hex": {"version": "zzzz"},
    "no such version": {"version": "ffff0000"},
    "unknown cause": {"cause": "gremlins"},
    "tenant too long": {"tenant": "t" * 500},
}  # fmt: skip


@pytest.mark.parametrize("name", BAD)
def test_bad_filters_and_cursors_are_a_400_with_a_code(signed_in: Client, name: str) -> None:
    record_traffic(count=3)
    api = signed_in.get(API, BAD[name])
    assert api.status_code == 400, api.content
    assert api.json()["code"] in ("bad_filter", "bad_cursor") and api.json()["message"]
    page = signed_in.get("/requests/", BAD[name])
    assert page.status_code == 400
    assert "cannot be read" in page.content.decode() and "req-000" not in page.content.decode()


@pytest.mark.parametrize("limit", ["0", "201", "ten"])
def test_a_bad_page_size_is_a_400(signed_in: Client, limit: str) -> None:
    answer = signed_in.get(API, {"limit": limit})
    assert answer.status_code == 400 and "limit" in answer.json()["fields"]


def test_an_htmx_request_gets_the_rows_and_a_next_link_that_works_without_htmx(signed_in: Client) -> None:
    record_traffic(count=PAGE_SIZE + 1)
    html = signed_in.get("/requests/", {"tenant": "acme"}, headers={"HX-Request": "true"}).content.decode()
    assert html.lstrip().startswith('<section id="request-rows"') and "<html" not in html
    link = re.search(r'<a href="([^"]+)" hx-get="([^"]+)"', html)
    assert link is None or link.group(1) == link.group(2)
    page = signed_in.get("/requests/", {"tenant": "acme"}).content.decode()
    assert 'id="id_tenant"' in page and 'value="acme"' in page  # the state is in the form and the URL


def test_rows_say_which_ttft_is_which_and_link_to_the_request(signed_in: Client) -> None:
    sent = record_traffic(count=3)
    html = signed_in.get("/requests/").content.decode()
    assert "TTFT client" in html and "TTFT vLLM" in html
    newest = max(sent, key=lambda s: (s.arrived_at, s.request_id))
    assert f'href="/requests/{newest.server}/{newest.request_id}/?at=' in html  # its arrival: ids may repeat


def test_the_list_api_gives_no_prompt_content_even_to_readers(reader: Client) -> None:
    record_traffic(count=3)
    answer = reader.get(API).json()
    assert answer["items"] and all("token_ids" not in row for row in answer["items"])


def _detail_of(sent: list[Sent]) -> Sent:
    """The latest request with two blocks cached (earlier requests on its server to compare with)."""
    return [s for s in sent if s.cached_tokens == 2 * BLOCK][-1]


def test_the_request_page_shows_its_chain_cause_and_the_request_to_compare_with(signed_in: Client) -> None:
    sent = record_traffic(count=6)
    item = _detail_of(sent)
    html = signed_in.get(f"/requests/{item.server}/{item.request_id}/").content.decode()
    chain = html[
        html.index('<table class="chain">') : html.index("</table>", html.index('<table class="chain">'))
    ]
    assert chain.count("<tr") == 1 + item.prompt_tokens // BLOCK  # a head row and one per full block
    reused_blocks = item.cached_tokens // BLOCK
    assert chain.count('<td class="yes">yes</td>') >= reused_blocks
    assert 'name="b_previous"' in html and "Compare with it" in html
    assert "Funnel" in html and "TTFT as vLLM measured it" in html


def test_prompt_token_ids_only_for_readers_and_within_retention(
    signed_in: Client, reader: Client, settings: Any
) -> None:
    sent = record_traffic(count=6)
    item = _detail_of(sent)
    page, api = f"/requests/{item.server}/{item.request_id}/", f"{API}/{item.server}/{item.request_id}"
    assert 'class="tokens"' not in signed_in.get(page).content.decode()
    assert signed_in.get(api).json()["token_ids"] is None
    reader_page = reader.get(page).content.decode()
    assert 'class="tokens"' in reader_page and '<pre class="prompt">' in reader_page
    assert len(reader.get(api).json()["token_ids"]) == item.prompt_tokens
    settings.PREFIXSCOPE_HASH_ONLY = True  # retention keeps no token ids now
    assert 'class="tokens"' not in reader.get(page).content.decode()
    assert reader.get(api).json()["token_ids"] is None


def test_the_request_api_answers_a_404_with_a_code_for_an_unknown_request(signed_in: Client) -> None:
    answer = signed_in.get(f"{API}/vllm-a/no-such-request")
    assert answer.status_code == 404 and answer.json()["code"] == "not_found"


def test_the_request_api_names_the_previous_request_for_compare(signed_in: Client) -> None:
    sent = record_traffic(count=6)
    item = _detail_of(sent)
    answer = signed_in.get(f"{API}/{item.server}/{item.request_id}").json()
    assert answer["cause"] is not None or answer["diagnosed"]
    earlier = [s for s in sent if s.server == item.server and s.arrived_at < item.arrived_at]
    assert (answer["previous"] is None) == (not earlier)
    assert len(answer["block_hashes"]) == item.prompt_tokens // BLOCK
    assert answer["client_ttft_seconds"] > answer["server_ttft_seconds"]


def test_the_explorer_asks_for_a_login(client: Client) -> None:
    assert client.get("/requests/").status_code == 302
    assert client.get(API).status_code == 401
