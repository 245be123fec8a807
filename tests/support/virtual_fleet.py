"""A scenario's traffic over virtual minutes, stored as a deployment stores it, without waiting for it.

The simulated fleet serves in wall time, so an hour of it takes an hour. Here the scenario's requests
(simulator.planner, the same prompts and routing as `make run`) go through the simulator's prefix caches
(simulator.cache, what each server would have reused, and its KV events in vLLM's wire encoding) at
virtual times laid out before now; the events are decoded by the collector and stored
(store_kv_events), the records ingested (ingest_request_records, as a REST batch would be), the
template repository created by the simulator (simulator.template_repo) and imported by Prefixscope.
Then the rollups, the diagnosis and the regression detection run once per virtual minute, as beat
runs them.

Capacity cuts and restarts of the timeline are applied to the caches at their time, as the simulator
applies them (a new process: a new epoch, an empty cache, its counters from zero). With `scrape_every`,
each server's /metrics (simulator.metrics, fed as the simulated server feeds it) is pulled at that
virtual interval, parsed by the collector and stored (record_scrape), and the server rollups refreshed
each minute as beat refreshes them. A helper of the tests and of
bench/bench_regressions.py: nothing here is product code.
"""

import random
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.utils import timezone
from prometheus_client import generate_latest

from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.domain import gpt2
from app.fleet.models import Server
from app.fleet.services import register_server
from app.prompts.history import import_template_history
from app.prompts.services import register_repository
from app.rollups.refresh import refresh_minute_rollups
from app.rollups.servers import refresh_server_minutes
from app.rollups.tasks import ROLLUP_LOOKBACK
from app.traffic.collection.kv_collector import event_rows
from app.traffic.services.kv_events import KVEventRow, StreamPosition, store_kv_events
from app.traffic.services.partitions import maintain_partitions
from app.traffic.services.requests import ingest_request_records
from app.traffic.services.scrapes import record_scrape
from collectors.kv_events.parse import decode_sub_message
from collectors.metrics.parse import parse_metrics
from collectors.records import RequestFacts
from simulator.block_metrics import BlockMetrics, Eviction
from simulator.cache import PrefixCache
from simulator.kv_events import encode_batch, seq_frame
from simulator.metrics import CacheInfo, RequestTiming, ServerMetrics
from simulator.planner import PlannedRequest, plan_requests
from simulator.scenario import CapacityCut, Scenario, ServerRestart, parse_scenario
from simulator.server import ServerConfig
from simulator.template_repo import Commit, create_repo

BATCH_SECONDS = 30  # virtual seconds of records and events stored at once
CHECK_SECONDS = 15  # with `every_check`: records stored and the check called this often, as beat's
# The simulated servers' default prefill rate, which their TTFTs follow.
PREFILL_TOKENS_PER_SECOND: float = next(
    f.default for f in fields(ServerConfig) if f.name == "prefill_tokens_per_second"
)  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class VirtualRun:
    scenario: Scenario
    start: datetime  # virtual second 0
    commits: list[Commit]
    planned: list[PlannedRequest]
    servers: list[Server]
    metrics: list[ServerMetrics]  # each server's /metrics as it ended (empty without `scrape_every`)

    def at(self, seconds: float) -> datetime:
        return self.start + timedelta(seconds=seconds)


def run_virtually(
    definition: dict[str, Any],
    tmp_path: Path,
    *,
    seed: int = 0,
    every_minute: Callable[[datetime], object] | None = None,
    keep: Callable[[PlannedRequest], bool] | None = None,
    held_back: Callable[[PlannedRequest], bool] | None = None,
    ttft_factor: Callable[[PlannedRequest], float] | None = None,
    scrape_every: float | None = None,
    every_check: Callable[[datetime], object] | None = None,
) -> VirtualRun:
    """Store the scenario's traffic, ending a little before now, diagnosing it minute by minute;
    `every_minute(now)` is called after each minute's diagnosis (the detection, for one). `keep`
    thins the planned requests out (traffic swings, idle gaps): those it refuses are not sent.
    Requests `held_back` says true of are sent with the templates' first versions (the timeline's
    commits roll out elsewhere: a canary, a tenant's variant); `ttft_factor` slows a request's TTFT
    (a slow server) by the factor it gives. `scrape_every`: pull each server's /metrics every so
    many virtual seconds (none by default). `every_check(now)` is called every CHECK_SECONDS after
    the records up to then are stored and diagnosed (the deploy check, as beat runs it between
    minutes, on the diagnoses beat writes every 30 s)."""
    scenario = parse_scenario(definition)
    # Virtual second 0 half a minute into a minute: the scenario's faults (at whole minutes) land
    # mid-minute, as they would at any time, and every run alike (its delays comparable).
    earlier = timezone.now() - timedelta(seconds=scenario.duration + 120)
    start = earlier.astimezone(UTC).replace(second=30, microsecond=0)
    maintain_partitions(now=timezone.now())
    commits = create_repo(tmp_path / "templates", scenario, start)
    repository = register_repository(location=str(tmp_path / "templates"), globs=["templates/*.j2"])
    import_template_history(repository_id=repository.pk, now=timezone.now())
    servers = _register(scenario)
    planned = list(plan_requests(scenario, commits, seed=seed, start=start))
    if held_back is not None:  # the same arrivals, tenants and servers: only the prompts differ
        first = list(plan_requests(scenario, [c for c in commits if c.time <= 0], seed=seed, start=start))
        planned = [old if held_back(new) else new for new, old in zip(planned, first, strict=True)]
    planned = [r for r in planned if keep is None or keep(r)]
    metrics = (
        [_started_metrics(scenario, scenario.servers.num_blocks) for _ in servers] if scrape_every else []
    )
    run = VirtualRun(scenario, start, commits, planned, servers, metrics)
    forget_kept_replay()
    _Serving(run, ttft_factor or (lambda request: 1.0), scrape_every).serve(every_minute, every_check)
    return run


