"""Database tests run on the real PostgreSQL that `make test` starts (DATABASE_URL).

`make test` runs the suite in two pytest-xdist workers. Each has its own test database (pytest-django
names it), its own Valkey database on the one broker (below), its own slice of ports
(tests/support/ports.py), and the tests on the real vLLM CPU server all run in one worker, first, so
one server at a time runs beside the rest of the suite.
"""

import os
from collections import Counter
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from _pytest.nodeid import NodeId


def _own_broker_database() -> None:
    """Give this xdist worker its own Valkey database, so a Celery worker a test starts never takes
    a task the other worker's test sent (database 0 is left to runs without xdist)."""
    worker, url = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("CELERY_BROKER_URL")
    if not (worker and url):
        return
    from django.conf import settings

    own = urlunsplit(urlsplit(url)._replace(path=f"/{int(worker.removeprefix('gw')) + 1}"))
    os.environ["CELERY_BROKER_URL"] = settings.CELERY_BROKER_URL = own


_own_broker_database()

VLLM_GROUP = "vllm"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The real vLLM server's tests in one xdist group, run first: the longest group starts at once,
    and a second worker never starts a second server (two at once were seen to hang a start-up).
    Every test gets a node id of its own."""
    for item in items:
        original = getattr(item, "originalname", item.name)
        if item.name != original and item.nodeid.endswith(f"::{original}"):
            _rename(item, f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}")
        if item.get_closest_marker("vllm") or "real_vllm" in getattr(item, "fixturenames", ()):
            _rename(item, f"{item.nodeid}@{VLLM_GROUP}")
    repeated = [nodeid for nodeid, count in Counter(item.nodeid for item in items).items() if count > 1]
    if repeated:
        raise pytest.UsageError(f"tests share a node id, and xdist would run one of each: {repeated[:5]}")
    items.sort(key=lambda item: not item.nodeid.endswith(f"@{VLLM_GROUP}"))


def _rename(item: pytest.Item, nodeid: str) -> None:
    """Give `item` another node id, which xdist schedules by (`--dist loadgroup` runs the tests
    whose ids end in the same `@group` in one worker, and of tests sharing an id only the first).

    Two renames that pytest 9 left undone: xdist 3.8 names a group by setting the `_nodeid` pytest
    9 no longer reads (node ids are `_id`, a NodeId), so its `xdist_group` marker groups nothing;
    and schemathesis 4.32.5 gives every operation of its parametrized test the test's own id (the
    operation is in its `name`), so 1 of 44 ran under xdist. The guard above stops a run where ids
    repeat.
    """
    item._id = NodeId.parse(nodeid)


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The test database, with today's and the coming days' partitions, as `make run` makes them."""
    from django.utils import timezone

    from app.traffic.services.partitions import maintain_partitions

    with django_db_blocker.unblock():
        maintain_partitions(now=timezone.now())
    yield


@pytest.fixture(autouse=True)
def _forget_what_processes_remember() -> None:
    """Ingest tokens, servers, partition ranges and the diagnosis' replay a process remembers
    between batches and runs: a test's rows are rolled back after it, so what an earlier test left
    in memory may name rows gone."""
    from app.api.services import forget_ingest_tokens
    from app.diagnosis.run import forget_kept_replay
    from app.traffic.services.partitions import forget_partition_ranges
    from app.traffic.services.requests import forget_servers

    forget_ingest_tokens()
    forget_partition_ranges()
    forget_servers()
    forget_kept_replay()


@pytest.fixture
def eager() -> Iterator[None]:
    """Queued tasks run at once, in the test (the import a webhook, a button or a question queues)."""
    from app.celery import celery_app

    celery_app.conf.task_always_eager = True
    yield
    celery_app.conf.task_always_eager = False
