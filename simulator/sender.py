"""Traffic for the simulated fleet: send a scenario's planned requests to the servers.

``run`` sends the requests ``simulator.planner.plan_requests`` plans with aiohttp on the scenario's
clock scaled by ``speed``, makes the admin calls of capacity cuts and restarts at their times, and
reads each answer's cached tokens; a side server's clients that bypass the gateway
(``gateway_bypass_from``) send to the engine's own URL instead. Its command line is
``simulator.loadgen``.
"""

from __future__ import annotations

import asyncio
import heapq
import json
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import aiohttp

from simulator.hosted import demo_traffic
from simulator.hosted_report import report_hosted
from simulator.planner import EPOCH, PlannedRequest, plan_requests, plan_side_requests
from simulator.run_summary import AdminCall, RequestResult, RunSummary
from simulator.scenario import (
    CapacityCut,
    Scenario,
    ServerRestart,
)
from simulator.scenario_side import UndecodableEvents
from simulator.template_repo import Commit, TemplateRepoError

logger = logging.getLogger(__name__)

AdminEvent = CapacityCut | ServerRestart | UndecodableEvents
REQUEST_TIMEOUT_SECONDS = 120.0
"""Per request, streaming included; a server that takes longer counts as an error, not a hang."""


@dataclass(frozen=True, slots=True)
class Ingest:
    """Where an application reports its hosted-API usage: Prefixscope's web URL and an ingest token."""

    web_url: str
    token: str


@dataclass(frozen=True, slots=True)
class Usage:
    """What an answer's usage block says; None for what it lacks (vLLM may send null details)."""

    prompt_tokens: int | None
    cached_tokens: int | None


def parse_usage(usage: object) -> Usage:
    """Prompt and cached tokens of an OpenAI-style usage block (``prompt_tokens_details.cached_tokens``).

    Tolerates null or missing details (vLLM without ``--enable-prompt-tokens-details``, or older vLLM
    on a miss) and a missing block: what is absent or not an integer is None.
    """
    if not isinstance(usage, dict):
        return Usage(None, None)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(_integer(usage.get("prompt_tokens")), _integer(cached))