def record_scrapes(run: VirtualRun, *, at: datetime) -> None:
    """Pull every server's /metrics as the scraper does (its text parsed by the collector) and store
    the pulls as of `at`."""
    for server, metrics in zip(run.servers, run.metrics, strict=True):
        samples = parse_metrics(generate_latest(metrics.registry).decode())
        record_scrape(server=server, scraped_at=at, samples=samples, duration_seconds=0.01)


def _started_metrics(scenario: Scenario, num_blocks: int) -> ServerMetrics:
    """A started server's families, as simulator.server.Engine makes them on each (re)start."""
    info = CacheInfo(block_size=scenario.servers.block_size, num_gpu_blocks=num_blocks)
    config = ServerConfig()
    return ServerMetrics(
        scenario.model, info, max_model_len=config.max_model_len, kv_cache_metrics=config.kv_cache_metrics
    )


def _register(scenario: Scenario) -> list[Server]:
    # Closed loopback ports: whatever asks them (the evidence's /detokenize) is refused at once and
    # falls back to the bundled tokenizer, the simulator's own; nothing leaves the machine.
    servers = [
        register_server(name=f"virtual-{n}", base_url=f"http://127.0.0.1:{n + 1}", model=scenario.model)
        for n in range(scenario.servers.count)
    ]
    Server.objects.filter(pk__in=[s.pk for s in servers]).update(
        block_size=scenario.servers.block_size, hash_algo="sha256_cbor"
    )
    return servers


