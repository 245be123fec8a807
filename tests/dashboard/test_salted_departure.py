"""A salted request whose first block another tenant's salt had, and whose prompt departs from its own
salt's earlier prompts inside that block (a timestamp at the top, two tenants in the same minute): the
request page says where its prompt-changed loss starts, consistent with the tokens it lists as lost to
the salt, and the token where it departs from its template's earlier prompts under its salt."""

import random
import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.traffic.models import RequestDiagnosis
from tests.support.factories import a_server, facts, ingested
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db

BLOCK = 16


def _prompts() -> tuple[list[int], list[int], list[int]]:
    """acme's earlier prompt, globex's prompt and acme's later one: acme's two differ at token 14 (the
    timestamp), the later one and globex's share their first block and part at token 20."""
    rng = random.Random(3)
    head = [rng.randrange(1, 50_000) for _ in range(14)]
    earlier = head + [rng.randrange(1, 50_000) for _ in range(4 * BLOCK - 14)]
    now_stamp = [50_001, 50_002]
    globex = head + now_stamp + [rng.randrange(1, 50_000) for _ in range(4 * BLOCK)]
    later = globex[:20] + [rng.randrange(1, 50_000) for _ in range(4 * BLOCK - 20)]
    return earlier, globex, later


def test_the_request_page_says_where_the_prompt_changed_loss_starts_after_a_block_lost_to_the_salt(
    client: Client,
) -> None:
    a_server(name="vllm-a", block_size=BLOCK, model="m")
    earlier, globex, later = _prompts()
    now = timezone.now()
    sent = [
        ("acme-1", "acme", "salt-acme", earlier),
        ("globex-1", "globex", "salt-globex", globex),
        ("acme-2", "acme", "salt-acme", later),
    ]
    ingested(
        *(
            facts(
                request_id=request_id,
                arrived_at=now - timedelta(seconds=30 - 10 * n),
                server="vllm-a",
                model="m",
                tenant=tenant,
                template="support",
                cache_salt=salt,
                prompt_tokens=len(tokens),
                cached_tokens=0,
                prompt_token_ids=tokens,
            )
            for n, (request_id, tenant, salt, tokens) in enumerate(sent)
        ),
        source="gateway",
        now=now,
    )
    diagnose_requests(now=now + timedelta(minutes=2))
    found = RequestDiagnosis.objects.get(request_id="acme-2")
    client.force_login(fleet_viewer("engineer"))

    html = client.get("/requests/vllm-a/acme-2/").content.decode()

    # What the diagnosis found: block 0 lost to the salt (globex had its tokens), the rest to the prompt
    # changing; against acme's earlier prompt it departs at token 14, inside block 0.
    assert [(loss["cause"], loss["first_token"]) for loss in found.losses][:2] == [
        ("salt", 0),
        ("prompt_changed", BLOCK),
    ]
    assert found.cause == "prompt_changed" and found.diverged_at == 14
    cause = re.search(r"<tr><th>Cause</th><td>(.*?)</td></tr>", html, re.S)
    assert cause is not None
    text = re.sub(r"<[^>]+>", "", cause.group(1))
    assert "departs at token 14," not in text
    assert f"Prompt changed from token {BLOCK}" in text
    assert "under its salt at token 14, in block 0" in text and "lost to the tenant salt" in text

    # The lists say where its prompt-changed loss starts too, never a token said lost to the salt.
    assert found.changed_from == BLOCK
    listed = client.get("/requests/").content.decode()
    row = listed[listed.index("acme-2") : listed.index("</tr>", listed.index("acme-2"))]
    assert f'Prompt changed <span class="muted">at {BLOCK}</span>' in row
    fleet = client.get("/").content.decode()
    miss = fleet[fleet.index(">acme-2<") : fleet.index("</tr>", fleet.index(">acme-2<"))]
    assert f"Prompt changed at token {BLOCK}" in miss
