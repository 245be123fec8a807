"""Database tests run on the real PostgreSQL that `make test` starts (DATABASE_URL)."""

from collections.abc import Iterator
from typing import Any

import pytest


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
