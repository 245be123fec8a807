"""The Compare page: long prompts fold, folds open through htmx, token text is inert, permalinks last."""

import re
from datetime import timedelta

import pytest
from django.test import Client, override_settings
from django.utils import timezone

from app.compare import selectors
from app.compare.models import Comparison, ComparisonSide
from app.compare.results import comparison_result
from app.compare.services import SideInput, create_comparison, expire_token_ids
from app.compare.tokenization import Prompt, Tokenized
from app.fleet.models import Server
from tests.compare.conftest import Record, capture, prompt_ids

pytestmark = pytest.mark.django_db

CHIP = 'class="t '


def _long_pair() -> tuple[list[int], list[int]]:
    """A captured prompt repeated to 128K tokens, and a copy with one token changed in the middle."""
    a = prompt_ids("salt-a-1") * 686  # 131,026 tokens
    b = list(a)
    b[65_000] = 50_000
    return a, b


def _without_csrf(html: str) -> str:
    return re.sub(r'"X-CSRFToken": "[^"]+"|name="csrfmiddlewaretoken" value="[^"]+"', "", html)


def _ids(a: list[int], b: list[int], **fields: object) -> Comparison:
    compared = create_comparison(
        a=SideInput(prompt=Prompt(token_ids=tuple(a))),
        b=SideInput(prompt=Prompt(token_ids=tuple(b))),
        now=timezone.now(),
        **fields,  # type: ignore[arg-type]
    )
    assert compared.saved
    return compared.comparison


def test_the_compare_pages_ask_for_a_login(client: Client) -> None:
    comparison = _ids([1, 2], [1, 3])
    for url in ("/compare/", comparison.get_absolute_url()):
        response = client.get(url)
        assert response.status_code == 302 and response["Location"].startswith("/login/")


def test_the_nav_links_to_compare(signed_in: Client) -> None:
    assert 'href="/compare/">Compare</a>' in signed_in.get("/").content.decode()


def test_a_128k_token_pair_shows_fold_lines_not_thousands_of_chips(record: Record, signed_in: Client) -> None:
    a, b = _long_pair()
    keys = record("salt-a-1", offset=1, token_ids=a), record("salt-a-2", offset=2, token_ids=b)
    comparison = create_comparison(
        a=SideInput(record=keys[0]), b=SideInput(record=keys[1]), now=timezone.now()
    )

    html = signed_in.get(comparison.comparison.get_absolute_url()).content.decode()

    assert html.count(CHIP) < 400
    folds = re.findall(r'<a class="fold (\w+)" id="(fold-b-\d+)"[^>]*hx-get="([^"]+)"[^>]*>(.*?)</a>', html)
    assert len(folds) == 2
    css, dom_id, hx_get, text = folds[0]
    assert css == "reuse" and dom_id == "fold-b-32"
    assert "64,928 identical tokens, 2,029 blocks (reusable)" in text  # 32..64,960, blocks of 32
    assert f'href="{hx_get.replace("&", "&amp;")}#{dom_id}"'.replace("&amp;amp;", "&amp;") in html
    assert re.search(r'id="reusable-tokens">64,992<', html)  # 2,031 blocks of 32, then the change


def test_an_opened_fold_is_a_fragment_of_512_chips_and_a_fold_for_the_rest(signed_in: Client) -> None:
    a, b = _long_pair()
    comparison = _ids(a, b, block_size=32)

    fragment = signed_in.get(
        f"{comparison.get_absolute_url()}?side=b&start=32&end=64960", headers={"HX-Request": "true"}
    ).content.decode()

    assert "<html" not in fragment
    assert fragment.count(CHIP) == 512
    assert 'id="fold-b-32"' in fragment  # the first chip keeps the fold's id
    assert re.search(r'<a class="fold reuse" id="fold-b-544"[^>]*hx-get=', fragment)


def test_without_htmx_the_fold_link_opens_the_fold_in_the_whole_page(signed_in: Client) -> None:
    a, b = _long_pair()
    comparison = _ids(a, b, block_size=32)

    html = signed_in.get(f"{comparison.get_absolute_url()}?side=b&start=32&end=64960").content.decode()

    assert "<html" in html
    assert re.search(r'<span class="t reuse" id="fold-b-32"', html)
    assert 'id="fold-b-544"' in html


