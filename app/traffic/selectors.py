"""Reads of one request: its record, its diagnosis, and the other requests under its id."""

from dataclasses import dataclass
from datetime import datetime

from app.core.tenancy import SEES_ALL, Viewer
from app.traffic.models import (
    LOST_COLUMNS,
    RequestDiagnosis,
    RequestRecord,
)


@dataclass(frozen=True, slots=True)
class DiagnosedRequest:
    record: RequestRecord
    diagnosis: RequestDiagnosis | None  # None until the diagnosis task has run on it

    def lost_tokens(self) -> dict[str, int]:
        """Lost tokens by cause, the causes that lost none left out."""
        if self.diagnosis is None:
            return {}
        found = {cause: getattr(self.diagnosis, column) for cause, column in LOST_COLUMNS.items()}
        return {cause: tokens for cause, tokens in found.items() if tokens}


OTHERS_LISTED = 20
"""At most this many of the other requests under one id are listed (newest first); all are counted."""


@dataclass(frozen=True, slots=True)
class AddressedRequest:
    """The one request a (server, request id) address names, and the other requests a client sent
    under that id on that server: the ingest merges records of one id within JOIN_WINDOW of each
    other, so records further apart are different requests (the client reused the id)."""

    request: DiagnosedRequest
    others: list[datetime]  # their arrivals, newest first, OTHERS_LISTED at most
    other_count: int  # all of them


def addressed_request(
    *, server_name: str, request_id: str, arrived_at: datetime | None = None, viewer: Viewer = SEES_ALL
) -> AddressedRequest | None:
    """The request of that server and id the viewer sees that arrived at `arrived_at` (its record's
    exact arrival), else the latest, with its diagnosis and the other requests under its id; None
    when there is none (or none arrived then). Token ids are not read: prompt text stays in the
    database."""
    records = viewer.traffic(RequestRecord.objects.all()).filter(
        server__name=server_name, request_id=request_id
    )
    arrivals = list(records.order_by("-arrived_at").values_list("arrived_at", flat=True)[: OTHERS_LISTED + 2])
    chosen = arrived_at if arrived_at is not None else (arrivals[0] if arrivals else None)
    record = (
        records.filter(arrived_at=chosen)
        .defer("token_ids")
        .select_related("server", "template", "template_version")
        .first()
    )
    if record is None:
        return None
    diagnosis = RequestDiagnosis.objects.filter(
        server_id=record.server_id, request_id=request_id, arrived_at=record.arrived_at
    ).first()
    others = [at for at in arrivals if at != record.arrived_at][:OTHERS_LISTED]
    count = len(arrivals) - 1 if len(arrivals) <= OTHERS_LISTED + 1 else records.count() - 1
    return AddressedRequest(DiagnosedRequest(record, diagnosis), others, count)