class _Serving:
    """The caches, sequence numbers and epochs of the fleet, and what is waiting to be stored."""

    def __init__(
        self, run: VirtualRun, ttft_factor: Callable[[PlannedRequest], float], scrape_every: float | None
    ) -> None:
        self.run = run
        self.ttft_factor = ttft_factor
        self.scrape_every = scrape_every
        self.next_scrape = 0.0
        blocks, size = run.scenario.servers.num_blocks, run.scenario.servers.block_size
        self.now = run.at(0).timestamp()  # the virtual clock, moved by each request served
        self.caches = [self._cache(server, size, blocks) for server in range(len(run.servers))]
        self.seqs = [0] * len(run.servers)
        self.epochs = [0] * len(run.servers)
        self.facts: list[RequestFacts] = []
        self.rows: list[KVEventRow] = []
        self.timeline = [e for e in run.scenario.timeline if isinstance(e, CapacityCut | ServerRestart)]
        self.noise = random.Random(0)

    def serve(
        self,
        every_minute: Callable[[datetime], object] | None,
        every_check: Callable[[datetime], object] | None = None,
    ) -> None:
        flushed_at, minute, check = 0.0, 60.0, CHECK_SECONDS
        for request in self.run.planned:
            while request.at >= minute:  # the minute before has all its records: a beat's run
                self._flush(minute)
                flushed_at = minute
                self._minute(minute, every_minute)
                minute += 60
            while every_check is not None and request.at >= check:
                self._flush(check)
                flushed_at = check
                diagnose_requests(now=self.run.at(check))  # beat's runs between the minutes' (30 s)
                every_check(self.run.at(check))
                check += CHECK_SECONDS
            if request.at - flushed_at >= BATCH_SECONDS:
                self._flush(request.at)
                flushed_at = request.at
            self._scrape_until(request.at)
            self._apply_timeline(request.at)
            self._serve(request)
        end = self.run.scenario.duration
        self._flush(end)
        while minute <= end + 60:
            self._minute(minute, every_minute)
            minute += 60

    def _scrape_until(self, seconds: float) -> None:
        """The pulls due by virtual second `seconds`, each of every server."""
        while self.scrape_every and self.next_scrape <= seconds:
            record_scrapes(self.run, at=self.run.at(self.next_scrape))
            self.next_scrape += self.scrape_every

    def _minute(self, seconds: float, every_minute: Callable[[datetime], object] | None) -> None:
        now = self.run.at(seconds + 31)  # the diagnosis waits 30 s for late events
        refresh_minute_rollups(since=now - ROLLUP_LOOKBACK, until=now)  # as beat's rollups.refresh_rollups
        if self.scrape_every:
            self._scrape_until(seconds)
            refresh_server_minutes(since=now - ROLLUP_LOOKBACK, until=now)
        diagnose_requests(now=now)
        if every_minute is not None:
            every_minute(now)

    def _apply_timeline(self, at: float) -> None:
        """A capacity cut is a restart with fewer blocks (vLLM sizes its cache at start-up, and the
        simulator does the same): a new process, its cache empty, its sequence from 0 in a new epoch."""
        while self.timeline and self.timeline[0].at <= at:
            event = self.timeline.pop(0)
            server, cache = event.server, self.caches[event.server]
            blocks = event.num_blocks if isinstance(event, CapacityCut) else cache.num_blocks
            self.caches[server] = self._cache(server, cache.block_size, blocks)
            self.seqs[server], self.epochs[server] = 0, self.epochs[server] + 1
            if self.run.metrics:  # its counters from zero, its cache of the new size
                self.run.metrics[server] = _started_metrics(self.run.scenario, blocks)

    def _cache(self, server: int, block_size: int, num_blocks: int) -> PrefixCache:
        """A server's cache, its block metrics (--kv-cache-metrics) timed by the virtual clock and
        observed by the server's /metrics as they are then (a restart starts new ones)."""

        def observe(eviction: Eviction) -> None:
            if self.run.metrics:
                self.run.metrics[server].observe_eviction(eviction)

        block_metrics = BlockMetrics(observe, sample=1.0, clock=lambda: self.now)
        return PrefixCache(block_size, num_blocks, block_metrics=block_metrics)

    def _serve(self, request: PlannedRequest) -> None:
        body = request.body
        text = gpt2.render_chat(body["messages"]) if "messages" in body else str(body["prompt"])  # type: ignore[arg-type]
        tokens = gpt2.encode(text)
        salt = body.get("cache_salt")
        cache, server = self.caches[request.server], self.run.servers[request.server]
        arrived_at = self.run.at(request.at)
        self.now = arrived_at.timestamp()
        admission = cache.admit(
            request.request_id, tokens, cache_salt=salt if isinstance(salt, str) else None
        )
        cache.finish(request.request_id)
        events = cache.take_events()
        payload = encode_batch(arrived_at.timestamp() + 0.001, events, None)
        seq = self.seqs[request.server]
        message = decode_sub_message([b"kv@virtual", seq_frame(seq), payload])
        self.rows += event_rows(
            message.batch,
            server_id=server.pk,
            epoch=self.epochs[request.server],
            seq=seq,
            received_at=arrived_at,
        )
        self.seqs[request.server] += 1
        ttft = self._ttft(tokens, admission.cached_tokens) * self.ttft_factor(request)
        self.facts.append(
            RequestFacts(
                request_id=request.request_id,
                arrived_at=arrived_at,
                server=server.name,
                model=self.run.scenario.model,
                tenant=request.tenant,
                template=request.template,
                template_version=request.version,
                prompt_tokens=len(tokens),
                cached_tokens=admission.cached_tokens,
                client_ttft_seconds=ttft,
                cache_salt=salt if isinstance(salt, str) else None,
                prompt_token_ids=tokens,
            )
        )
        if self.run.metrics:  # as simulator.server.Engine counts a request and its blocks
            metrics = self.run.metrics[request.server]
            metrics.observe_request(RequestTiming(len(tokens), admission.cached_tokens, 0, 0.0, ttft, 0.0))
            metrics.kv_cache_usage.labels(**metrics.labels).set(cache.usage)

    def _ttft(self, tokens: list[int], cached: int) -> float:
        """As the simulated server times a request (simulator.server.Engine), without its queue."""
        return 0.002 + (len(tokens) - cached) / PREFILL_TOKENS_PER_SECOND * self.noise.uniform(0.95, 1.05)

    def _flush(self, seconds: float) -> None:
        now = self.run.at(seconds)
        positions = [
            StreamPosition(
                server_id=s.pk, dp_rank=0, epoch=self.epochs[i], last_seq=self.seqs[i] - 1, last_event_at=now
            )
            for i, s in enumerate(self.run.servers)
            if self.seqs[i]
        ]
        if self.rows or positions:
            store_kv_events(rows=self.rows, positions=positions)
        if self.facts:
            ingest_request_records(self.facts, source="rest", now=now)
        self.facts, self.rows = [], []
