"""The cache killers of a template's recent traffic: found by the scheduled task in the records as the
REST ingest stores them, in token mode and in hash-only mode, per salt, and replaced at each run."""

import json
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings
from django.test import Client, override_settings
from django.utils import timezone

from app.celery import celery_app
from app.compare.killers import find_all_killers
from app.compare.tasks import find_killers
from app.fleet.models import Server
from app.prompts.killers import SampleKey
from app.prompts.models import CacheKiller, Template
from app.traffic.models import RequestRecord
from tests.support.killer_traffic import ingest, sim, timestamp_token, volatile_top
from tests.support.rendered_prompts import BLOCK_SIZE

pytestmark = pytest.mark.django_db
__all__ = ["sim"]  # the fixture


def test_a_timestamp_moved_to_the_top_is_a_timestamp_killer_at_its_first_token(
    client: Client, token: str, sim: Server
) -> None:
    ingest(client, token, volatile_top(), server=sim)
    find_killers()  # the task, as beat runs it

    (killer,) = CacheKiller.objects.all()
    assert killer.template == Template.objects.get(name="support")
    assert (killer.kind, killer.mode, killer.salt_hash) == ("timestamp", "tokens", "")
    assert (killer.position_token, killer.block_index) == (timestamp_token(), timestamp_token() // BLOCK_SIZE)
    assert (killer.model, killer.block_size) == ("tiny", BLOCK_SIZE)
    faulted = sum(p.text.startswith("Current time:") for p in volatile_top())
    assert killer.requests_affected == faulted and killer.tokens_lost > 100 * faulted
    assert killer.suggestion.startswith("Move the timestamp")
    # The samples are requests that vary there, by their keys: never their text.
    keys = [SampleKey.of(stored) for stored in killer.samples]
    assert 2 <= len(keys) <= 5
    stored = {(r.server_id, r.request_id, r.arrived_at): r for r in RequestRecord.objects.all()}
    assert all((k.server_id, k.request_id, k.arrived_at) in stored for k in keys)
    assert "Current time" not in json.dumps(killer.samples)


def test_hash_only_records_give_a_killer_to_the_block(client: Client, token: str, sim: Server) -> None:
    with override_settings(PREFIXSCOPE_HASH_ONLY=True):
        ingest(client, token, volatile_top(), server=sim)
        assert not RequestRecord.objects.filter(token_ids__isnull=False).exists()
        find_killers()

    (killer,) = CacheKiller.objects.all()
    assert (killer.mode, killer.position_token, killer.kind) == ("hashes", None, "unclassified")
    assert killer.block_index == timestamp_token() // BLOCK_SIZE
    assert killer.straddle_tokens is None and killer.samples


def test_each_salt_is_searched_on_its_own(client: Client, token: str, sim: Server) -> None:
    # Two tenants' salts: their blocks never share, so each salt's requests fan out on their own.
    traffic = volatile_top()
    ingest(client, token, traffic[0::2], server=sim, salt="acme")
    ingest(client, token, traffic[1::2], server=sim, salt="globex")
    find_killers()

    killers = CacheKiller.objects.order_by("salt_hash")
    salts = {r.salt_hash for r in RequestRecord.objects.all()}
    assert len(salts) == 2 and {k.salt_hash for k in killers} == salts
    assert all((k.kind, k.position_token) == ("timestamp", timestamp_token()) for k in killers)
    for killer in killers:
        keys = [SampleKey.of(stored) for stored in killer.samples]
        assert set(RequestRecord.objects.filter(request_id__in=[k.request_id for k in keys]).values_list(
            "salt_hash", flat=True
        )) == {killer.salt_hash}  # fmt: skip


def test_a_rerun_replaces_the_killers_and_an_empty_window_clears_them(
    client: Client, token: str, sim: Server
) -> None:
    ingest(client, token, volatile_top(), server=sim)
    find_killers()
    first = list(CacheKiller.objects.values_list("pk", "position_token", "tokens_lost"))
    find_killers()
    find_killers()
    again = list(CacheKiller.objects.values_list("pk", "position_token", "tokens_lost"))
    assert len(again) == len(first) == 1
    assert again[0][1:] == first[0][1:] and again[0][0] != first[0][0]  # replaced, not added

    later = timezone.now() + timedelta(minutes=settings.PREFIXSCOPE_KILLER_WINDOW_MINUTES + 5)
    assert find_all_killers(now=later) == 0
    assert not CacheKiller.objects.exists()


def test_only_the_most_recent_requests_of_the_window_are_read(
    client: Client, token: str, sim: Server, settings: Any
) -> None:
    ingest(client, token, volatile_top(), server=sim)
    # The last 40 requests all start with the moved timestamp line: read alone, they share its date
    # and fan out at the time of day, further into the line.
    settings.PREFIXSCOPE_KILLER_MAX_REQUESTS = 40
    find_killers()
    (killer,) = CacheKiller.objects.all()
    assert (killer.requests, killer.kind) == (40, "timestamp")
    assert killer.position_token is not None and timestamp_token() < killer.position_token < BLOCK_SIZE
    newest = set(RequestRecord.objects.order_by("-arrived_at").values_list("request_id", flat=True)[:40])
    assert {SampleKey.of(stored).request_id for stored in killer.samples} <= newest


def test_the_search_runs_every_five_minutes_under_its_task_name() -> None:
    scheduled = settings.CELERY_BEAT_SCHEDULE["find-killers"]
    assert (scheduled["task"], scheduled["schedule"]) == ("compare.find_killers", 300.0)
    assert celery_app.tasks["compare.find_killers"].name == find_killers.name == "compare.find_killers"