@pytest.mark.parametrize(
    "query", ["?side=b&start=0&end=999999999", "?side=c&start=0&end=5", "?side=b&start=x"]
)
def test_a_fold_out_of_range_gets_the_plain_page(signed_in: Client, query: str) -> None:
    comparison = _ids([1, 2, 3], [1, 2, 4])
    response = signed_in.get(comparison.get_absolute_url() + query, headers={"HX-Request": "true"})
    assert response.status_code == 200 and "<html" in response.content.decode()


def test_token_text_is_escaped(signed_in: Client) -> None:
    evil = Tokenized(
        token_ids=[1, 2, 3],
        token_strs=["<script>alert(1)</script>", '"><img src=x onerror=alert(2)>', "Ġok"],
        tokenizer_used="server vllm-0 /tokenize",
        tokenizer="tiny",
        server=None,
    )
    benign = Tokenized(
        token_ids=[1, 9, 3],
        token_strs=["Ġa", "Ġb", "Ġc"],
        tokenizer_used="server vllm-0 /tokenize",
        tokenizer="tiny",
        server=None,
    )
    comparison = Comparison.objects.create(slug="evil1234", block_size=16, created_at=timezone.now())
    for side, tokenized in (("a", benign), ("b", evil)):
        ComparisonSide.objects.create(
            comparison=comparison,
            side=side,
            source="text",
            token_ids=tokenized.token_ids,
            token_strs=tokenized.token_strs,
            tokenizer_used=tokenized.tokenizer_used,
            compatibility={"model": "tiny"},
        )

    html = signed_in.get(comparison.get_absolute_url()).content.decode()

    assert "<script>alert(1)" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&quot;&gt;&lt;img src=x onerror=alert(2)&gt;" in html


def test_a_pasted_pair_round_trips_through_its_permalink(signed_in: Client) -> None:
    form = {"mode": "prompts", "a_prompt": "Current time: 10:21:32\nYou are the support assistant.",
            "b_prompt": "Current time: 10:21:37\nYou are the support assistant.", "prompt_format": "text",
            "block_size": "4", "a_salt": "tenant-a", "b_salt": "tenant-a"}  # fmt: skip

    response = signed_in.post("/compare/", form)

    assert response.status_code == 302
    comparison = Comparison.objects.get()
    assert response["Location"] == comparison.get_absolute_url() == f"/compare/{comparison.slug}/"
    sides = {side.side: side for side in comparison.sides.all()}
    assert sides["a"].source == "text" and sides["a"].token_ids
    assert sides["a"].compatibility["tenant_salt"] != "tenant-a"  # only the salt's hash is kept
    first = signed_in.get(response["Location"]).content.decode()
    again = signed_in.get(response["Location"]).content.decode()
    assert _without_csrf(first) == _without_csrf(again)  # recomputed, the same
    result = comparison_result(comparison, selectors.comparison_sides(comparison), now=timezone.now())
    assert result.divergence is not None and result.divergence.first_divergence == 7
    assert re.search(r'data-first-divergence="7"', first)
    assert 'id="permalink"' in first


@pytest.mark.parametrize("prompt_format", ["auto", "text"])
def test_pasted_text_with_the_browsers_crlf_line_breaks_has_the_tokens_vllm_counted(
    signed_in: Client, captured_server: Server, prompt_format: str
) -> None:
    # A textarea's line breaks reach the server as CRLF: the timestamp prompts have two each.
    a, b = (
        capture(name)["request"]["prompt"].replace("\n", "\r\n")
        for name in ("timestamp-top-1", "timestamp-top-2")
    )
    form = {
        "mode": "prompts",
        "a_prompt": a,
        "b_prompt": b,
        "prompt_format": prompt_format,
        "server": "vllm-cpu",
    }

    response = signed_in.post("/compare/", form)

    assert response.status_code == 302
    sides = {side.side: side for side in Comparison.objects.get().sides.all()}
    assert sides["a"].tokenizer_used == "bundled GPT-2 (offline)"  # the captured server's own BPE
    a_ids, b_ids = sides["a"].token_ids or [], sides["b"].token_ids or []
    assert (len(a_ids), len(b_ids)) == (208, 207)  # as vLLM counted them
    assert (a_ids, b_ids) == (prompt_ids("timestamp-top-1"), prompt_ids("timestamp-top-2"))
    assert (
        "browsers send a text box's line breaks as <code>\\r\\n</code>"
        in signed_in.get("/compare/").content.decode()
    )


