"""What the benches share: a throw-away database, clocks of CPU and wall time, the page-timing
loop, and one way to print a figure beside its ratio to the baseline measured in the same run.

Imported after Django is set up (`python -m bench NAME` does it, bench/__main__.py).

CPU time is the figure where the machine is shared: another process's load stretches wall time,
not the CPU seconds this process (or a PostgreSQL backend) spends. Wall time is printed where it
is the point (a page's latency, a rate a client sees).
"""

import os
import statistics
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psutil
from django.db import connection
from django.test import Client
from django.test.utils import setup_test_environment
from django.utils import timezone

from app.traffic.services.partitions import maintain_partitions

_environment = {"set up": False}


@contextmanager
def throwaway_database(name: str | None = None, *, partitions: bool = True) -> Iterator[str]:
    """A migrated database, created (dropped first if it exists) on the server DATABASE_URL names and
    dropped when the block ends; Django's connection points at it meanwhile. Named `name`, or
    Django's test name; today's partitions made unless `partitions` is False. Yields its name."""
    if not _environment["set up"]:
        setup_test_environment()
        _environment["set up"] = True
    original = connection.settings_dict["NAME"]
    if name:
        connection.settings_dict["TEST"]["NAME"] = name
    database = connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    try:
        if partitions:
            maintain_partitions(now=timezone.now())
        yield database
    finally:
        connection.creation.destroy_test_db(original, verbosity=0)


def database_url_of(database: str) -> str:
    """DATABASE_URL with its database name replaced (for the processes a bench starts)."""
    parts = urlsplit(os.environ["DATABASE_URL"])
    return urlunsplit(parts._replace(path=f"/{database}"))


def process_cpu(pids: Sequence[int]) -> float:
    """CPU seconds (user + system) the live processes of `pids` have spent so far."""
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def backend_pid() -> int:
    """The pid of the PostgreSQL backend serving Django's connection in this process."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


def backend_cpu(pid: int) -> float | None:
    """CPU seconds of PostgreSQL backend `pid`; None when PostgreSQL runs on another machine (no such
    process here, or one that is not postgres)."""
    try:
        process = psutil.Process(pid)
        if "postgres" not in process.name():
            return None
        times = process.cpu_times()
    except psutil.NoSuchProcess:
        return None
    return times.user + times.system


def other_backends() -> list[int]:
    """The pids of the backends connected to this database other than this process's."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            " AND backend_type = 'client backend'"  # not autovacuum's: it serves no one
        )
        return [row[0] for row in cursor.fetchall()]


@contextmanager
def others_cpu() -> Iterator[Callable[[], float | None]]:
    """CPU seconds the other backends of this database (those serving the processes measured) spend
    in the block; call the yielded function after it. A backend that connected during the block
    counts whole; one that closed during it is lost (Django keeps its connections a minute)."""
    before = {pid: backend_cpu(pid) for pid in other_backends()}
    spent: list[float | None] = [None]
    yield lambda: spent[0]
    after = {pid: backend_cpu(pid) for pid in other_backends()}
    if any(cpu is None for cpu in after.values()):
        return
    spent[0] = sum(cpu - (before.get(pid) or 0.0) for pid, cpu in after.items() if cpu is not None)


def best_seconds(run: Callable[[], object], rounds: int) -> float:
    """The fastest of `rounds` runs: the least disturbed run is the one that measures the code."""
    timings = []
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        timings.append(time.perf_counter() - started)
    return min(timings)


@dataclass(frozen=True, slots=True)
class Timings:
    """Milliseconds of each timed call."""

    ms: list[float]

    @property
    def p50(self) -> float:
        return statistics.median(self.ms)

    @property
    def p95(self) -> float:
        return statistics.quantiles(self.ms, n=20, method="inclusive")[-1] if len(self.ms) > 1 else self.ms[0]

    @property
    def worst(self) -> float:
        return max(self.ms)


def timed_calls(call: Callable[[], object], runs: int) -> Timings:
    """`runs` calls, each timed in wall milliseconds."""
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - started))
    return Timings(times)


def median_ms(runs: int, call: Callable[[], object]) -> float:
    """The median wall milliseconds of `runs` calls."""
    return timed_calls(call, runs).p50


@dataclass(frozen=True, slots=True)
class Page:
    """One GET timed: its URL, the headers sent, what it answered."""

    name: str
    url: str
    status: int
    size: int  # bytes of the answer
    timings: Timings


def time_pages(
    client: Client,
    pages: Mapping[str, str | tuple[str, dict[str, str]]],
    runs: int,
    *,
    require_ok: bool = True,
) -> list[Page]:
    """Each page (by name: its URL, or its URL and headers) through Django's whole stack in this process
    (PostgreSQL's time included): one untimed call (it must answer 200 when `require_ok`), then `runs`
    timed ones."""
    found = []
    for name, page in pages.items():
        url, headers = (page, {}) if isinstance(page, str) else page
        answer = client.get(url, headers=headers)
        assert answer.status_code == 200 or not require_ok, (url, answer.status_code)
        timings = timed_calls(lambda u=url, h=headers: client.get(u, headers=h), runs)  # type: ignore[misc]
        found.append(Page(name, url, answer.status_code, len(answer.content), timings))
    return found


def print_figure(name: str, value: float, unit: str, baseline: float, note: str = "") -> None:
    """One figure, the one format of every bench: its name, its value in `unit`, its ratio to the
    baseline's value measured in the same run (in the same unit), and a note."""
    ratio = value / baseline if baseline else float("nan")
    print(f"{name:56} {value:12,.2f} {unit:<12} x{ratio:7.2f}  {note}".rstrip())


def print_baseline(name: str, value: float, unit: str, note: str = "") -> None:
    """The baseline's own line, in the format of `print_figure` (its ratio is 1)."""
    print_figure(f"{name} (baseline)", value, unit, value, note)


def verdict(ok: bool) -> str:
    """How a figure stands against its target."""
    return "PASS" if ok else "over"
