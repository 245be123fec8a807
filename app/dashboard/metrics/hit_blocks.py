"""Per server on /metrics: its effective block, and the state of its hit counter (whether the engine
reports the hits its TTFT shows: app/domain/hitcounter.py), under bounded labels."""

from collections.abc import Iterator
from datetime import datetime, timedelta

from django.conf import settings
from prometheus_client.core import GaugeMetricFamily, Metric

from app.diagnosis.counters import counter_evidence
from app.domain.hitcounter import MIN_EACH, CounterEvidence, counter_not_wired
from app.fleet.models import Server

# The states of a server's hit counter over the diagnosis lookback: one series each, 1 for the one
# it is in (a fixed set: the label never carries free text).
STATES = ("wired", "not_wired", "no_evidence")


def hit_block_families(now: datetime) -> Iterator[Metric]:
    """`prefixscope_server_effective_block_tokens` and `prefixscope_server_hit_counter_state`."""
    labels = ["server", "model"]
    effective = GaugeMetricFamily(
        "prefixscope_server_effective_block_tokens",
        "The granularity of a prefix-cache hit on the server, in tokens: its block size, or the LCM of "
        "its KV-cache groups' blocks on a hybrid model, plus one block where speculative decoding "
        "drops the last matched one. Prompts shorter than it plus one token never hit.",
        labels=labels,
    )
    state = GaugeMetricFamily(
        "prefixscope_server_hit_counter_state",
        "1 for the state of the server's hit counter over the diagnosis lookback: wired, not_wired (no "
        "request reported a cached token while repeated prompts got their first token at least twice "
        "as fast as first sightings: a collection state, its requests are not counted as misses), or "
        f"no_evidence (fewer than {MIN_EACH} repeats or first sightings).",
        labels=[*labels, "state"],
    )
    since = now - timedelta(minutes=settings.PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES)
    evidence = counter_evidence(since=since, until=now)
    for server in Server.objects.exclude(state=Server.State.DISABLED):
        key = [server.name, server.model]
        hit = server.hit_block
        if hit is not None:
            effective.add_metric(key, float(hit.smallest_hit_prompt() - 1))
        now_in = _state(server.pk, evidence)
        for name in STATES:
            state.add_metric([*key, name], 1.0 if name == now_in else 0.0)
    yield from (effective, state)


def _state(server: int, evidence: dict[int, CounterEvidence]) -> str:
    found = evidence.get(server)
    if found is None or min(found.repeats, found.firsts) < MIN_EACH:
        return "no_evidence"
    return "not_wired" if counter_not_wired(found) else "wired"
