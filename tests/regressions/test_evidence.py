"""The demo's `volatile_top` regression: the cache killers found with it frozen onto it (later searches
do not rewrite them), and its suspect's diff with the moved line marked, on its page."""

from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from app.compare.killers import find_all_killers, find_template_killers
from app.fleet.models import Server
from app.prompts.models import CacheKiller, Template
from app.regressions.evidence import before_after_pair
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.traffic.models import RequestRecord
from tests.regressions.test_detection import demo
from tests.support.tokens import reader_bearer
from tests.support.users import fleet_viewer
from tests.support.virtual_fleet import VirtualRun, run_virtually

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


def since_change(regression: Regression, killer: dict[str, Any]) -> bool:
    """Whether all the killer's sample requests came since the regression's change."""
    return all(datetime.fromisoformat(k["arrived_at"]) >= regression.changed_at for k in killer["samples"])


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
    # Searched in its own requests since the change while it was open (from its opening on).
    frozen = regression.evidence["killers"]
    at = regression.evidence["pair"]["diverged_at"]
    timestamp = next(k for k in frozen if k["kind"] == "timestamp")
    assert timestamp["block_index"] == at // timestamp["block_size"]  # the line the commit put on top
    assert all(since_change(regression, k) for k in frozen)
    assert timestamp["found_at"] <= timestamp["seen_at"] == regression.evidence["killers_searched_at"]
    # Keys of the sample requests, never their text.
    assert all(set(sample) == {"server_id", "request_id", "arrived_at"} for sample in timestamp["samples"])

    # A later search over a window the traffic has left finds nothing: the template's killers go,
    # the regression's stay.
    assert regression.template is not None
    later = timezone.now() + timedelta(hours=2)
    find_template_killers(template_id=regression.template.pk, now=later)
    assert not CacheKiller.objects.exists()
    detect_regressions(now=later)
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


def test_the_pair_is_the_last_request_before_the_suspect_and_its_first_wherever_the_drop_is_placed(
    found: VirtualRun,
) -> None:
    """The minute the rate fell may come before the suspect went live or after it (the live demo's
    did, and its pair had both requests on the bad commit, departing in the new line's seconds)."""
    regression = Regression.objects.get()
    suspect, template = regression.suspect_version, regression.template
    assert suspect is not None and template is not None
    first = RequestRecord.objects.filter(template_version=suspect).order_by("arrived_at").first()
    assert first is not None
    live = first.arrived_at.replace(second=0, microsecond=0)
    for changed_at in (
        live - timedelta(minutes=1),
        live,
        live + timedelta(minutes=1),
        live + timedelta(minutes=2),
    ):
        pair = before_after_pair(
            template.pk, changed_at=changed_at, now=timezone.now(), version_id=suspect.pk
        )
        before, after = (record_of(pair[side]) for side in ("before", "after"))
        assert after == first
        assert before.template_version_id not in (None, suspect.pk)
        between = RequestRecord.objects.filter(
            template=template,
            tenant=after.tenant,
            arrived_at__gt=before.arrived_at,
            arrived_at__lt=after.arrived_at,
        )
        assert not between.exists()  # the last one of its tenant before the suspect's first
        assert pair["diverged_at"] == 0  # where the commit departs: it put a new first line


def record_of(side: dict[str, Any]) -> RequestRecord:
    at = datetime.fromisoformat(side["arrived_at"])
    return cast(RequestRecord, RequestRecord.objects.get(request_id=side["request_id"], arrived_at=at))


def test_a_later_regression_of_the_template_has_its_own_pair_and_killers(tmp_path: Path) -> None:
    """The demo runs round after round: the template goes back to its first text, then breaks again
    (here sooner than a round, and in one repository). The killer search (every five minutes, as
    beat runs it) still holds the first round's requests when the second regression opens."""
    definition = demo()
    support = next(t for t in definition["templates"] if t["name"] == "support")
    timeline = [
        definition["timeline"][0],  # volatile_top at 300
        {"at": 540, "template": "support", "change": {"message": "revert", "text": support["text"]}},
        {"at": 1020, "template": "support", "change": {"fault": "volatile_top"}},
    ]

    def every_minute(now: datetime) -> None:
        detect_regressions(now=now)
        if now.minute % 5 == 0:
            Server.objects.update(base_url="")  # decoded with the bundled tokenizer
            find_all_killers(now=now)

    run = run_virtually(demo(duration=1320, timeline=timeline), tmp_path, every_minute=every_minute)
    first, second = Regression.objects.filter(template__name="support").order_by("changed_at")
    assert second.suspect_version is not None and second.suspect_version != first.suspect_version
    # Placed at the minute its suspect's first request arrived in (the deploy check's), which the
    # killer search's window and the pair must not confuse with the first round's.
    assert abs(second.changed_at - run.at(1020)) <= timedelta(minutes=1)

    before, after = (record_of(second.evidence["pair"][side]) for side in ("before", "after"))
    assert after == RequestRecord.objects.filter(template_version=second.suspect_version).earliest(
        "arrived_at"
    )
    assert before.template_version_id not in (None, second.suspect_version_id)
    assert second.evidence["pair"]["diverged_at"] == 0

    frozen = second.evidence["killers"]
    assert frozen and all(since_change(second, killer) for killer in frozen)


def test_a_killers_class_is_not_changed_by_a_later_search_of_the_same_versions_requests(
    found: VirtualRun,
) -> None:
    """Once found for a block of a compatibility record and a template version, a class stays: a
    later search decodes other requests (the live demo's told its timestamp line at token 0
    `rotating_examples` an hour later)."""
    template = Template.objects.get(name="support")
    now = timezone.now()
    find_template_killers(template_id=template.pk, now=now)
    told, other = CacheKiller.objects.filter(template=template, kind="timestamp").order_by("-tokens_lost")[:2]
    CacheKiller.objects.filter(pk=told.pk).update(kind="rotating_examples")  # as the first search told it

    find_template_killers(template_id=template.pk, now=now + timedelta(minutes=5))
    again = CacheKiller.objects.get(template=template, salt_hash=told.salt_hash, block_index=told.block_index)
    assert again.kind == "rotating_examples"
    assert CacheKiller.objects.get(template=template, salt_hash=other.salt_hash).kind == "timestamp"
