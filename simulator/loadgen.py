"""Traffic for the simulated fleet: send a scenario's planned requests to the servers, and the CLI.

``run`` sends the requests ``simulator.planner.plan_requests`` plans with aiohttp on the scenario's
clock scaled by ``speed``, makes the admin calls of capacity cuts and restarts at their times, and
reads each answer's cached tokens. The CLI creates the template repository and runs a scenario
against base URLs::

    python -m simulator.loadgen --scenario demo --repo /tmp/prompts \\
        --base-url http://127.0.0.1:8101 --base-url http://127.0.0.1:8102 ... --speed 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
import urllib.request
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

import aiohttp

from simulator.planner import EPOCH, PlannedRequest
from simulator.planner import plan_requests as plan_requests  # also loadgen's API; "as" tells mypy so
from simulator.run_summary import AdminCall, RequestResult, RunSummary, format_summary
from simulator.scenario import (
    CapacityCut,
    Scenario,
    ScenarioError,
    ServerRestart,
    load_scenario,
    resolve_scenario,
)
from simulator.template_repo import Commit, TemplateRepoError, create_repo

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_SECONDS = 120.0
"""Per request, streaming included; a server that takes longer counts as an error, not a hang."""


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
) -> RunSummary:
    """Send the scenario's planned requests and make its admin calls; never raises for HTTP failures.

    ``base_urls[i]`` is server i (``http://host:port``, no ``/v1``); there must be one per server.
    ``speed`` is virtual seconds per wall second; ``inf`` or 0 sends as fast as ``concurrency``
    allows. At most ``concurrency`` requests are in flight: when they are all busy, later requests
    wait, so a slow fleet stretches the run. Admin calls (``POST {base}/_simulator/capacity`` with
    ``{"num_blocks": N}``, ``POST {base}/_simulator/restart``) happen at their virtual time, before any
    request planned at or after it is sent; requests already in flight go on. Failed requests and
    admin calls are counted in the summary. ``run_id`` goes into every request id
    (``plan_requests``). Raises ValueError for bad arguments.
    """
    urls = _check_arguments(scenario, base_urls, speed, concurrency)
    clock = _Clock(math.inf if speed == 0 else speed, time.monotonic())
    logger.info("running scenario %s on %d servers at speed %s", scenario.name, len(urls), speed)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
    connector = aiohttp.TCPConnector(limit=concurrency + 1)  # + 1: admin calls never wait for requests
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        sender = _Sender(session, urls, clock, asyncio.Semaphore(concurrency))
        planned = plan_requests(scenario, commits, seed=seed, start=start, run_id=run_id)
        admin = [e for e in scenario.timeline if isinstance(e, CapacityCut | ServerRestart)]
        results, calls = await sender.dispatch(planned, admin)
    summary = RunSummary(tuple(results), tuple(calls), time.monotonic() - clock.started)
    logger.info(
        "scenario %s: %d requests, %d errors, hit rate %s, %.1f s",
        scenario.name, summary.requests, summary.errors, summary.hit_rate, summary.wall_seconds,
    )  # fmt: skip
    return summary


def _check_arguments(
    scenario: Scenario, base_urls: Sequence[str], speed: float, concurrency: int
) -> list[str]:
    if len(base_urls) != scenario.servers.count:
        raise ValueError(f"the scenario has {scenario.servers.count} servers but {len(base_urls)} base URLs")
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


class _Sender:
    """Sends one run's requests and admin calls over one session."""

    def __init__(
        self, session: aiohttp.ClientSession, urls: list[str], clock: _Clock, slots: asyncio.Semaphore
    ) -> None:
        self.session = session
        self.urls = urls
        self.clock = clock
        self.slots = slots

    async def dispatch(
        self, planned: Iterable[PlannedRequest], admin: Sequence[CapacityCut | ServerRestart]
    ) -> tuple[list[RequestResult], list[AdminCall]]:
        """Send everything in time order; admin events go before requests planned at the same time."""
        pending = deque(admin)
        calls: list[AdminCall] = []
        tasks: list[asyncio.Task[RequestResult]] = []
        for request in planned:
            while pending and pending[0].at <= request.at:
                calls.append(await self.admin(pending.popleft()))
            await self.clock.wait_until(request.at)
            await self.slots.acquire()  # released by send(), so at most `concurrency` in flight
            tasks.append(asyncio.create_task(self.send(request)))
        while pending:
            calls.append(await self.admin(pending.popleft()))
        return list(await asyncio.gather(*tasks)), calls

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
        url = self.urls[request.server] + request.path
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

    async def admin(self, event: CapacityCut | ServerRestart) -> AdminCall:
        """Make a fault's admin call at its virtual time; a failure is recorded, not raised."""
        await self.clock.wait_until(event.at)
        base = self.urls[event.server]
        if isinstance(event, CapacityCut):
            action: Literal["capacity", "restart"] = "capacity"
            call = self.session.post(f"{base}/_simulator/capacity", json={"num_blocks": event.num_blocks})
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
        return AdminCall(event.at, event.server, action, status, error, sent_after)


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


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: create the template repository, run the scenario, print the summary.

    With `--rounds N` the scenario runs N times (0: until stopped), each round with its own
    repository under `--repo`/round-K, the next seed, and virtual time starting anew (a demo
    shows its regressions again every round). Request ids carry `--run-id` (default: one made
    from the start time), so a demo restarted with the same seed sends ids no earlier run sent.
    Exit status 0 after the runs (failed requests are in the summaries), 1 when every request of
    a round failed, 2 for a bad scenario, arguments or repository folder.
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not wait_for_servers(args.base_url, timeout_seconds=args.wait):
        print(f"error: the servers did not answer /health within {args.wait} s", file=sys.stderr)  # noqa: T201
        return 2
    run_id = args.run_id or new_run_id()
    round_number = 0
    while args.rounds == 0 or round_number < max(args.rounds, 1):
        repo = Path(args.repo) if args.rounds == 1 else Path(args.repo) / f"round-{round_number}"
        status = _run_round(args, repo, seed=args.seed + round_number, run_id=run_id)
        if status != 0:
            return status
        round_number += 1
    return 0


def wait_for_servers(base_urls: Sequence[str], *, timeout_seconds: float) -> bool:
    """True once every server answers GET /health, False when `timeout_seconds` pass first."""
    deadline = time.monotonic() + timeout_seconds
    waiting = list(base_urls)
    while waiting and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(waiting[0].rstrip("/") + "/health", timeout=2):
                waiting.pop(0)
        except OSError:  # refused or timed out: the fleet is still starting
            time.sleep(0.2)
    return not waiting


def new_run_id() -> str:
    """A run id unlike any earlier run's: the clock in base 36 (milliseconds), 8 characters."""
    return _base36(time.time_ns() // 1_000_000)


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while number:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
    return text or "0"


def _run_round(args: argparse.Namespace, repo: Path, *, seed: int, run_id: str) -> int:
    try:
        scenario = load_scenario(resolve_scenario(args.scenario))
        start = datetime.now(UTC).replace(microsecond=0)
        commits = create_repo(repo, scenario, start)
        summary = asyncio.run(
            run(scenario, args.base_url, speed=args.speed, commits=commits, seed=seed,
                concurrency=args.concurrency, start=start, run_id=run_id)
        )  # fmt: skip
    except (ScenarioError, TemplateRepoError, ValueError, OSError) as exc:
        notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", []))
        print(f"error: {exc}{notes}", file=sys.stderr)  # noqa: T201
        return 2
    print(format_summary(summary), flush=True)  # noqa: T201
    return 1 if summary.requests and summary.errors == summary.requests else 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.loadgen", description="Run a scenario against a fleet."
    )
    parser.add_argument("--scenario", required=True, help="a shipped scenario name (demo) or a YAML file")
    parser.add_argument(
        "--base-url", action="append", required=True, help="a server's base URL; once per server, in order"
    )
    parser.add_argument(
        "--repo", required=True, help="an empty or new folder for the template git repository"
    )
    parser.add_argument(
        "--speed", type=float, default=1.0, help="virtual seconds per second; 0 or inf: no waits"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--run-id", default="", help="put into every request id (default: one made from the clock)"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="requests in flight at most")
    parser.add_argument(
        "--rounds", type=int, default=1, help="how many times to run the scenario; 0: forever"
    )
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the servers' /health")
    return parser


if __name__ == "__main__":
    sys.exit(main())
