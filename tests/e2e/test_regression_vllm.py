"""A template commit that puts a timestamp at the top of its prompts, served by the real vLLM CPU server:
a regression opens on the template with that commit as suspect, and the server's own KV events say
that the prompts after it had no block in common with the ones before.

About five minutes of real traffic through the gateway (the detection reads minutes): a template
repository with two commits of `support` (the second moves the time to the top), imported by
Prefixscope; two and a half minutes of prompts naming the first commit, then as long naming the
second (the commit lands inside a minute, which then holds both rates: two and a half minutes make
sure of two minutes on each side of it, whose agreement says how much minutes scatter), whose
prompts carry a token that changes with every request at position 3 (a timestamp, as token ids).
Then the diagnosis and the detection run as beat runs them, minute by minute.
"""

import random
import subprocess
import time
from datetime import timedelta
from pathlib import Path

import pytest
import zmq
from django.utils import timezone

from app.domain.blockhash import signed_block_hashes
from app.fleet.models import Server
from app.prompts.history import import_template_history
from app.prompts.services import register_repository
from app.regressions.models import Regression
from app.regressions.services import detect_regressions
from app.traffic.kv_collector import KVEventCollector
from app.traffic.models import KVEvent, RequestDiagnosis
from app.traffic.services.diagnosis import diagnose_requests
from app.traffic.services.requests import ingest_request_records
from app.traffic.services.rollups import refresh_minute_rollups
from tests.collectors.gateway.running import KeptRecords, call, running_gateway
from tests.e2e.probes import SUBSCRIBER_JOIN_SECONDS
from tests.e2e.test_block_index_after_restart import poll_for
from tests.e2e.vllm_cpu import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.django_db, pytest.mark.timeout(1800)]
SIZE = 32
PHASE_SECONDS = 150  # of each version's traffic: two minutes besides the one the commit lands in
rng = random.Random()  # a new run, new tokens: the session's server keeps what other tests sent
BASE = [rng.randrange(1000, 30_000) for _ in range(6 * SIZE)]
STABLE = "You are the support assistant.\nFollow the policies.\nCurrent time: {{ now }}\nQuestion: {{ q }}\n"
STAMPED = "Current time: {{ now }}\nYou are the support assistant.\nFollow the policies.\nQuestion: {{ q }}\n"


def commit_templates(path: Path) -> tuple[str, str]:
    """A repository with `support` as it was, then with the time moved to the top: the two shas."""
    (path / "templates").mkdir(parents=True)
    git = ["git", "-C", str(path), "-c", "user.name=dev", "-c", "user.email=dev@example.com"]
    subprocess.run([*git[:3], "init", "-q", "-b", "main"], check=True)
    shas = []
    for text, message in (
        (STABLE, "support: the prompt"),
        (STAMPED, "support: show the current time at the top"),
    ):
        (path / "templates" / "support.j2").write_text(text)
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", message], check=True)
        shas.append(
            subprocess.run(
                [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
            ).stdout.strip()
        )
    return shas[0], shas[1]


def prompt(stamped: bool) -> list[int]:
    tokens = [*BASE, *(rng.randrange(1000, 30_000) for _ in range(40))]  # a question past a block
    if stamped:
        tokens[3] = rng.randrange(1000, 30_000)  # the time, as a token that changes every request
    return tokens


def test_a_timestamp_commit_opens_a_regression_with_that_commit_as_suspect(
    real_vllm: VLLMServer, tmp_path: Path
) -> None:
    server = Server.objects.create(
        name="vllm-cpu", base_url=real_vllm.base_url, kv_events_endpoint=real_vllm.kv_endpoint,
        kv_replay_endpoint=real_vllm.replay_endpoint, kv_topic=real_vllm.topic, block_size=SIZE,
        model=real_vllm.model, hash_algo="sha256_cbor",
    )  # fmt: skip
    stable, stamped = commit_templates(tmp_path / "repo")
    repository = register_repository(location=str(tmp_path / "repo"), globs=["templates/*.j2"])
    import_template_history(repository_id=repository.pk, now=timezone.now())
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    collector = KVEventCollector(context, flush_seconds=0)
    recorder = KeptRecords()
    started = timezone.now()
    try:
        collector.subscribe([server])
        poll_for(collector, SUBSCRIBER_JOIN_SECONDS)
        with running_gateway(real_vllm.base_url, recorder) as gateway:
            for version in (stable, stamped):
                phase_ends = time.monotonic() + PHASE_SECONDS
                while time.monotonic() < phase_ends:
                    body = {"model": real_vllm.model, "prompt": prompt(version == stamped), "max_tokens": 1}
                    headers = {
                        "Content-Type": "application/json",
                        "X-Request-Id": f"support-{rng.randrange(10**12)}",
                        "X-Prefixscope-Template": "support",
                        "X-Prefixscope-Template-Version": version,
                    }
                    assert call("POST", gateway + "/v1/completions", body, headers).status == 200
                    poll_for(collector, 0.4)  # its events stored before the next arrival
        poll_for(collector, 2.0)
    finally:
        collector.close()
        context.destroy(linger=0)
    ended = timezone.now()
    ingest_request_records(recorder.records, source="gateway", now=ended, default_server="vllm-cpu")
    refresh_minute_rollups(since=started, until=ended)
    moment = started.replace(second=0, microsecond=0) + timedelta(minutes=1)
    while moment <= ended + timedelta(minutes=2):  # as beat runs them, once a minute
        diagnose_requests(now=moment)
        detect_regressions(now=moment)
        moment += timedelta(minutes=1)

    regression = Regression.objects.get(scope=Regression.Scope.TEMPLATE, template__name="support")
    assert regression.kind == Regression.Kind.TEMPLATE_COMMIT
    assert regression.suspect_version is not None and regression.suspect_version.commit_sha == stamped
    assert regression.rate_before > 0.5 > regression.rate_after
    pair = regression.evidence["pair"]
    assert pair["diverged_at"] == 3  # the first token of the moved line, token-exact
    # What the server's own KV events say: the first block of the prompt after the commit had never
    # been stored before it arrived; the stable prompts' first block had been, long before.
    after = RequestDiagnosis.objects.get(request_id=pair["after"]["request_id"])
    sent = next(r for r in recorder.records if r.request_id == after.request_id)
    assert sent.prompt_token_ids is not None
    first = signed_block_hashes(sent.prompt_token_ids, SIZE)[0] & (2**64 - 1)
    stored = KVEvent.objects.filter(server=server, kind=KVEvent.Kind.STORED, block_hash=first)
    assert not stored.filter(emitted_at__lt=after.arrived_at).exists()
    base_first = signed_block_hashes(BASE, SIZE)[0] & (2**64 - 1)
    assert KVEvent.objects.filter(server=server, kind=KVEvent.Kind.STORED, block_hash=base_first).exists()
