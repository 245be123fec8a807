"""Subscribe to the KV events of every registered vLLM server and store them (one process for all)."""

import gc
import logging
import signal
import socket
import time
from typing import Any

import zmq
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from app.fleet.models import Server
from app.telemetry import configure_tracing
from app.traffic.kv_collector import KVEventCollector
from app.traffic.models import CollectorProcess
from app.traffic.services.collector_processes import report_collector_process

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--flush-seconds", type=float, default=0.5, help="how often buffered events are written"
        )
        parser.add_argument(
            "--rescan-seconds", type=float, default=10.0, help="how often new servers are looked for"
        )

    def handle(self, *args: Any, flush_seconds: float, rescan_seconds: float, **options: Any) -> None:
        configure_tracing("prefixscope-collectors")
        stopping = False

        def stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        collector = KVEventCollector(zmq.Context.instance(), flush_seconds=flush_seconds)
        # What start-up made (Django, its apps and models: some 80,000 objects) lives as long as the
        # process. Frozen, it is no longer walked by the full collections that buffered rows set
        # off, each of which took 70-150 ms (bench_kv_ingest: a few microseconds an event).
        gc.freeze()
        next_scan = 0.0
        try:
            while not stopping:
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + rescan_seconds
                    try:
                        collector.subscribe(Server.objects.exclude(state=Server.State.DISABLED))
                        report_collector_process(
                            kind=CollectorProcess.Kind.KV_SUBSCRIBER,
                            name=socket.gethostname(),
                            queue_depth=len(collector.pending.rows),
                            now=timezone.now(),
                        )
                    except DatabaseError as exc:  # PostgreSQL away: keep collecting, look again later
                        logger.warning("cannot read the servers to subscribe to: %s", exc)
                collector.poll(timeout_ms=200)
        finally:
            collector.close()
        self.stdout.write("KV event collector stopped")