def _integer(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


async def run(
    scenario: Scenario,
    base_urls: Sequence[str],
    *,
    speed: float,
    commits: Sequence[Commit],
    seed: int,
    concurrency: int = 16,
    start: datetime = EPOCH,
    run_id: str = "",
    publish: Callable[[Commit], None] | None = None,
    ingest: Ingest | None = None,
    direct_urls: Sequence[str] | None = None,
    later_round: bool = False,
) -> RunSummary:
    """Send the scenario's planned requests and make its admin calls; never raises for HTTP failures.

    ``base_urls[i]`` is server i (``http://host:port``, no ``/v1``); there must be one per server.
    ``speed`` is virtual seconds per wall second; ``inf`` or 0 sends as fast as ``concurrency``
    allows. At most ``concurrency`` requests are in flight: when they are all busy, later requests
    wait, so a slow fleet stretches the run. Admin calls (``POST {base}/_simulator/capacity`` with
    ``{"num_blocks": N}``, ``POST {base}/_simulator/restart``) happen at their virtual time, before any
    request planned at or after it is sent; requests already in flight go on. Failed requests and
    admin calls are counted in the summary. ``run_id`` goes into every request id
    (``plan_requests``). ``base_urls`` go on with the side servers' (``scenario.server_count`` in
    all), which get their own requests and conversations (``plan_side_requests``); with ``ingest``,
    the scenario's hosted-API usage is reported to it at its times (simulator/hosted_report.py).
    With ``publish``, each commit after virtual second 0 is passed to it at its
    time, before any request planned at or after it is sent (a template version goes live when its
    commit lands: ``stage_repo`` and ``push``); a failure is logged, not raised. A side server's
    ``undecodable_kv_events`` is an admin call too (``POST {base}/_simulator/undecodable_kv_events``).
    ``direct_urls`` are the engines' own URLs (default ``base_urls``: no gateway in between): a side
    server's requests from its ``gateway_bypass_from`` on go there, from second 0 in a ``later_round``
    (a misconfigured client stays so). Raises ValueError for bad arguments.
    """
    urls = _check_arguments(scenario, base_urls, speed, concurrency)
    direct = urls if direct_urls is None else _check_arguments(scenario, direct_urls, speed, concurrency)
    bypass = {
        side.server: 0.0 if later_round else side.gateway_bypass_from
        for side in scenario.side_servers
        if side.gateway_bypass_from is not None
    }
    clock = _Clock(math.inf if speed == 0 else speed, time.monotonic())
    logger.info("running scenario %s on %d servers at speed %s", scenario.name, len(urls), speed)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(limit=concurrency + 1)  # + 1: admin calls never wait for requests
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        sender = _Sender(session, _Routes(urls, direct, bypass), clock, asyncio.Semaphore(concurrency))
        planned = heapq.merge(
            plan_requests(scenario, commits, seed=seed, start=start, run_id=run_id),
            plan_side_requests(scenario, commits, seed=seed, start=start, run_id=run_id),
            key=lambda request: request.at,
        )
        admin: list[AdminEvent] = [e for e in scenario.timeline if isinstance(e, CapacityCut | ServerRestart)]
        # A side server's fault past the run's end (a scenario shortened for a test) is left out with
        # its traffic: the run does not wait for it.
        admin += [
            side.undecodable_events
            for side in scenario.side_servers
            if side.undecodable_events and side.undecodable_events.at <= scenario.duration
        ]
        releases = [commit for commit in commits if commit.time > 0] if publish else []
        hosted = _report_hosted(session, scenario, ingest, clock, start, f"{run_id}-{seed}-")
        results, calls = await sender.dispatch(planned, admin, releases, publish)
        await hosted
    summary = RunSummary(tuple(results), tuple(calls), time.monotonic() - clock.started)
    logger.info(
        "scenario %s: %d requests, %d errors, hit rate %s, %.1f s",
        scenario.name, summary.requests, summary.errors, summary.hit_rate, summary.wall_seconds,
    )  # fmt: skip
    return summary


def _report_hosted(
    session: aiohttp.ClientSession,
    scenario: Scenario,
    ingest: Ingest | None,
    clock: _Clock,
    start: datetime,
    id_prefix: str,
) -> asyncio.Future[int]:
    """The scenario's hosted-API usage reported in the background (at once done without any)."""
    if scenario.hosted is None or ingest is None:
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        done.set_result(0)
        return done
    requests = demo_traffic(scenario.hosted, start=start, id_prefix=id_prefix)
    return asyncio.ensure_future(
        report_hosted(session, requests, web_url=ingest.web_url.rstrip("/"), token=ingest.token,
                      start=start, wait_until=clock.wait_until)
    )  # fmt: skip


def _check_arguments(
    scenario: Scenario, base_urls: Sequence[str], speed: float, concurrency: int
) -> list[str]:
    if len(base_urls) != scenario.server_count:
        raise ValueError(f"the scenario has {scenario.server_count} servers but {len(base_urls)} base URLs")
    if math.isnan(speed) or speed < 0:
        raise ValueError(f"speed must be 0, positive or inf, got {speed}")
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    return [url.rstrip("/") for url in base_urls]


@dataclass(frozen=True, slots=True)
class _Clock:
    """Maps virtual seconds to wall time: virtual second t is ``started + t / speed`` (monotonic)."""

    speed: float
    started: float

    async def wait_until(self, at: float) -> None:
        """Sleep until virtual second ``at``; return at once when it has passed or speed is inf."""
        delay = self.started + at / self.speed - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)

    def elapsed(self) -> float:
        """Wall seconds since the run started."""
        return time.monotonic() - self.started


@dataclass(frozen=True, slots=True)
class _Routes:
    """Where a request goes: server i's base URL (its gateway, in the demo), or its engine's own URL
    for a side server's clients that bypass the gateway from virtual second ``bypass[i]`` on."""

    urls: list[str]
    direct: list[str]
    bypass: dict[int, float]

    def url(self, request: PlannedRequest) -> str:
        since = self.bypass.get(request.server)
        bypassed = since is not None and request.at >= since
        return (self.direct if bypassed else self.urls)[request.server] + request.path


