"""Prefixscope's own /metrics: what it found, what it collected and what it could not, read from
PostgreSQL per scrape.

A custom collector (not counters in memory) because the numbers live in the database and every
web, worker or collector process must report the same values. Each family (or set of families from
one table) is one aggregate query over small tables or rollups; the traffic families are in
app/dashboard/metrics/traffic.py.
"""

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Max, Sum
from django.utils import timezone
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from app.dashboard.metrics.arrivals import arrival_families
from app.dashboard.metrics.hit_blocks import hit_block_families
from app.dashboard.metrics.tiers import tier_families
from app.dashboard.metrics.traffic import killer_families, token_families, ttft_families
from app.fleet.models import Server
from app.fleet.services import SCRAPED_STATES
from app.regressions.models import Regression
from app.regressions.owners import owner_of, server_owner
from app.traffic.collection.kv_leases import lease_holders
from app.traffic.collection.processes import FORGOTTEN_AFTER
from app.traffic.models import CollectorProcess, KVGap, KVStream, LossMinute, MinuteRollup, RejectedInput

# A collector process reports every 10 s or so: one silent for longer holds nothing in memory that
# counts (its queue and leases are not exported; CollectorSilent fires on its last report's age).
PROCESS_LIVE = timedelta(seconds=120)


def current_processes(now: datetime) -> list[CollectorProcess]:
    """The collector processes to export: those heard from within FORGOTTEN_AFTER (a day) that no
    process of the same kind and name started after they went silent (a restarted gateway or
    subscriber replaces the killed one; one of several still running alongside does not)."""
    rows = list(CollectorProcess.objects.filter(reported_at__gte=now - FORGOTTEN_AFTER))
    newest_start: dict[tuple[str, str], datetime] = {}
    for row in rows:
        if row.started_at is not None:
            key = (row.kind, row.name)
            newest_start[key] = max(row.started_at, newest_start.get(key, row.started_at))
    return [
        row
        for row in rows
        if (start := newest_start.get((row.kind, row.name))) is None or start <= row.reported_at
    ]


class PrefixscopeCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        now = timezone.now()
        yield from self._servers()
        yield self._rejected()
        yield from self._gaps()
        yield from self._streams()
        yield from self._regressions()
        yield from self._rollup_progress()
        yield from self._processes(now)
        yield from token_families(now)
        yield from ttft_families(now)
        yield from killer_families()
        yield from hit_block_families(now)
        yield from arrival_families(now)
        yield from tier_families(now)

    def _servers(self) -> Iterator[GaugeMetricFamily]:
        """Scrape health per server: up, when last pulled, and how often it should be; its cache
        configuration (the compatibility group's block size and hash algorithm); and whether a KV
        subscriber holds its stream's lease."""
        labels = ["server", "model"]
        up = GaugeMetricFamily(
            "prefixscope_server_up",
            "1 when the server's last /metrics pull worked, 0 when it failed; none for a server not pulled "
            "(proposed: named by ingested data, not registered).",
            labels=labels,
        )
        last = GaugeMetricFamily(
            "prefixscope_server_last_scrape_timestamp_seconds",
            "When Prefixscope last pulled the server's /metrics (worked or not).",
            labels=labels,
        )
        interval = GaugeMetricFamily(
            "prefixscope_server_scrape_interval_seconds",
            "How often the server's /metrics is pulled.",
            labels=labels,
        )
        config = GaugeMetricFamily(
            "prefixscope_server_cache_config_info",
            "1 per server, labelled with what makes servers compatible peers besides the model: the "
            'block size and prefix-caching hash algorithm ("" while not known).',
            labels=[*labels, "block_size", "hash_algo"],
        )
        leased = GaugeMetricFamily(
            "prefixscope_kv_stream_leased",
            "1 when a KV-event subscriber holds the lease of the server's KV-event stream, else 0.",
            labels=labels,
        )
        owner = GaugeMetricFamily(
            "prefixscope_server_owner_info",
            "1 per server, labelled with the team its capacity and stream alerts are routed to (its group).",
            labels=[*labels, "owner_kind", "owner"],
        )
        blocks = GaugeMetricFamily(
            "prefixscope_server_kv_blocks",
            "KV cache blocks of one engine of the server (cache_config_info's num_gpu_blocks): its size, "
            "by which the eviction alerts scale their floors.",
            labels=labels,
        )
        holders = lease_holders()
        for server in Server.objects.exclude(state=Server.State.DISABLED).only(
            "pk", "name", "model", "state", "last_scraped_at", "scrape_interval_seconds", "block_size",
            "hash_algo", "kv_events_endpoint", "num_gpu_blocks", "group",
        ):  # fmt: skip
            key = [server.name, server.model]
            # Only for the servers it pulls: a proposed one (named by ingested records, not yet
            # registered) is not pulled, and a 0 there paged ServerScrapesFailing for the demo's
            # hosted APIs ten minutes after their first usage report.
            if server.state in SCRAPED_STATES:
                up.add_metric(key, 1.0 if server.state == Server.State.ACTIVE else 0.0)
            interval.add_metric(key, float(server.scrape_interval_seconds))
            config.add_metric([*key, str(server.block_size or ""), server.hash_algo], 1.0)
            found = server_owner(server)
            owner.add_metric([*key, found.kind, found.name], 1.0)
            if server.last_scraped_at is not None:
                last.add_metric(key, server.last_scraped_at.timestamp())
            if server.kv_events_endpoint:
                leased.add_metric(key, 1.0 if server.pk in holders else 0.0)
            if server.num_gpu_blocks:
                blocks.add_metric(key, float(server.num_gpu_blocks))
        yield from (up, last, interval, config, leased, owner, blocks)

    def _rejected(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "prefixscope_rejected_inputs",
            "Input rejected (malformed, or refused with 429 while busy), by server, source and reason.",
            labels=["server", "source", "reason"],
        )
        for server, source, reason, count in RejectedInput.objects.values_list(
            "server__name", "source", "reason", "count"
        ):
            family.add_metric([server or "", source, reason], float(count))
        return family

    def _gaps(self) -> Iterator[CounterMetricFamily]:
        """KV sequence gaps per server: how many, the batches replayed, the batches lost for good.
        A ZMQ reconnection is silent on the wire: what it missed shows up here as a gap. Every server
        with a KV-event endpoint has its counters from the start, at zero: a series that first appeared
        at its first gap would hide that gap from increase()."""
        gaps = CounterMetricFamily(
            "prefixscope_kv_event_gaps", "KV event sequence gaps seen.", labels=["server"]
        )
        replayed = CounterMetricFamily(
            "prefixscope_kv_event_batches_replayed", "Missed KV event batches the replay endpoint sent back.",
            labels=["server"],
        )  # fmt: skip
        lost = CounterMetricFamily(
            "prefixscope_kv_event_batches_lost",
            "KV event batches neither received nor replayed.",
            labels=["server"],
        )
        found = KVGap.objects.values("server__name").annotate(
            n=Count("id"), back=Sum("recovered"), gone=Sum("lost")
        )
        counted: dict[str, dict[str, Any]] = {row["server__name"]: dict(row) for row in found.order_by()}
        streamed = Server.objects.exclude(state=Server.State.DISABLED).exclude(kv_events_endpoint="")
        for name in sorted(set(counted) | set(streamed.values_list("name", flat=True))):
            row = counted.get(name, {})
            gaps.add_metric([name], float(row.get("n") or 0))
            replayed.add_metric([name], float(row.get("back") or 0))
            lost.add_metric([name], float(row.get("gone") or 0))
        yield from (gaps, replayed, lost)

    def _streams(self) -> Iterator[Metric]:
        """Per KV stream: the newest event's time (a stall), restarts, and blocks stored, removed and
        stored again soon after removal (eviction thrashing)."""
        labels = ["server", "dp_rank"]
        newest = GaugeMetricFamily(
            "prefixscope_kv_event_last_timestamp_seconds",
            "Batch time of the newest stored KV event.",
            labels=labels,
        )
        restarts = CounterMetricFamily(
            "prefixscope_kv_stream_restarts",
            "Times the server's KV event sequence started over.",
            labels=labels,
        )
        blocks = {
            column: CounterMetricFamily(f"prefixscope_kv_{column}", help_text, labels=labels)
            for column, help_text in (
                ("blocks_stored", "Blocks the server reported stored (BlockStored)."),
                ("blocks_removed", "Blocks the server reported removed (BlockRemoved): evictions."),
                (
                    "blocks_thrashed",
                    "Blocks stored again within PREFIXSCOPE_THRASH_SECONDS of their removal.",
                ),
            )
        }
        for row in KVStream.objects.values("server__name", "dp_rank", "last_event_at", "epoch", *blocks):
            key = [row["server__name"], str(row["dp_rank"])]
            newest.add_metric(key, row["last_event_at"].timestamp())
            restarts.add_metric(key, float(row["epoch"]))
            for column, family in blocks.items():
                family.add_metric(key, float(row[column]))
        yield from (newest, restarts, *blocks.values())

    def _rollup_progress(self) -> Iterator[GaugeMetricFamily]:
        """The newest minute of the request rollups and of the diagnoses' rollups: ingest and
        analysis lag is time() minus them, while requests arrive."""
        family = GaugeMetricFamily(
            "prefixscope_rollup_newest_minute_timestamp_seconds",
            "Start of the newest minute summed into a rollup (requests: ingested; diagnoses: analysed).",
            labels=["rollup"],
        )
        for rollup, model in (("requests", MinuteRollup), ("diagnoses", LossMinute)):
            newest = model.objects.aggregate(newest=Max("minute"))["newest"]
            if newest is not None:
                family.add_metric([rollup], newest.timestamp())
        yield family

    def _processes(self, now: datetime) -> Iterator[Metric]:
        """What collector processes hold in memory, as they last reported it (CollectorProcess): the
        in-memory figures of live processes only; when each last reported, until it has a successor."""
        labels = ["kind", "name", "process"]
        reported = GaugeMetricFamily(
            "prefixscope_collector_last_report_timestamp_seconds",
            "When a collector process (gateway, KV subscriber) last reported itself.",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            "prefixscope_collector_queue_depth",
            "Records (gateway) or KV event rows (subscriber) waiting in a live process's memory.",
            labels=labels,
        )
        spill = GaugeMetricFamily(
            "prefixscope_gateway_spill_file_bytes",
            "Size of the gateway's spill file (records kept while PostgreSQL was away), as last reported.",
            labels=["name", "process"],
        )
        held = GaugeMetricFamily(
            "prefixscope_kv_leases_held",
            "KV-event leases (servers' streams) a live subscriber process holds.",
            labels=["name", "process"],
        )
        changes = CounterMetricFamily(
            "prefixscope_kv_lease_events",
            "Leases a subscriber process took, lost (lease connection broken) or released since its start.",
            labels=["name", "process", "event"],
        )
        for process in current_processes(now):
            key = [process.kind, process.name, process.process]
            reported.add_metric(key, process.reported_at.timestamp())
            if process.kind == CollectorProcess.Kind.GATEWAY:
                spill.add_metric([process.name, process.process], float(process.spill_bytes))
            else:
                for event, count in (
                    ("taken", process.leases_taken),
                    ("lost", process.leases_lost),
                    ("released", process.leases_released),
                ):
                    changes.add_metric([process.name, process.process, event], float(count))
            if now - process.reported_at <= PROCESS_LIVE:
                queued.add_metric(key, float(process.queue_depth))
                if process.kind == CollectorProcess.Kind.KV_SUBSCRIBER:
                    held.add_metric([process.name, process.process], float(process.leases_held))
        yield from (reported, queued, spill, held, changes)

    def _regressions(self) -> Iterator[GaugeMetricFamily]:
        """One sample per regression not resolved (a handful: they open rarely and close): muted ones
        too, with their state, so that a rule can leave them out; with the template and server of its
        scope ("" for none) and the owner its alert is routed to (app/regressions/owners.py)."""
        labels = ["scope", "name", "metric", "kind", "expected", "state"]
        labels += ["template", "server", "owner_kind", "owner"]
        active = GaugeMetricFamily(
            "prefixscope_regression_active", "1 per regression not resolved yet.", labels=labels
        )
        lost = GaugeMetricFamily(
            "prefixscope_regression_lost_tokens_per_hour",
            "Prefill tokens an hour a regression's scope lost since its change over what it lost at its rate "
            "before: what reverting or fixing the change wins back.",
            labels=labels,
        )
        found = Regression.objects.exclude(state=Regression.State.RESOLVED).select_related(
            "template__repository", "server", "suspect_version__template__repository"
        )
        for regression in found:
            owner = owner_of(regression)
            values = [
                regression.scope, regression.scope_label, regression.metric, regression.kind,
                str(regression.expected).lower(), regression.state,
                regression.template.name if regression.template else "",
                regression.server.name if regression.server else "", owner.kind, owner.name,
            ]  # fmt: skip
            active.add_metric(values, 1.0)
            lost.add_metric(values, regression.lost_tokens_per_hour)
        yield active
        yield lost
