"""`make run`'s console: every process's line in the log file, on the console only warnings, errors
(with their tracebacks) and the regressions opened and resolved."""

import io
from datetime import datetime

from honcho.printer import Message

from app.devconsole import ConsolePrinter, parse_header

AT = datetime(2026, 1, 1, 10, 0, 5)
# As the processes of `make run` print them (Django's text format, Celery's, gunicorn's, the simulator's).
OUTPUT = [
    ("web", "[2026-12-05 22:02:25 +0000] [8639] [INFO] Booting worker with pid: 8666", False),
    ("web", '127.0.0.1 - - [05/Dec/2026:22:02:46 +0000] "POST /v1/traces HTTP/1.1" 200 0 "-" "OTel"', False),
    (
        "worker",
        "[2026-12-05 22:02:41,123: INFO/MainProcess] Task traffic.dispatch_scrapes[da05] received",
        False,
    ),
    ("worker", " -------------- celery@vm v5.7.0 (collider)", False),
    ("collectors", "2026-12-05 22:02:35,155 INFO    app.traffic.collect: KV-event leases taken", False),
    ("fleet", "2026-12-05 22:02:45,258 ERROR opentelemetry.exporter: Failed to export spans batch", True),
    ("fleet", "Traceback (most recent call last):", True),
    ("fleet", '  File "x.py", line 1, in <module>', True),
    ("fleet", "ConnectionRefusedError: [Errno 111] Connection refused", True),
    ("fleet", '{"name": "sim-0", "base_url": "http://127.0.0.1:8601"}', False),
    ("fleet", "  indented, but after an INFO record", False),
    ("worker", "[2026-12-05 22:03:01,162: WARNING/ForkPoolWorker-2] scrape of sim-3 failed: refused", True),
    ("worker", "/venv/celery/platforms.py:893: SecurityWarning: You're running the worker as root", True),
    ("web", "[2026-12-05 22:02:25 +0000] [8639] [CRITICAL] WORKER TIMEOUT (pid:8666)", True),
    ("worker", '{"time": "x", "level": "ERROR", "logger": "app", "message": "json too"}', True),
]
OPENED = "regression opened: template support: 95% -> 29%, Template commit, suspect abc1234 (support: ...)"
RESOLVED = "regression resolved (reverted): template support: 95% -> 29%, Template commit"


def printed(lines: list[tuple[str, str]]) -> tuple[list[str], list[str]]:
    log, console = io.StringIO(), io.StringIO()
    printer = ConsolePrinter(log, console)
    printer.width = 10
    for name, line in lines:
        printer.write(Message(type="line", data=line + "\n", time=AT, name=name, colour=None))
    return log.getvalue().splitlines(), console.getvalue().splitlines()


def test_the_console_shows_warnings_errors_and_their_tracebacks_the_log_file_everything() -> None:
    log, console = printed([(name, line) for name, line, _ in OUTPUT])

    assert log == [f"10:00:05 {name:<10} | {line}" for name, line, _ in OUTPUT]
    assert console == [f"10:00:05 {name:<10} | {line}" for name, line, shown in OUTPUT if shown]


def test_a_regression_line_is_shown_as_its_message_whichever_process_logs_it() -> None:
    lines = [
        ("worker", f"[2026-12-05 22:09:57,250: INFO/ForkPoolWorker-1] {OPENED}"),
        ("worker", "[2026-12-05 22:09:58,000: INFO/ForkPoolWorker-1] regression detection took 0.2 s"),
        ("beat", f"2026-12-05 22:10:02,055 INFO    app.regressions.lifecycle: {RESOLVED}"),
    ]

    log, console = printed(lines)

    assert console == [f"10:00:05 {OPENED}", f"10:00:05 {RESOLVED}"]
    assert len(log) == 3


def test_a_line_without_a_log_header_has_none() -> None:
    assert parse_header("  6/6 commits") is None
    assert parse_header("2026-12-05 22:02:28,123 INFO simulator.server: up") == ("INFO", "up")


FIRING = "alert firing: RegressionOpen  owner=template/demo-templates  template=support  (page)"
NOTICE = "alert resolved: SaltRotated  owner=platform/platform  tenant=acme  (notice)"


def test_an_alert_line_of_the_watcher_is_shown_as_its_message() -> None:
    # As app/devprometheus.py's watcher logs them.
    lines = [
        ("alerts", f"2026-12-05 22:09:57,250 INFO    app.devprometheus: {FIRING}"),
        ("alerts", f"2026-12-05 22:10:12,250 INFO    app.devprometheus: {NOTICE}"),
    ]

    log, console = printed(lines)

    assert console == [f"10:00:05 {FIRING}", f"10:00:05 {NOTICE}"]
    assert log == [f"10:00:05 alerts     | {line}" for _, line in lines]


def test_prometheus_errors_reach_the_console_its_info_and_warnings_the_log_file_only() -> None:
    # Prometheus 2.42's logfmt; it logs its own SIGTERM as a warning, at every Ctrl-C.
    error = 'ts=2026-12-06T01:06:54.040Z caller=main.go:1190 level=error msg="Error loading config" err="x"'
    lines = [
        ("prometheus", 'ts=2026-12-06T01:06:54.040Z caller=main.go:1012 level=info msg="TSDB started"'),
        (
            "prometheus",
            'ts=2026-12-06T01:07:00.805Z caller=main.go:823 level=warn msg="Received SIGTERM, exiting"',
        ),
        ("prometheus", error),
    ]

    log, console = printed(lines)

    assert console == [f"10:00:05 prometheus | {error}"]
    assert len(log) == 3