class _Sender:
    """Sends one run's requests and admin calls over one session."""

    def __init__(
        self, session: aiohttp.ClientSession, routes: _Routes, clock: _Clock, slots: asyncio.Semaphore
    ) -> None:
        self.session = session
        self.routes = routes
        self.urls = routes.urls
        self.clock = clock
        self.slots = slots

    async def dispatch(
        self,
        planned: Iterable[PlannedRequest],
        admin: Sequence[AdminEvent],
        releases: Sequence[Commit] = (),
        publish: Callable[[Commit], None] | None = None,
    ) -> tuple[list[RequestResult], list[AdminCall]]:
        """Send everything in time order; admin calls and commit releases go before requests planned
        at the same time."""
        pending: deque[AdminEvent | Commit] = deque(
            sorted([*admin, *releases], key=_event_time)  # stable: the timeline's order at one time
        )
        calls: list[AdminCall] = []
        tasks: list[asyncio.Task[RequestResult]] = []

        async def until(at: float) -> None:
            while pending and _event_time(pending[0]) <= at:
                event = pending.popleft()
                if isinstance(event, Commit):
                    await self.release(event, publish)
                else:
                    calls.append(await self.admin(event))

        for request in planned:
            await until(request.at)
            await self.clock.wait_until(request.at)
            await self.slots.acquire()  # released by send(), so at most `concurrency` in flight
            tasks.append(asyncio.create_task(self.send(request)))
        await until(math.inf)
        return list(await asyncio.gather(*tasks)), calls

    async def release(self, commit: Commit, publish: Callable[[Commit], None] | None) -> None:
        """Publish a template commit at its virtual time; a failure is logged, not raised."""
        await self.clock.wait_until(commit.time)
        if publish is None:
            return
        try:
            await asyncio.to_thread(publish, commit)
        except TemplateRepoError as exc:
            logger.warning("template commit %s not published: %s", commit.sha[:12], exc)
            return
        logger.info(
            "%s: commit %s landed at virtual second %s", commit.template, commit.sha[:12], commit.time
        )

    async def send(self, request: PlannedRequest) -> RequestResult:
        """Send one request and read its usage; failures become the result's error."""
        began = time.monotonic()
        try:
            status, usage, error = await self._exchange(request)
        finally:
            self.slots.release()
        if error is not None:
            logger.debug("request %s to server %d failed: %s", request.request_id, request.server, error)
        return RequestResult(
            index=request.index,
            at=request.at,
            server=request.server,
            template=request.template,
            version=request.version,
            tenant=request.tenant,
            request_id=request.request_id,
            stream=request.stream,
            status=status,
            prompt_tokens=usage.prompt_tokens,
            cached_tokens=usage.cached_tokens,
            latency=time.monotonic() - began,
            error=error,
        )

    async def _exchange(self, request: PlannedRequest) -> tuple[int, Usage, str | None]:
        status = 0
        url = self.routes.url(request)
        try:
            async with self.session.post(url, json=request.body, headers=request.headers) as response:
                status = response.status
                if status >= 400:
                    await response.read()  # drained, so that the connection can be reused
                    return status, Usage(None, None), f"HTTP {status}"
                usage = await (_stream_usage(response) if request.stream else _json_usage(response))
                return status, usage, None
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            # ValueError covers an answer that is not JSON; the message never holds the prompt.
            return status, Usage(None, None), f"{type(exc).__name__}: {exc}"

    async def admin(self, event: AdminEvent) -> AdminCall:
        """Make a fault's admin call at its virtual time; a failure is recorded, not raised."""
        await self.clock.wait_until(event.at)
        base = self.urls[event.server]
        action: Literal["capacity", "restart", "undecodable_kv_events"]
        if isinstance(event, CapacityCut):
            action = "capacity"
            call = self.session.post(f"{base}/_simulator/capacity", json={"num_blocks": event.num_blocks})
        elif isinstance(event, UndecodableEvents):
            action = "undecodable_kv_events"
            call = self.session.post(f"{base}/_simulator/{action}", json={"batches": event.batches})
        else:
            action = "restart"
            call = self.session.post(f"{base}/_simulator/restart")
        sent_after = self.clock.elapsed()
        status, error = 0, None
        try:
            async with call as response:
                await response.read()
                status = response.status
                error = f"HTTP {status}" if status >= 400 else None
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        log = logger.warning if error else logger.info
        log("%s of server %d at virtual second %s: %s", action, event.server, event.at, error or "done")
        return AdminCall(event.at, event.server, action, status, error, sent_after, self.clock.elapsed())


def _event_time(event: AdminEvent | Commit) -> float:
    return event.time if isinstance(event, Commit) else event.at


async def _json_usage(response: aiohttp.ClientResponse) -> Usage:
    data = await response.json(content_type=None)
    return parse_usage(data.get("usage") if isinstance(data, dict) else None)


async def _stream_usage(response: aiohttp.ClientResponse) -> Usage:
    """The usage of a completion stream: vLLM sends it in the last chunk before ``[DONE]``."""
    usage = Usage(None, None)
    async for raw in response.content:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue  # blank separators, comments, event names
        payload = line.removeprefix("data:").strip()
        if payload == "[DONE]":
            break
        chunk = json.loads(payload)
        if isinstance(chunk, dict) and chunk.get("usage"):
            usage = parse_usage(chunk["usage"])
    return usage
