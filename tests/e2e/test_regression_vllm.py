"""Regressions in sequence on the real vLLM CPU server: a template commit that puts a timestamp at the
top of its prompts, its revert, a second commit that puts a request id near the top, and its revert.
Each bad commit opens its own regression with itself as suspect, found by the deploy check as soon
as beat's cadence lets it once the version has its warm requests (90 s after its first request at
a request a second), and each resolves as reverted; the server's own KV events say that the prompts
after the first commit had no block in common with the ones before.

About five minutes of real traffic through the gateway: a template repository with the five commits
of `support`, imported by Prefixscope; a minute of prompts naming each commit in turn. The first bad
commit's prompts carry a token that changes with every request at position 3 (a timestamp, as token
ids), the second's at position 40 (a request id inside the second block). Then the deploy check, the
diagnosis and the detection run as beat runs them over the traffic's time: the check every 15 s, the
diagnosis every 30 s, the detection once a minute.
"""

import os
import random
import subprocess
import time
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import zmq
from django.conf import settings
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.domain.blockhash import signed_block_hashes
from app.fleet.models import Server
from app.prompts.history import import_template_history
from app.prompts.models import TemplateVersion
from app.prompts.services import register_repository
from app.regressions.models import Regression
from app.regressions.services import check_deploys, detect_regressions
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, RequestDiagnosis, RequestRecord
from app.traffic.services.requests import ingest_request_records
from tests.support.probes import Handshakes
from tests.support.running_gateway import KeptRecords, call, running_gateway
from tests.support.vllm_cpu import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.django_db, pytest.mark.timeout(1800)]
SIZE = 32
PHASE_SECONDS = 60  # of each version's traffic: the deploy check needs 15 warm requests a side


def every(task: str) -> timedelta:
    """How often beat runs `task` (app/settings.py's schedule, in seconds for these)."""
    seconds = settings.CELERY_BEAT_SCHEDULE[task]["schedule"]
    assert isinstance(seconds, float), seconds
    return timedelta(seconds=seconds)


# As beat runs them (app/settings.py): the deploy check every 15 s, the diagnosis every 30 s (of
# the records that arrived DIAGNOSIS_DELAY before), the per-minute detection every minute.
CHECK_EVERY = every("check-deploys")
DIAGNOSE_EVERY = every("diagnose-requests")
DETECT_EVERY = every("detect-regressions")
DIAGNOSIS_DELAY = timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS)
# Once the version has its warm requests (one server: its first request is cold), the check has
# them at the latest after the diagnosis' delay, one diagnosis and one check: 90 s after the
# version's first request when the server answers a request a second, later on a slower machine.
WARM_NEEDED = settings.PREFIXSCOPE_DEPLOY_MIN_REQUESTS + 1
MAX_DELAY = DIAGNOSIS_DELAY + DIAGNOSE_EVERY + CHECK_EVERY
rng = random.Random()  # a new run, new tokens: the session's server keeps what other tests sent
BASE = [rng.randrange(1000, 30_000) for _ in range(6 * SIZE)]
STABLE = "You are the support assistant.\nFollow the policies.\nCurrent time: {{ now }}\nQuestion: {{ q }}\n"
STAMPED = "Current time: {{ now }}\nYou are the support assistant.\nFollow the policies.\nQuestion: {{ q }}\n"
WITH_ID = "You are the support assistant.\nRequest: {{ id }}\nFollow the policies.\nQuestion: {{ q }}\n"
COMMITS = (
    (STABLE, "support: the prompt", None),
    (STAMPED, "support: show the current time at the top", 3),
    (STABLE, "Revert the time at the top", None),
    (WITH_ID, "support: name the request near the top", 40),
    (STABLE, "Revert the request id", None),
)
"""Each commit's text, message and the token its prompts change at every request (None: stable)."""