def test_token_ids_pasted_over_several_lines_are_taken_as_given(signed_in: Client) -> None:
    ids = prompt_ids("timestamp-top-1")
    pasted = "\r\n".join(" ".join(map(str, ids[i : i + 16])) for i in range(0, len(ids), 16))
    form = {"mode": "prompts", "a_prompt": pasted, "b_prompt": str(ids), "prompt_format": "token_ids"}

    assert signed_in.post("/compare/", form).status_code == 302
    assert [side.token_ids for side in Comparison.objects.get().sides.all()] == [ids, ids]


def test_a_permalink_answers_get_only(signed_in: Client) -> None:
    comparison = _ids([1, 2], [1, 3])

    assert signed_in.post(comparison.get_absolute_url()).status_code == 405


def test_a_token_of_other_whitespace_keeps_a_visible_chip(signed_in: Client) -> None:
    tokenized = Tokenized([1, 2, 3], ["Ġa", "\u00a0", "Ġc"], "server vllm-0 /tokenize", "tiny", None)
    comparison = Comparison.objects.create(slug="nbsp2345", block_size=16, created_at=timezone.now())
    for side in ("a", "b"):
        ComparisonSide.objects.create(
            comparison=comparison,
            side=side,
            source="text",
            token_ids=tokenized.token_ids,
            token_strs=tokenized.token_strs,
            tokenizer_used=tokenized.tokenizer_used,
            compatibility={"model": "tiny"},
        )

    html = signed_in.get(comparison.get_absolute_url()).content.decode()

    assert re.search(r'title="b 1 · id 2">⟨U\+00A0⟩</span>', html)


def test_an_unreadable_prompt_is_sent_back_with_the_reason(signed_in: Client) -> None:
    form = {"mode": "prompts", "a_prompt": "[1, 2", "b_prompt": "[1, 2]", "prompt_format": "token_ids"}

    html = signed_in.post("/compare/", form).content.decode()

    assert "not valid JSON" in html and not Comparison.objects.exists()


@override_settings(PREFIXSCOPE_HASH_ONLY=True)
def test_in_hash_only_mode_pasted_prompts_are_compared_but_not_kept(signed_in: Client) -> None:
    form = {
        "mode": "prompts",
        "a_prompt": "[1, 2, 3, 4]",
        "b_prompt": "[1, 2, 3, 5]",
        "prompt_format": "auto",
    }

    response = signed_in.post("/compare/", form)

    assert response.status_code == 200
    html = response.content.decode()
    assert "No permalink" in html and 'data-first-divergence="3"' in html
    assert not Comparison.objects.exists()


@override_settings(PREFIXSCOPE_TOKEN_RETENTION_DAYS=7)
def test_pasted_token_ids_past_retention_are_cleared_and_the_permalink_says_so(signed_in: Client) -> None:
    old = _ids([1, 2, 3], [1, 2, 4])
    Comparison.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=8))
    fresh = _ids([1, 2, 3], [1, 2, 4])

    html = signed_in.get(old.get_absolute_url()).content.decode()  # not yet cleared: refused at read time
    cleared = expire_token_ids(now=timezone.now())

    assert "Cannot compare" in html and "past their retention" in html
    assert cleared == 2
    assert ComparisonSide.objects.filter(comparison=fresh, token_ids__isnull=False).count() == 2


def test_an_unknown_permalink_is_a_404(signed_in: Client) -> None:
    assert signed_in.get("/compare/nosuchone/").status_code == 404


def test_the_explorer_filter_answers_htmx_with_the_request_list_only(
    record: Record, signed_in: Client
) -> None:
    record("salt-a-1", offset=1)

    html = signed_in.get("/compare/?server=vllm-cpu", headers={"HX-Request": "true"}).content.decode()

    assert html.lstrip().startswith('<div id="request-list">')
    assert "salt-a-1-1" in html
