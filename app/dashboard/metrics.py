"""Prefixscope's own /metrics: what it collected and what it could not, read from PostgreSQL per scrape.

A custom collector (not counters in memory) because the numbers live in the database and every
web process must report the same values. Each family is one aggregate query over small tables.
"""

from collections.abc import Iterator

from django.db.models import Sum
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from app.fleet.models import Server
from app.regressions.models import Regression
from app.traffic.models import KVGap, KVStream, RejectedInput


class PrefixscopeCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield self._servers()
        yield self._rejected()
        yield self._lost_batches()
        yield self._stream_positions()
        yield from self._regressions()

    def _servers(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "prefixscope_server_up",
            "1 when the server's last /metrics pull worked.",
            labels=["server", "model"],
        )
        for name, model, state in Server.objects.exclude(state=Server.State.DISABLED).values_list(
            "name", "model", "state"
        ):
            family.add_metric([name, model], 1.0 if state == Server.State.ACTIVE else 0.0)
        return family

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

    def _lost_batches(self) -> CounterMetricFamily:
        family = CounterMetricFamily(
            "prefixscope_kv_event_batches_lost",
            "KV event batches neither received nor replayed.",
            labels=["server"],
        )
        for row in KVGap.objects.values("server__name").annotate(lost=Sum("lost")):
            family.add_metric([row["server__name"]], float(row["lost"] or 0))
        return family

    def _stream_positions(self) -> GaugeMetricFamily:
        family = GaugeMetricFamily(
            "prefixscope_kv_event_last_timestamp_seconds",
            "Batch time of the newest stored KV event.",
            labels=["server", "dp_rank"],
        )
        for server, rank, at in KVStream.objects.values_list("server__name", "dp_rank", "last_event_at"):
            family.add_metric([server, str(rank)], at.timestamp())
        return family

    def _regressions(self) -> Iterator[GaugeMetricFamily]:
        """One sample per regression not resolved (a handful: they open rarely and close): muted ones
        too, with their state, so that a rule can leave them out."""
        labels = ["scope", "name", "metric", "kind", "expected", "state"]
        active = GaugeMetricFamily(
            "prefixscope_regression_active", "1 per regression not resolved yet.", labels=labels
        )
        lost = GaugeMetricFamily(
            "prefixscope_regression_lost_tokens_per_hour",
            "Prefill tokens an hour that a regression's lost reuse costs, at the traffic since its change.",
            labels=labels,
        )
        found = Regression.objects.exclude(state=Regression.State.RESOLVED).select_related(
            "template", "server"
        )
        for regression in found:
            values = [
                regression.scope, regression.scope_label, regression.metric, regression.kind,
                str(regression.expected).lower(), regression.state,
            ]  # fmt: skip
            active.add_metric(values, 1.0)
            lost.add_metric(values, regression.lost_tokens_per_hour)
        yield active
        yield lost
