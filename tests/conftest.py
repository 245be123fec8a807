"""Database tests run on the real PostgreSQL that `make test` starts (DATABASE_URL)."""

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup: None, django_db_blocker: Any) -> Iterator[None]:
    """The test database, with today's and the coming days' partitions, as `make run` makes them."""
    from django.utils import timezone

    from app.core.services import maintain_partitions

    with django_db_blocker.unblock():
        maintain_partitions(now=timezone.now())
    yield
