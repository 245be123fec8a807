"""Reads of request records and their diagnoses."""

from dataclasses import dataclass
from datetime import datetime

from django.db.models import F, Sum, Value

from app.traffic.models import RequestDiagnosis, RequestRecord

LOST_COLUMNS = {cause.value: f"{cause.value}_tokens" for cause in RequestDiagnosis.Cause}


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


def diagnosed_requests(*, server_name: str, request_id: str) -> list[DiagnosedRequest]:
    """The records of one server and request id (one per arrival), newest first, with their
    diagnoses. Token ids are not read: prompt text stays in the database."""
    records = (
        RequestRecord.objects.filter(server__name=server_name, request_id=request_id)
        .defer("token_ids")
        .select_related("server", "template", "template_version")
        .order_by("-arrived_at")
    )
    found = list(records)
    diagnoses = {
        d.arrived_at: d
        for d in RequestDiagnosis.objects.filter(
            server__name=server_name, request_id=request_id, arrived_at__in=[r.arrived_at for r in found]
        )
    }
    return [DiagnosedRequest(record, diagnoses.get(record.arrived_at)) for record in found]


def lost_tokens_by_cause(*, since: datetime, until: datetime, server_id: int | None = None) -> dict[str, int]:
    """Prompt tokens lost per cause by the requests diagnosed that arrived in [since, until)."""
    diagnoses = RequestDiagnosis.objects.filter(arrived_at__gte=since, arrived_at__lt=until)
    if server_id is not None:
        diagnoses = diagnoses.filter(server_id=server_id)
    sums = diagnoses.aggregate(**{cause: Sum(column) for cause, column in LOST_COLUMNS.items()})
    return {cause: tokens or 0 for cause, tokens in sums.items()}


def recent_misses(*, since: datetime, limit: int = 15) -> list[RequestDiagnosis]:
    """The diagnosed requests since `since` that lost the most reusable prompt tokens (the tail
    below one block is not reusable, so it does not count), most first, then newest."""
    lost = sum((F(column) for cause, column in LOST_COLUMNS.items() if cause != "below_block"), Value(0))
    return list(
        RequestDiagnosis.objects.filter(arrived_at__gte=since)
        .annotate(reusable_lost=lost)
        .filter(reusable_lost__gt=0)
        .select_related("server", "template")
        .order_by("-reusable_lost", "-arrived_at")[:limit]
    )
