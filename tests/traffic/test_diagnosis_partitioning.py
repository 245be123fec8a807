"""Diagnosis runs in several workers at once split the fleet by compatibility group: a request is
diagnosed by one run, never by two (app/diagnosis/run.py, DIAGNOSIS_LOCK_SPACE)."""

import os
import random
import re
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from django.db import connections
from django.utils import timezone

from app.celery import celery_app
from app.diagnosis.run import (
    DIAGNOSIS_LOCK_SPACE,
    compatibility_groups,
    diagnose_requests,
    group_lock_key,
)
from app.diagnosis.tasks import dispatch_diagnoses
from app.fleet.models import Server
from app.fleet.services import register_server
from app.traffic.models import RequestDiagnosis
from tests.support.factories import facts, ingested
from tests.support.processes import REPO, database_url_for_tests, wait_until

RECORDS_PER_SERVER = 300


def fleet_of_two_groups() -> list[Server]:
    """Two servers of different models: two compatibility groups."""
    return [
        register_server(name=f"vllm-{model}", base_url=f"http://vllm-{model}:8000", model=model)
        for model in ("qwen", "llama")
    ]


def ingest(servers: list[Server], *, count: int, at: datetime) -> None:
    rng = random.Random(3)
    system = [rng.randrange(1, 50_000) for _ in range(96)]
    for server in servers:
        sent = [
            facts(
                request_id=f"{server.name}-{i}",
                arrived_at=at + timedelta(milliseconds=i),
                server=server.name,
                model=server.model,
                template="support",
                prompt_tokens=112,
                cached_tokens=0,
                prompt_token_ids=system + [rng.randrange(1, 50_000) for _ in range(16)],
            )
            for i in range(count)
        ]
        ingested(*sent, source="gateway", now=at)


def diagnosed_servers() -> list[int]:
    return sorted(set(RequestDiagnosis.objects.values_list("server_id", flat=True)))


@pytest.mark.django_db
def test_a_run_leaves_the_group_another_worker_is_diagnosing_to_the_next_run() -> None:
    qwen, llama = fleet_of_two_groups()
    arrived = timezone.now() - timedelta(minutes=2)
    ingest([qwen, llama], count=5, at=arrived)
    group = (qwen.model, qwen.block_size, qwen.hash_algo)
    params = connections["default"].get_connection_params()
    params.pop("cursor_factory", None)
    with psycopg.connect(**params, autocommit=True) as other_worker:
        other_worker.execute("SELECT pg_advisory_lock(%s, %s)", [DIAGNOSIS_LOCK_SPACE, group_lock_key(group)])
        assert diagnose_requests(now=timezone.now()) == 5
        assert diagnosed_servers() == [llama.pk]
    assert diagnose_requests(now=timezone.now()) == 5  # the lock went with the other worker's connection
    assert diagnosed_servers() == sorted([qwen.pk, llama.pk])


_RUN = """
import os, time
from datetime import datetime
from app.diagnosis.run import diagnose_requests
start, now = float(os.environ["RUN_AT"]), datetime.fromisoformat(os.environ["RUN_NOW"])
time.sleep(max(0.0, start - time.time()))
print(diagnose_requests(now=now))
"""


@pytest.mark.django_db(transaction=True)
def test_two_workers_diagnosing_at_once_diagnose_each_request_once() -> None:
    servers = fleet_of_two_groups()
    ingest(servers, count=RECORDS_PER_SERVER, at=timezone.now() - timedelta(minutes=2))
    start, now = time.time() + 10, timezone.now()  # both started, Django loaded: then both run at once
    environment = {**os.environ, "DATABASE_URL": database_url_for_tests(), "RUN_AT": str(start),
                   "RUN_NOW": now.isoformat()}  # fmt: skip
    command = [sys.executable, "manage.py", "shell", "-c", _RUN]
    workers = [
        subprocess.Popen(
            command, cwd=REPO, env=environment, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    answers = [worker.communicate(timeout=120) for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0], answers
    diagnosed = [int(out.split()[-1]) for out, _ in answers]
    assert sum(diagnosed) == 2 * RECORDS_PER_SERVER, diagnosed  # none diagnosed by both
    assert RequestDiagnosis.objects.count() == 2 * RECORDS_PER_SERVER


@pytest.mark.django_db
def test_a_run_for_one_group_diagnoses_that_group_alone() -> None:
    qwen, llama = fleet_of_two_groups()
    ingest([qwen, llama], count=5, at=timezone.now() - timedelta(minutes=2))
    assert compatibility_groups() == sorted(
        [(s.model, s.block_size, s.hash_algo) for s in (qwen, llama)], key=repr
    )
    assert diagnose_requests(now=timezone.now(), group=(llama.model, llama.block_size, llama.hash_algo)) == 5
    assert diagnosed_servers() == [llama.pk]
    assert diagnose_requests(now=timezone.now(), group=("no such model", None, "")) == 0


# Celery's own line for a finished task, with what it returned (the records it diagnosed).
_SUCCEEDED = re.compile(
    r"Task diagnosis\.diagnose_group\[(?P<task>[0-9a-f-]+)\] succeeded in [0-9.e-]+s: (?P<n>\d+)"
)


def celery_worker(name: str, log: Path) -> subprocess.Popen[bytes]:
    """A worker as production starts one (one process at a time), on the test's broker and database."""
    environment = {**os.environ, "DATABASE_URL": database_url_for_tests()}
    command = [sys.executable, "-m", "celery", "-A", "app.celery", "worker", "--pool", "solo",
               "--loglevel", "INFO", "-n", f"{name}@test", "--without-gossip"]  # fmt: skip
    with log.open("wb") as out:
        return subprocess.Popen(command, cwd=REPO, env=environment, stdout=out, stderr=subprocess.STDOUT)


def finished(logs: list[Path]) -> list[re.Match[str]]:
    return [found for log in logs for found in _SUCCEEDED.finditer(log.read_text(errors="replace"))]


@pytest.mark.django_db(transaction=True)
def test_the_dispatch_sends_a_task_per_group_that_two_workers_share(tmp_path: Path) -> None:
    servers = fleet_of_two_groups()
    ingest(servers, count=RECORDS_PER_SERVER, at=timezone.now() - timedelta(minutes=2))
    celery_app.control.purge()  # what an earlier run left on the test broker
    logs = [tmp_path / f"worker-{i}.log" for i in range(2)]
    workers = [celery_worker(f"w{i}", log) for i, log in enumerate(logs)]
    try:
        dispatch_diagnoses()
        dispatch_diagnoses()  # a second beat before the first's tasks ran: nothing diagnosed twice
        wait_until(lambda: len(finished(logs)) == 4, timeout=180, what="four diagnosis tasks")
    finally:
        for worker in workers:
            worker.terminate()
            worker.wait(30)
    done = finished(logs)
    assert sorted(int(m["n"]) for m in done if int(m["n"])) == [RECORDS_PER_SERVER] * 2, done
    assert len({m["task"] for m in done}) == 4
    assert diagnosed_servers() == sorted(server.pk for server in servers)
    assert RequestDiagnosis.objects.count() == 2 * RECORDS_PER_SERVER