def commit_templates(path: Path) -> list[str]:
    """A repository with COMMITS of `support` in turn, a minute apart and ending a minute ago (a
    revert is known by its commit coming after the one it reverts): their shas."""
    (path / "templates").mkdir(parents=True)
    git = ["git", "-C", str(path), "-c", "user.name=dev", "-c", "user.email=dev@example.com"]
    subprocess.run([*git[:3], "init", "-q", "-b", "main"], check=True)
    shas = []
    first = timezone.now() - timedelta(minutes=len(COMMITS) + 1)
    for index, (text, message, _) in enumerate(COMMITS):
        (path / "templates" / "support.j2").write_text(text)
        date = (first + timedelta(minutes=index)).isoformat()
        dated = {**os.environ, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", message], check=True, env=dated)
        shas.append(
            subprocess.run(
                [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
            ).stdout.strip()
        )
    return shas


def prompt(varies_at: int | None) -> list[int]:
    tokens = [*BASE, *(rng.randrange(1000, 30_000) for _ in range(40))]  # a question past a block
    if varies_at is not None:
        tokens[varies_at] = rng.randrange(1000, 30_000)  # a time or an id, as a token of every request
    return tokens


def test_bad_revert_bad_again_opens_two_regressions_each_with_its_suspect(
    real_vllm: VLLMServer, tmp_path: Path
) -> None:
    server = Server.objects.create(
        name="vllm-cpu",
        base_url=real_vllm.base_url,
        kv_events_endpoint=real_vllm.kv_endpoint,
        kv_replay_endpoint=real_vllm.replay_endpoint,
        kv_topic=real_vllm.topic,
        block_size=SIZE,
        model=real_vllm.model,
        hash_algo="sha256_cbor",
    )
    shas = commit_templates(tmp_path / "repo")
    repository = register_repository(location=str(tmp_path / "repo"), globs=["templates/*.j2"])
    import_template_history(repository_id=repository.pk, now=timezone.now())
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    joins = Handshakes()
    collector = KVEventCollector(context, flush_seconds=0, before_connect=joins)
    recorder = KeptRecords()
    started = timezone.now()
    try:
        collector.subscribe([server])
        joins.wait(1, keep_alive=lambda: collector.poll(timeout_ms=100))
        with running_gateway(real_vllm.base_url, recorder) as gateway:
            for sha, (_, _, varies_at) in zip(shas, COMMITS, strict=True):
                send_phase(gateway, real_vllm.model, sha, varies_at, collector)
        poll_for(collector, 2.0)
    finally:
        joins.close()
        collector.close()
        context.destroy(linger=0)
    ended = timezone.now()
    ingest_request_records(recorder.records, source="gateway", now=ended, default_server="vllm-cpu")
    refresh_minute_rollups(since=started, until=ended)
    run_beat(since=started, until=ended + timedelta(minutes=2))

    regressions = Regression.objects.filter(scope=Regression.Scope.TEMPLATE, template__name="support")
    first, second = regressions.order_by("changed_at")
    for regression, sha in ((first, shas[1]), (second, shas[3])):
        assert regression.kind == Regression.Kind.TEMPLATE_COMMIT
        assert regression.suspect_version is not None and regression.suspect_version.commit_sha == sha
        assert regression.rate_before > 0.5 > regression.rate_after
        assert regression.resolution == Regression.Resolution.REVERTED
        version = TemplateVersion.objects.get(commit_sha=sha)
        arrivals = list(
            RequestRecord.objects.filter(template_version=version)
            .order_by("arrived_at")
            .values_list("arrived_at", flat=True)
        )
        assert len(arrivals) >= WARM_NEEDED, f"{len(arrivals)} requests in the phase: too few to test"
        assert arrivals[0] < regression.detected_at <= arrivals[WARM_NEEDED - 1] + MAX_DELAY
    assert regressions.count() == 2
    pair = first.evidence["pair"]
    assert pair["diverged_at"] == 3  # the first token of the moved line, token-exact
    # What the server's own KV events say: the first block of the prompt after the commit had never
    # been stored before it arrived; the stable prompts' first block had been, long before.
    after = RequestDiagnosis.objects.get(request_id=pair["after"]["request_id"])
    sent = next(r for r in recorder.records if r.request_id == after.request_id)
    assert sent.prompt_token_ids is not None
    first_block = signed_block_hashes(sent.prompt_token_ids, SIZE)[0] & (2**64 - 1)
    stored = KVEvent.objects.filter(server=server, kind=KVEvent.Kind.STORED, block_hash=first_block)
    assert not stored.filter(emitted_at__lt=after.arrived_at).exists()
    base_first = signed_block_hashes(BASE, SIZE)[0] & (2**64 - 1)
    assert KVEvent.objects.filter(server=server, kind=KVEvent.Kind.STORED, block_hash=base_first).exists()


def send_phase(
    gateway: str, model: str, sha: str, varies_at: int | None, collector: KVEventCollector
) -> None:
    """PHASE_SECONDS of prompts naming the commit `sha`, one at a time through the gateway."""
    phase_ends = time.monotonic() + PHASE_SECONDS
    while time.monotonic() < phase_ends:
        body = {"model": model, "prompt": prompt(varies_at), "max_tokens": 1}
        headers = {
            "Content-Type": "application/json",
            "X-Request-Id": f"support-{rng.randrange(10**12)}",
            "X-Prefixscope-Template": "support",
            "X-Prefixscope-Template-Version": sha,
        }
        assert call("POST", gateway + "/v1/completions", body, headers).status == 200
        poll_for(collector, 0.4)  # its events stored before the next arrival


def poll_for(collector: KVEventCollector, seconds: float) -> None:
    """Keep the collector running, as its command does, for `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        collector.poll(timeout_ms=100)


def run_beat(*, since: datetime, until: datetime) -> None:
    """The deploy check, the diagnosis and the detection at their beat intervals (SCHEDULE), over
    the traffic's time (the records are all stored: each reads what arrived by then)."""
    start = since.replace(second=0, microsecond=0)
    moment = start + CHECK_EVERY
    while moment <= until:
        check_deploys(now=moment)
        if (moment - start) % DIAGNOSE_EVERY == timedelta(0):
            diagnose_requests(now=moment)
        if (moment - start) % DETECT_EVERY == timedelta(0):
            detect_regressions(now=moment)
        moment += CHECK_EVERY
