"""Subscribe to the KV events of registered vLLM servers and store them: as many processes as wanted,
each collecting the servers it leases (its share of them; app/traffic/collection/kv_leases.py)."""

import gc
import logging
import signal
import socket
import time
from typing import Any

import psycopg
import zmq
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError
from django.utils import timezone

from app.fleet.models import Server
from app.telemetry import configure_tracing
from app.traffic.collection.kv_collector import KVEventCollector
from app.traffic.collection.kv_leases import Leases
from app.traffic.collection.processes import forget_collector_process, report_collector_process
from app.traffic.models import CollectorProcess

logger = logging.getLogger(__name__)


class Command(BaseCommand):
    help = __doc__

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--flush-seconds", type=float, default=0.5, help="how often buffered events are written"
        )
        parser.add_argument(
            "--rescan-seconds",
            type=float,
            default=10.0,
            help="the lease period: how often leases are checked, new or free servers taken, extra ones "
            "given up; a killed process's servers are taken over within it",
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
        leases = Leases(lease_seconds=rescan_seconds)
        # What start-up made (Django, its apps and models: some 80,000 objects) lives as long as the
        # process. Frozen, it is no longer walked by the full collections that buffered rows set
        # off, each of which took 70-150 ms (bench_kv_ingest: a few microseconds an event).
        gc.freeze()
        next_scan = 0.0
        started_at = timezone.now()
        try:
            while not stopping:
                if time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + rescan_seconds
                    try:
                        check_leases(collector, leases)
                        report_collector_process(
                            kind=CollectorProcess.Kind.KV_SUBSCRIBER,
                            name=socket.gethostname(),
                            started_at=started_at,
                            queue_depth=len(collector.pending.rows),
                            leases=leases.counts(),
                            now=timezone.now(),
                        )
                    except (DatabaseError, psycopg.Error) as exc:  # PostgreSQL away: collect, look again
                        logger.warning("cannot check the KV-event leases: %s", exc)
                collector.poll(timeout_ms=200)
        finally:
            collector.close()  # stored first, then the leases given up: a taker resumes after it
            leases.close()
            try:
                forget_collector_process(kind=CollectorProcess.Kind.KV_SUBSCRIBER, name=socket.gethostname())
            except (DatabaseError, psycopg.Error) as exc:
                logger.warning("cannot withdraw this subscriber's report: %s", exc)
        self.stdout.write("KV event collector stopped")


def check_leases(collector: KVEventCollector, leases: Leases) -> None:
    """Give up the leases above this process's share (after storing what their servers sent), and
    subscribe to the free servers this process's share leaves room for."""
    leases.connect()
    # Leases lost with a lease connection that broke, and taken by another process meanwhile: it
    # collects them now (the two storing the same events meanwhile store each once).
    stray = collector.subscribed() - leases.held
    if stray:
        collector.unsubscribe(stray)
    servers = set(
        Server.objects.exclude(state=Server.State.DISABLED)
        .exclude(kv_events_endpoint="")
        .values_list("pk", flat=True)
    )
    excess = leases.excess(servers)
    if excess and collector.unsubscribe(excess):
        leases.release(excess)
        logger.info("KV-event leases given up: servers %s", sorted(excess))
    taken = leases.take_share(servers)
    if taken:
        collector.subscribe(Server.objects.filter(pk__in=taken))
        failed = taken - collector.subscribed()
        leases.release(failed)  # not subscribed (a bad endpoint): free for another process to try
        logger.info("KV-event leases taken: servers %s", sorted(taken - failed))
