"""The demo's `volatile_top` regression: the cache killers found with it frozen onto it (later searches
do not rewrite them), and its suspect's diff with the moved line marked, on its page."""

from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from app.compare.killers import find_all_killers, find_template_killers
from app.fleet.models import Server
from app.prompts.models import CacheKiller
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from tests.regressions.test_detection import demo
from tests.regressions.virtual_fleet import VirtualRun, run_virtually
from tests.tokens import reader_bearer
from tests.users import fleet_viewer

pytestmark = pytest.mark.django_db(transaction=True)
MOVED_LINE = "Current time: {{ now }} | Request ID: {{ request_id }}"


@pytest.fixture
def found(tmp_path: Path) -> VirtualRun:
    definition = demo(duration=540, timeline=demo()["timeline"][:1])  # volatile_top at minute 5
    run = run_virtually(definition, tmp_path, every_minute=lambda now: detect_regressions(now=now))
    # The killer search decodes with the bundled GPT-2 tokenizer, the simulator's, rather than ask
    # the virtual servers' /detokenize (their addresses are not on this machine).
    Server.objects.update(base_url="")
    return run


def page(regression: Regression, *, reads_prompts: bool) -> str:
    user = fleet_viewer("reader" if reads_prompts else "engineer")
    if reads_prompts:
        user.user_permissions.add(Permission.objects.get(codename="read_prompt_text"))
    client = Client()
    client.force_login(user)
    response = client.get(reverse("regressions:detail", args=[regression.pk]))
    assert response.status_code == 200
    return response.content.decode()


def test_the_killers_found_with_it_stay_with_it_whatever_later_searches_find(found: VirtualRun) -> None:
    regression = Regression.objects.get()
    assert "killers" not in regression.evidence  # no search since the change when it opened
    now = timezone.now()
    find_all_killers(now=now)
    detect_regressions(now=now)  # the next detection freezes what the search found

    regression.refresh_from_db()
    frozen = regression.evidence["killers"]
    at = regression.evidence["pair"]["diverged_at"]
    timestamp = next(k for k in frozen if k["kind"] == "timestamp")
    assert timestamp["position_token"] <= at < timestamp["position_token"] + timestamp["block_size"]
    assert timestamp["found_at"] == timestamp["seen_at"] == now.isoformat()
    # Keys of the sample requests, never their text.
    assert all(set(sample) == {"server_id", "request_id", "arrived_at"} for sample in timestamp["samples"])

    # A later search over a window the traffic has left finds nothing: the template's killers go,
    # the regression's stay.
    assert regression.template is not None
    find_template_killers(template_id=regression.template.pk, now=now + timedelta(hours=2))
    assert not CacheKiller.objects.exists()
    detect_regressions(now=now + timedelta(minutes=1))
    regression.refresh_from_db()
    assert regression.evidence["killers"] == frozen

    bearer = reader_bearer()
    served = Client().get(f"/api/v1/regressions/{regression.pk}", headers=bearer).json()["killers"]
    first = served[0]  # the one nearest the pair's divergence
    assert (first["kind"], first["position_token"], first["samples"]) == (
        "timestamp",
        timestamp["position_token"],
        None,
    )
    assert served[0]["sample_requests"][0]["server"].startswith("virtual-")

    shown = page(regression, reads_prompts=True)
    assert "Cache killers found with it" in shown
    assert f"token {timestamp['position_token']} (block {timestamp['block_index']})" in shown
    assert "Timestamp or date" in shown
    assert '<code class="sample">' in shown  # decoded for a reader of prompts
    engineers = page(regression, reads_prompts=False)
    assert '<code class="sample">' not in engineers
    # Its sample requests, linked for anyone who sees them, as on the template's page.
    sample = timestamp["samples"][0]
    server = Server.objects.get(pk=sample["server_id"]).name
    link = reverse("dashboard:request-detail", args=[server, sample["request_id"]])
    assert f'<a href="{link}">' in shown and f'<a href="{link}">' in engineers


def test_the_suspects_diff_marks_the_line_that_moved_at_both_ends(found: VirtualRun) -> None:
    shown = page(Regression.objects.get(), reads_prompts=False)
    assert f'class="diff-moved-to">+{MOVED_LINE}<a class="diff-move"' in shown
    assert f'class="diff-moved-from">-{MOVED_LINE}<a class="diff-move"' in shown
    assert "moved here from below" in shown and "moved above" in shown
    assert '" class="diff-added"' not in shown and '" class="diff-removed"' not in shown
