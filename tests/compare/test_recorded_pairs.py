"""Comparisons of recorded requests give what vLLM reported for the captured traffic, on the page too."""

import re

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from app.compare import selectors
from app.compare.results import Result, comparison_result
from app.compare.services import ComparisonError, SideInput, create_comparison
from app.fleet.models import Server
from app.traffic.models import RequestRecord
from tests.compare.conftest import Record, capture, prompt_reader
from tests.support.captures import CAPTURED_PAIRS

pytestmark = pytest.mark.django_db


def _result(a_key: selectors.RecordKey, b_key: selectors.RecordKey) -> Result:
    compared = create_comparison(a=SideInput(record=a_key), b=SideInput(record=b_key), now=timezone.now())
    return comparison_result(compared.comparison, compared.sides, now=timezone.now())


@pytest.mark.parametrize(
    ("first", "later", "blocked_by"),
    CAPTURED_PAIRS,
)
def test_recorded_pairs_reuse_the_tokens_vllm_reported(
    record: Record, first: str, later: str, blocked_by: tuple[str, ...]
) -> None:
    reported = capture(later)["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]

    result = _result(record(first, offset=1), record(later, offset=2))

    assert result.divergence is not None
    assert result.divergence.reusable_tokens == reported
    assert result.divergence.blocked_by == blocked_by
    assert result.block_size == 32  # the recorded server's


def test_the_timestamp_pair_reuses_nothing_and_diverges_at_token_7(record: Record) -> None:
    result = _result(record("timestamp-top-1", offset=1), record("timestamp-top-2", offset=2))

    assert result.divergence is not None
    assert result.divergence.reusable_tokens == 0
    assert result.divergence.first_divergence == 7
    assert [(e.kind, e.b_start) for e in result.divergence.edits] == [("replaced", 7), ("replaced", 12)]


def test_the_timestamp_pair_page_marks_token_7_and_both_edits(record: Record, signed_in: Client) -> None:
    a, b = record("timestamp-top-1", offset=1), record("timestamp-top-2", offset=2)
    compared = create_comparison(a=SideInput(record=a), b=SideInput(record=b), now=timezone.now())

    html = signed_in.get(compared.comparison.get_absolute_url()).content.decode()

    assert re.search(r'id="first-divergence" data-first-divergence="7"', html)
    assert 'id="edit-0"' in html and 'id="edit-1"' in html
    assert "first divergence at token 7" in html
    assert re.search(r'id="reusable-tokens">0<', html)
    assert "recorded token ids (server vllm-cpu)" in html


def test_different_salts_block_all_reuse_and_show_the_salt_row_in_red(
    record: Record, signed_in: Client
) -> None:
    a, b = record("salt-a-1", offset=1), record("salt-b-1", offset=2)
    compared = create_comparison(a=SideInput(record=a), b=SideInput(record=b), now=timezone.now())

    html = signed_in.get(compared.comparison.get_absolute_url()).content.decode()

    salt_row = re.search(r'<tr id="compat-tenant_salt"([^>]*)>(.*?)</tr>', html)
    assert salt_row is not None
    assert 'class="mismatch blocks"' in salt_row.group(1)
    assert "blocks all reuse" in salt_row.group(2)
    assert 'id="blocked-by"' in html and "tenant_salt" in html
    model_row = re.search(r'<tr id="compat-model"([^>]*)>', html)
    assert model_row is not None and "mismatch" not in model_row.group(1)
    # The same token ids, under other salts: block 0 has a different hash on each side.
    hashes = re.findall(r"<code>([0-9a-f]{16})</code>", html)
    assert len(hashes) == 2 and hashes[0] != hashes[1]


@pytest.mark.parametrize(
    ("between", "server"),
    [("salt-b-1", "vllm-cpu"), ("salt-a-1", "vllm-cpu-2")],
    ids=["another tenant", "another server"],
)
def test_compare_with_previous_takes_the_request_vllm_could_reuse_from(
    record: Record, other_server: Server, signed_in: Client, between: str, server: str
) -> None:
    """salt-a-2 reused 160 tokens of salt-a-1 (tenant-a, on the same server). A request of the same
    template that arrived in between, of another tenant or on another server, is not what it reused."""
    first = record("salt-a-1", offset=1)
    record(between, offset=2, server=Server.objects.get(name=server))
    later = record("salt-a-2", offset=3)

    response = signed_in.post("/compare/", {"mode": "records", "b_previous": str(later)}, follow=True)

    html = response.content.decode()
    reported = capture("salt-a-2")["response"]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert re.search(r'id="reusable-tokens">([\d,]+)<', html)[1] == str(reported)  # type: ignore[index]
    assert 'id="blocked-by"' not in html
    assert f"request {first.request_id} on vllm-cpu," in html


def test_compare_with_previous_says_when_nothing_came_before_on_the_server_under_the_salt(
    record: Record, other_server: Server, signed_in: Client
) -> None:
    record("salt-a-1", offset=1, server=other_server)
    record("salt-b-1", offset=2)
    only = record("salt-a-2", offset=3)

    html = signed_in.post("/compare/", {"mode": "records", "b_previous": str(only)}).content.decode()

    assert "no earlier request on its server under its cache salt and model" in html


def test_two_picked_requests_make_a_comparison(record: Record, signed_in: Client) -> None:
    a, b = record("salt-a-1", offset=1), record("salt-a-2", offset=2)

    response = signed_in.post("/compare/", {"mode": "records", "a": str(a), "b": str(b)}, follow=True)

    html = response.content.decode()
    assert re.search(r'id="reusable-tokens">160<', html)


def test_the_request_explorer_lists_recent_requests_with_compare_links(
    record: Record, signed_in: Client
) -> None:
    key = record("timestamp-top-2", offset=1)

    html = signed_in.get("/compare/").content.decode()

    assert key.request_id in html
    assert f'name="b_previous" value="{key}"' in html


def test_an_unknown_request_is_refused() -> None:
    missing = selectors.RecordKey(1, "nope", timezone.now())
    with pytest.raises(ComparisonError):
        create_comparison(a=SideInput(record=missing), b=SideInput(record=missing), now=timezone.now())


def test_requests_whose_token_ids_are_gone_compare_by_block_hashes(record: Record, signed_in: Client) -> None:
    a, b = record("shared-prefix-the", offset=1), record("shared-prefix-I", offset=2)
    RequestRecord.objects.filter(request_id__in=[a.request_id, b.request_id]).update(token_ids=None)
    compared = create_comparison(a=SideInput(record=a), b=SideInput(record=b), now=timezone.now())

    result = comparison_result(compared.comparison, compared.sides, now=timezone.now())
    html = signed_in.get(compared.comparison.get_absolute_url()).content.decode()

    assert result.divergence is None and result.block_match is not None
    assert result.block_match.reusable_tokens == 160  # as vLLM reported, from the stored hashes alone
    assert result.block_match.first_divergent_block == 5  # the question starts at token 185
    assert "Block precision" in html and 'class="t ' not in html


@override_settings(PREFIXSCOPE_REQUEST_RETENTION_DAYS=30)
def test_a_permalink_to_a_dropped_request_says_what_is_missing(record: Record, signed_in: Client) -> None:
    a, b = record("salt-a-1", offset=1), record("salt-a-2", offset=2)
    compared = create_comparison(a=SideInput(record=a), b=SideInput(record=b), now=timezone.now())
    RequestRecord.objects.filter(request_id=a.request_id).delete()

    html = signed_in.get(compared.comparison.get_absolute_url()).content.decode()

    assert "Cannot compare" in html and "no longer kept" in html


def test_without_read_prompt_text_the_page_shows_where_they_part_but_no_token(
    record: Record, without_prompts: Client
) -> None:
    """A recorded request's prompt is tenant data: a viewer without prompts.read_prompt_text gets the
    divergence block by block (index, tokens, hashes, counts) and the edits' positions, never a token's
    text or id; a holder gets the tokens as before."""
    a, b = record("timestamp-top-1", offset=1), record("timestamp-top-2", offset=2)
    compared = create_comparison(a=SideInput(record=a), b=SideInput(record=b), now=timezone.now())
    url = compared.comparison.get_absolute_url()

    hidden = without_prompts.get(url).content.decode()
    opened = without_prompts.get(f"{url}?side=b&start=0&end=7", HTTP_HX_REQUEST="true").content.decode()

    for html in (hidden, opened):
        assert 'class="t ' not in html and "data-first-divergence" not in html
        assert not re.search(r"· id \d+", html) and "Current" not in html and "Acme" not in html
    assert 'id="tokens-withheld"' in hidden
    rows = re.findall(
        r'<tr><td class="num">(\d+)</td><td>([\d,]+)\u2013([\d,]+)</td><td class="num">(\d+)</td>'
        r"<td><code>([0-9a-f]{16})</code></td><td><code>([0-9a-f]{16})</code></td>",
        hidden,
    )
    assert [int(r[0]) for r in rows] == list(range(len(rows))) and len(rows) >= 2
    assert rows[0][1:4] == ("0", "31", "32") and rows[0][4] != rows[0][5]  # block 0 already differs
    assert "token 7" in hidden and "replaced a 7 (1 token) by b 7 (1 token)" in hidden  # positions only

    reader = Client()
    reader.force_login(prompt_reader("reader"))
    shown = reader.get(url).content.decode()
    assert 'data-first-divergence="7"' in shown and re.search(r"· id \d+", shown)
    assert 'id="tokens-withheld"' not in shown


def test_the_compare_api_answers_positions_and_hashes_without_token_ids(
    record: Record, without_prompts: Client
) -> None:
    a, b = record("timestamp-top-1", offset=1), record("timestamp-top-2", offset=2)
    compared = create_comparison(a=SideInput(record=a), b=SideInput(record=b), now=timezone.now())

    found = without_prompts.get(f"/api/v1/compare/{compared.comparison.slug}?include_blocks=true").json()

    assert found["first_divergence"] == 7 and len(found["blocks"]["b"]) >= 2
    assert "Current" not in str(found) and "token_ids" not in str(found)
