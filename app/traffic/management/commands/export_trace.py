"""Write the request records of a window as a trace for `prefixscope analyze` (Prefixscope's own
export, app/analyzer/export_format.py), one JSON object per line, to stdout or --output.

    manage.py export_trace --since 2026-01-01T00:00Z --until 2026-01-01T01:00Z [--template NAME]
        [--tenant T ...] [--output FILE]

Block hashes as the wire's uint64s; token ids only where retention still keeps them. Tenant-scoped
as the other exports: --tenant limits it to those tenants' records (and the tenant-less ones of
their servers and templates); without it, every record. Logs counts, never prompt content.
"""

import logging
import sys
from datetime import UTC, datetime
from typing import Any

import msgspec
from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from app.analyzer.export_format import ExportLine, wire_hashes
from app.core.retention import kept_token_ids_since
from app.core.tenancy import SEES_ALL, Viewer
from app.domain.retention import keeps_token_ids
from app.traffic.models import RequestRecord

logger = logging.getLogger(__name__)
_CHUNK = 2000


def _moment(value: str) -> datetime:
    parsed = parse_datetime(value)
    if parsed is None:
        raise CommandError(f"not an ISO 8601 time: {value!r}")
    return parsed if timezone.is_aware(parsed) else timezone.make_aware(parsed, UTC)


class Command(BaseCommand):
    help = "Write the request records of a window as a JSON-lines trace for prefixscope analyze."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--since", type=_moment, required=True)
        parser.add_argument("--until", type=_moment, required=True)
        parser.add_argument("--template", help="only this template's records (its name)")
        parser.add_argument("--tenant", action="append", help="only what these tenants see (repeatable)")
        parser.add_argument("--output", help="a file (default: stdout)")

    def handle(self, *args: Any, **options: Any) -> None:
        viewer = Viewer(frozenset(options["tenant"])) if options["tenant"] else SEES_ALL
        records = viewer.traffic(RequestRecord.objects.filter(
            arrived_at__gte=options["since"], arrived_at__lt=options["until"]
        )).select_related("server", "template").order_by("arrived_at", "server_id", "request_id")  # fmt: skip
        if options["template"]:
            records = records.filter(template__name=options["template"])
        out = open(options["output"], "wb") if options["output"] else sys.stdout.buffer  # noqa: SIM115
        try:
            written = _write(records, out)
        finally:
            if options["output"]:
                out.close()
        logger.info("trace exported", extra={"records": written})
        self.stderr.write(f"{written} records exported")


def _write(records: Any, out: Any) -> int:
    encode = msgspec.json.Encoder().encode
    cutoff = kept_token_ids_since(timezone.now())
    written = 0
    for record in records.iterator(chunk_size=_CHUNK):
        kept = record.token_ids is not None and keeps_token_ids(record.arrived_at, cutoff)
        line = ExportLine(
            request_id=record.request_id, arrived=record.arrived_at.timestamp(),
            prompt_tokens=record.prompt_tokens or 0, server=record.server.name, group=record.model,
            salt=record.salt_hash, tenant=record.tenant,
            template=record.template.name if record.template else "",
            output_tokens=record.completion_tokens or 0, block_size=record.server.block_size or 0,
            block_hashes=wire_hashes(record.block_hashes),
            unsalted_hashes=wire_hashes(record.neutral_hashes) if record.salt_hash else [],
            cached_tokens=record.cached_tokens, token_ids=list(record.token_ids) if kept else None,
        )  # fmt: skip
        out.write(encode(line) + b"\n")
        written += 1
    return written
