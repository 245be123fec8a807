"""The things tests make over and over, with defaults, so a test's setup says only what differs.

- `a_server(**fields)`: a registered, active server.
- `facts(**fields)`: one `RequestFacts`, the record shape every collector produces.
- `ingested(*facts)`: those facts stored through the real ingest service, as a collector stores them.
"""

from collections.abc import Iterator
from datetime import datetime
from itertools import count
from typing import Any

from django.utils import timezone

from app.fleet.models import Server
from app.traffic.models import RequestRecord
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts

_numbers: Iterator[int] = count()


def a_server(**fields: Any) -> Server:
    """A registered, active server: named "server-<n>" (unique in the test run) unless `name` is
    given, served at http://<name>:8000, block size 16, model "tiny"; `fields` override any of them."""
    name = fields.pop("name", None) or f"server-{next(_numbers)}"
    defaults: dict[str, Any] = {"base_url": f"http://{name}:8000", "block_size": 16, "model": "tiny"}
    return Server.objects.create(name=name, **(defaults | fields))


def facts(**fields: Any) -> RequestFacts:
    """What a source saw of one request: a fresh request id ("r-<n>"), arrived now, and nothing else
    said (no server: the sender's own) unless `fields` say it."""
    defaults: dict[str, Any] = {"request_id": f"r-{next(_numbers)}", "arrived_at": timezone.now()}
    return RequestFacts(**(defaults | fields))


def ingested(*sent: RequestFacts, source: str = "rest", now: datetime | None = None) -> list[RequestRecord]:
    """`sent` stored in one batch by the ingest service (ingest_request_records) at `now` (the
    clock's by default); their stored rows, oldest first. A test's setup means every record to be
    stored: one the service rejects fails here with its reason."""
    outcome = ingest_request_records(sent, source=source, now=now or timezone.now())
    assert outcome.rejected == [], f"ingest rejected {outcome.rejected}"
    ids = {item.request_id for item in sent}
    return list(RequestRecord.objects.filter(request_id__in=ids).order_by("arrived_at", "request_id"))
