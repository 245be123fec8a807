"""The load generator's command line: create the template repository, which gains each of the
scenario's later commits when the scenario reaches it, and run the scenario against base URLs
(``simulator.sender.run``), round after round::

    python -m simulator.loadgen --scenario demo --repo /tmp/prompts \\
        --base-url http://127.0.0.1:8101 --base-url http://127.0.0.1:8102 ... --speed 10
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import os
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from simulator.run_summary import format_summary
from simulator.scenario import ScenarioError, load_scenario, resolve_scenario
from simulator.sender import Ingest, run
from simulator.template_repo import TemplateRepoError, push, stage_repo


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: create the template repository, run the scenario, print the summary.

    With `--rounds N` the scenario runs N times (0: until stopped), each round with its own
    repository under `--repo`/round-K and virtual time starting anew (a demo shows its regressions
    again every round), on the same seed: the same plan, so the prefix-aware router places each
    template and tenant where the round before did (with the next seed it placed them anew, a
    routing change at each round's start that the scenario does not hold, and Prefixscope paged on).
    Request ids carry `--run-id` (default: one made from the start time) and, after the first
    round, the round's number, so a demo restarted with the same seed sends ids no earlier run sent.
    Exit status 0 after the runs (failed requests are in the summaries), 1 when every request of
    a round failed, 2 for a bad scenario, arguments or repository folder.
    """
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not wait_for_servers(args.base_url, timeout_seconds=args.wait):
        print(f"error: the servers did not answer /health within {args.wait} s", file=sys.stderr)  # noqa: T201
        return 2
    if not wait_for_urls(args.wait_url, timeout_seconds=args.wait):
        print(f"error: {' '.join(args.wait_url)} did not answer within {args.wait} s", file=sys.stderr)  # noqa: T201
        return 2
    run_id = args.run_id or new_run_id()
    round_number = 0
    while args.rounds == 0 or round_number < max(args.rounds, 1):
        repo = Path(args.repo) if args.rounds == 1 else Path(args.repo) / f"round-{round_number}"
        round_id = f"{run_id}r{round_number}" if round_number else run_id
        status = _run_round(args, repo, seed=args.seed, run_id=round_id, later=round_number > 0)
        if status != 0:
            return status
        round_number += 1
    return 0


def wait_for_servers(base_urls: Sequence[str], *, timeout_seconds: float) -> bool:
    """True once every server answers GET /health, False when `timeout_seconds` pass first."""
    return wait_for_urls([url.rstrip("/") + "/health" for url in base_urls], timeout_seconds=timeout_seconds)


def wait_for_urls(urls: Sequence[str], *, timeout_seconds: float) -> bool:
    """True once every URL answers a GET with a success, False when `timeout_seconds` pass first."""
    deadline = time.monotonic() + timeout_seconds
    waiting = list(urls)
    while waiting and time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(waiting[0], timeout=2):
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


def _run_round(args: argparse.Namespace, repo: Path, *, seed: int, run_id: str, later: bool) -> int:
    try:
        scenario = load_scenario(resolve_scenario(args.scenario))
        start = datetime.now(UTC).replace(microsecond=0)
        # The author's copy, where every commit of the scenario is made at once; `repo` gets each
        # when the scenario reaches it, as a real repository gets its pushes.
        with tempfile.TemporaryDirectory(prefix="prefixscope-templates-") as staging:
            commits = stage_repo(repo, Path(staging), scenario, start)
            summary = asyncio.run(
                run(scenario, args.base_url, speed=args.speed, commits=commits, seed=seed,
                    concurrency=args.concurrency, start=start, run_id=run_id,
                    publish=functools.partial(push, Path(staging), repo), ingest=_ingest(args),
                    direct_urls=args.direct_url or None, later_round=later)
            )  # fmt: skip
    except (ScenarioError, TemplateRepoError, ValueError, OSError) as exc:
        notes = "".join(f" ({note})" for note in getattr(exc, "__notes__", []))
        print(f"error: {exc}{notes}", file=sys.stderr)  # noqa: T201
        return 2
    print(format_summary(summary), flush=True)  # noqa: T201
    return 1 if summary.requests and summary.errors == summary.requests else 0


INGEST_TOKEN_ENV = "PREFIXSCOPE_INGEST_TOKEN"


def _ingest(args: argparse.Namespace) -> Ingest | None:
    """Where the scenario's hosted-API usage goes: --report-to with the token in INGEST_TOKEN_ENV."""
    if not args.report_to:
        return None
    token = os.environ.get(INGEST_TOKEN_ENV, "")
    if not token:
        raise ValueError(f"--report-to needs an ingest token in {INGEST_TOKEN_ENV}")
    return Ingest(args.report_to, token)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m simulator.loadgen", description="Run a scenario against a fleet."
    )
    parser.add_argument("--scenario", required=True, help="a shipped scenario name (demo) or a YAML file")
    parser.add_argument(
        "--base-url", action="append", required=True, help="a server's base URL; once per server, in order"
    )
    parser.add_argument(
        "--direct-url",
        action="append",
        default=[],
        help="a server's own URL, past its gateway, once per server in order (default: its --base-url);"
        " where the clients that bypass the gateway (a side server's gateway_bypass_from) send",
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
    parser.add_argument(
        "--report-to",
        default="",
        help=f"Prefixscope's URL, where the scenario's hosted-API usage goes (token in {INGEST_TOKEN_ENV})",
    )
    parser.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the servers' /health")
    parser.add_argument(
        "--wait-url",
        action="append",
        default=[],
        help="a URL to wait for too (where the fleet's spans go, say)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
