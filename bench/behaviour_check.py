"""Behaviour on the demo scenario, written as deterministic text to compare two commits (issue 24).

Run from a checkout's root, on a fresh test database (the file runs alike on older trees: copy it):

    BEHAVIOUR_OUT=/tmp/after.txt .venv/bin/python -m app.devstack test bench/behaviour_check.py -q

(the quality gates, then this file alone on the test PostgreSQL; to skip the gates run pytest alone
in the environment `app.devstack.service_environment(prefix="test-")` gives), then `diff` the
outputs of two commits. BEHAVIOUR_OUT defaults to .data/behaviour.txt; the rows
behind the diagnoses' hash go to the same path + ".rows" and the pages' HTML and JSON to
+ ".pages/" (to find the first differing row or figure when the hashes differ).

The demo's 25 virtual minutes are stored and diagnosed as tests/dashboard/test_demo_walk_browser.py
makes them (the virtual fleet, /metrics pulled every 30 s, beat's rollups, diagnosis, regression
detection and the killer search each virtual minute), with the wall clock (django.utils.timezone.now)
frozen at NOW: where the run lands in the hour, which minutes search for killers and every date
shown are then the same on every run. The results are read only through what every tree shares: the
database's tables (raw SQL) and the pages and API answers (Django's test client, as an admin). Times
are given relative to the run's virtual second 0 ("+90s"), floats to 6 significant digits.
"""

import hashlib
import importlib
import json
import os
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.utils import timezone

pytestmark = pytest.mark.django_db(transaction=True)

NOW = datetime(2026, 3, 2, 10, 45, tzinfo=UTC)  # the frozen wall clock (a Monday, mid-hour)
SCRAPE_EVERY_SECONDS = 30  # as the demo walk pulls them
KILLERS_EVERY_MINUTES = 5  # beat's compare.find_killers
FUNNEL = ["prompt", "seen_before", "resident_anywhere", "resident_here", "reused"]
CAUSES = ["prompt_changed", "evicted", "routed_elsewhere", "salt", "restarted", "below_block", "cold"]
CAUSES += ["unexplained", "no_kv_events"]
ISO = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:?\d\d)?")


def first(*names: str) -> Any:
    """The first of `names` ("module:attribute") that imports: the same thing in the new tree's place
    or the old one's."""
    for name in names:
        module, _, attribute = name.partition(":")
        try:
            return getattr(importlib.import_module(module), attribute)
        except ImportError:
            continue
    raise ImportError(f"none of {names}")


class Report:
    """The lines written, with times relative to the run's start and floats rounded."""

    def __init__(self, start: datetime) -> None:
        self.start = start
        self.lines: list[str] = []
        self.learn_slugs()

    def learn_slugs(self) -> None:
        """Comparison slugs are random by design: each is named by its order of creation instead
        (called again after a page may have made one)."""
        slugs = [slug for (slug,) in rows("SELECT slug FROM compare_comparison ORDER BY id")]
        self.slugs = {slug: f"compare-{n}" for n, slug in enumerate(slugs, 1)}
        self.slug = re.compile("|".join(map(re.escape, slugs)) or "(?!)")

    def section(self, title: str) -> None:
        self.lines.append(f"\n== {title}")

    def add(self, *parts: object) -> None:
        self.lines.append(" ".join(self.text(p) for p in parts))

    def text(self, value: object) -> str:
        if isinstance(value, datetime):
            return f"{(value - self.start).total_seconds():+g}s"
        if isinstance(value, float):
            return f"{value:.6g}"
        if isinstance(value, str):
            value = self.slug.sub(lambda m: self.slugs[m.group(0)], value)
            return ISO.sub(lambda m: self.text(_parse_time(m.group(0))), value)
        if isinstance(value, dict | list):
            return json.dumps(self.plain(value), sort_keys=True, separators=(",", ":"))
        return str(value)

    def plain(self, value: Any) -> Any:
        """JSON with times relative and floats rounded, as text where needed to stay exact."""
        if isinstance(value, dict):
            return {k: self.plain(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.plain(v) for v in value]
        if isinstance(value, float | datetime | str):
            return self.text(value)
        return value


def _parse_time(text: str) -> datetime:
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def rows(sql: str, params: list[Any] | None = None) -> list[tuple[Any, ...]]:
    with connection.cursor() as cursor:
        cursor.execute(sql, params or [])
        return list(cursor.fetchall())


# ---- the run ----------------------------------------------------------------------------------------


def demo_definition() -> dict[str, Any]:
    resolve_scenario = first("simulator.scenario:resolve_scenario")
    with resolve_scenario("demo").open() as file:
        found: dict[str, Any] = yaml.safe_load(file)
    return found


def run_demo(tmp_path: Path) -> Any:
    """The demo walk's fleet: the run, a pull of every server at NOW and the rollups to NOW."""
    run_virtually = first(
        "tests.support.virtual_fleet:run_virtually", "tests.regressions.virtual_fleet:run_virtually"
    )
    record_scrapes = first(
        "tests.support.virtual_fleet:record_scrapes", "tests.regressions.virtual_fleet:record_scrapes"
    )
    find_all_killers = first("app.compare.killers:find_all_killers")
    detect_regressions = first("app.regressions.services:detect_regressions")

    def beat(now: datetime) -> None:
        if now.minute % KILLERS_EVERY_MINUTES == 0:
            find_all_killers(now=now)
        detect_regressions(now=now)

    run = run_virtually(demo_definition(), tmp_path, every_minute=beat, scrape_every=SCRAPE_EVERY_SECONDS)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE fleet_server SET scrape_interval_seconds = %s", [SCRAPE_EVERY_SECONDS])
    record_scrapes(run, at=NOW)
    refresh_rollups(NOW)
    return run


def refresh_rollups(now: datetime) -> None:
    lookback = first("app.rollups.tasks:ROLLUP_LOOKBACK", "app.traffic.tasks:ROLLUP_LOOKBACK")
    first(
        "app.rollups.refresh:refresh_minute_rollups", "app.traffic.services.rollups:refresh_minute_rollups"
    )(since=now - lookback, until=now)
    first(
        "app.rollups.servers:refresh_server_minutes",
        "app.traffic.services.server_rollups:refresh_server_minutes",
    )(since=now - lookback, until=now)


def describe_run(report: Report, run: Any) -> None:
    report.section("run")
    report.add("start", run.start.isoformat(), "= NOW", f"{(run.start - NOW).total_seconds():+g}s")
    report.add("planned requests", len(run.planned))
    for n, commit in enumerate(run.commits):
        report.add("commit", n, commit.template, f"t={commit.time:g}", commit.sha[:12])


# ---- the tables -------------------------------------------------------------------------------------


def diagnoses(report: Report, out: Path) -> None:
    """Counts per cause and reason, and a hash of every row (the rows themselves beside the output)."""
    report.section("diagnoses")
    report.add("request records", rows("SELECT count(*) FROM traffic_requestrecord")[0][0])
    for cause, count in rows("SELECT cause, count(*) FROM traffic_requestdiagnosis GROUP BY 1 ORDER BY 1"):
        report.add("cause", cause or "(none)", count)
    for reason, count in rows("SELECT unknown, count(*) FROM traffic_requestdiagnosis GROUP BY 1 ORDER BY 1"):
        report.add("unknown", reason or "(none)", count)
    columns = [f"d.{c}_tokens" for c in FUNNEL + CAUSES]
    found = rows(
        "SELECT s.name, d.request_id, d.arrived_at, d.cause, d.unknown, d.diverged_at, d.unexpected_hit,"
        f" d.tenant, t.name, {', '.join(columns)}, d.losses"
        " FROM traffic_requestdiagnosis d JOIN fleet_server s ON s.id = d.server_id"
        " LEFT JOIN prompts_template t ON t.id = d.template_id ORDER BY 1, 2, 3"
    )
    lines = [" ".join(report.text(v if not isinstance(v, str) or v else "-") for v in row) for row in found]
    out.with_name(out.name + ".rows").write_text("\n".join(lines) + "\n")
    report.add("rows", len(lines), "sha256", hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16])
    sums = rows(f"SELECT {', '.join(f'sum({c})' for c in columns)} FROM traffic_requestdiagnosis d")[0]
    for name, total in zip(FUNNEL + CAUSES, sums, strict=True):
        report.add("tokens", name, total)


def tables(report: Report) -> None:
    """Every product table's row count; the rollups' numeric columns summed (lost tokens by cause from
    the loss minutes and hours among them)."""
    report.section("tables")
    names = [
        name
        for (name,) in rows(
            "SELECT relname FROM pg_class WHERE relkind IN ('r', 'p') AND NOT relispartition"
            " AND relnamespace = 'public'::regnamespace ORDER BY relname"
        )
        if not name.startswith(("django_", "auth_", "psqlextra"))
    ]
    for name in names:
        report.add("rows", name, rows(f'SELECT count(*) FROM "{name}"')[0][0])
    for name in names:
        if re.search(r"(minute|hour|quarter|day|totals|salt)$", name):
            sums(report, name)


def sums(report: Report, table: str) -> None:
    numeric = [
        column
        for column, kind in rows(
            "SELECT column_name, data_type FROM information_schema.columns WHERE table_name = %s"
            " ORDER BY column_name",
            [table],
        )
        if kind in ("integer", "bigint", "smallint", "double precision", "real", "numeric")
        and column != "id"
        and not column.endswith("_id")
    ]
    if numeric:
        totals = rows(f'SELECT {", ".join(f"sum({c})" for c in numeric)} FROM "{table}"')[0]
        for column, total in zip(numeric, totals, strict=True):
            report.add("sum", table, column, _number(total))


def _number(total: Any) -> object:
    """An integral sum exactly; a fractional one as a float (6 significant digits in the report)."""
    if total is None or int(total) == total:
        return total if total is None else int(total)
    return float(total)


def regressions(report: Report) -> None:
    report.section("regressions")
    found = rows(
        "SELECT r.scope, coalesce(t.name, ''), coalesce(s.name, ''), r.tenant, r.metric, r.kind, r.expected,"
        " coalesce(v.commit_sha, ''), r.changed_at, r.detected_at, r.updated_at, r.resolved_at, r.resolution,"
        " r.state, r.rate_before, r.rate_after, r.rate_now, r.requests_before, r.requests_after,"
        " r.confidence, r.ttft_before_seconds, r.ttft_after_seconds, r.lost_tokens_per_hour,"
        " r.scope_lost_tokens_per_hour, r.gpu_seconds_per_hour, r.cost_per_hour, r.prefill_rate_source,"
        " r.cause_shift, r.candidates, r.evidence"
        " FROM regressions_regression r LEFT JOIN prompts_template t ON t.id = r.template_id"
        " LEFT JOIN fleet_server s ON s.id = r.server_id"
        " LEFT JOIN prompts_templateversion v ON v.id = r.suspect_version_id"
        " ORDER BY 1, 2, 3, 4, 5, 9"
    )
    report.add("count", len(found))
    for row in found:
        (scope, template, server, tenant, metric, kind, expected, sha, *times) = row[:12]
        report.add(scope, template or "-", server or "-", tenant or "-", metric, kind, f"expected={expected}")
        report.add("  suspect", sha[:12] or "-", "changed/detected/updated/resolved", *times)
        report.add("  resolution", row[12] or "-", "state", row[13])
        report.add("  figures", *row[14:27])
        cause_shift, candidates, evidence = (json.loads(v) if isinstance(v, str) else v for v in row[27:30])
        report.add("  cause_shift", cause_shift)
        report.add("  candidates", candidates)
        pair = (evidence or {}).get("pair") or {}
        report.add("  pair", [pair.get(side, {}).get("request_id") for side in ("before", "after")])


# ---- the pages and the API --------------------------------------------------------------------------

BLOCKS = {"p", "div", "section", "article", "header", "footer", "li", "tr", "h1", "h2", "h3", "h4", "h5"}
BLOCKS |= {"h6", "dt", "dd", "table", "thead", "tbody", "ul", "ol", "dl", "figure", "figcaption", "br"}
BLOCKS |= {"form", "fieldset", "legend", "caption", "details", "summary", "nav", "aside", "pre"}
SKIPPED = {"script", "style", "template", "svg", "noscript"}


class MainText(HTMLParser):
    """The text of a page's <main>, a line per block (table cells joined by " | "), and the data
    attributes of its charts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0  # inside <main> when > 0
        self.skipping = 0
        self.lines: list[str] = []
        self.current: list[str] = []
        self.charts: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "main":
            self.depth += 1
        if not self.depth:
            return
        if tag in SKIPPED:
            self.skipping += 1
        if tag in BLOCKS:
            self.flush()
        elif tag in ("td", "th") and self.current:
            self.current.append(" | ")
        data = {k: v or "" for k, v in attrs if k.startswith("data-") and k not in ("data-drawn",)}
        if tag in ("figure", "canvas") and data:
            self.charts.append(json.dumps(data, sort_keys=True))

    def handle_endtag(self, tag: str) -> None:
        if not self.depth:
            return
        if tag in SKIPPED and self.skipping:
            self.skipping -= 1
        if tag in BLOCKS or tag == "main":
            self.flush()
        if tag == "main":
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth and not self.skipping:
            self.current.append(data)

    def flush(self) -> None:
        line = re.sub(r"\s+", " ", "".join(self.current)).strip(" |")
        if line:
            self.lines.append(line)
        self.current = []


def pages(report: Report, client: Client, out: Path) -> None:
    """Each page's status and text, a line per block; each API answer flattened."""
    support = rows("SELECT id FROM prompts_template WHERE name = 'support'")[0][0]
    regression = rows(
        "SELECT r.id FROM regressions_regression r JOIN prompts_template t ON t.id = r.template_id"
        " WHERE r.scope = 'template' AND t.name = 'support' ORDER BY r.changed_at LIMIT 1"
    )
    saved = out.with_name(out.name + ".pages")
    saved.mkdir(exist_ok=True)
    paths = ["/", "/templates/", f"/templates/{support}/", "/servers/virtual-0/", "/regressions/"]
    paths += [f"/regressions/{r}/" for (r,) in regression] + ["/tenants/", "/collection/"]
    for path in paths:
        page(report, client, path, saved)
    for path in API:
        answer(report, client, path, saved)


API = [
    "/api/v1/cost",
    "/api/v1/cost?scope=template&id=support",
    "/api/v1/cost?scope=server&id=virtual-1",
    "/api/v1/miss-causes",
    "/api/v1/losses?by=template",
    "/api/v1/losses?by=server",
    "/api/v1/losses?by=tenant",
    "/api/v1/series?metric=hit_rate",
    "/api/v1/series?metric=lost_tokens&bucket=300",
    "/api/v1/series?metric=requests&scope=template&id=support",
    "/api/v1/series?metric=ttft_p90&scope=server&id=virtual-2",
    "/api/v1/routing",
    "/api/v1/tenants/audit",
    "/api/v1/regressions",
    "/api/v1/templates",
    "/api/v1/servers",
    "/api/v1/killers",
]


def _file_name(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_") or "fleet"


def page(report: Report, client: Client, path: str, saved: Path) -> None:
    response = client.get(path)
    report.learn_slugs()
    html = response.content.decode()
    (saved / f"{_file_name(path)}.html").write_text(html)
    report.section(f"page {path} {response.status_code}")
    parser = MainText()
    parser.feed(html)
    parser.close()
    for line in parser.lines:
        report.add(line)
    for chart in parser.charts:
        report.add("chart", chart)


def answer(report: Report, client: Client, path: str, saved: Path) -> None:
    response = client.get(path)
    report.learn_slugs()
    (saved / f"{_file_name(path)}.json").write_bytes(response.content)
    report.section(f"api {path} {response.status_code}")
    for key, value in flatten(response.json()):
        report.add(key, value)


def flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(path, value) of each leaf of a JSON answer."""
    if isinstance(value, dict):
        for key in sorted(value):
            yield from flatten(value[key], f"{prefix}.{key}" if prefix else key)
    elif isinstance(value, list) and value:
        for n, item in enumerate(value):
            yield from flatten(item, f"{prefix}[{n}]")
    else:
        yield prefix or ".", value


# ---- the check --------------------------------------------------------------------------------------


@pytest.fixture
def frozen_clock(monkeypatch: pytest.MonkeyPatch) -> Callable[[], datetime]:
    """timezone.now() answers NOW throughout (the virtual fleet itself passes its own times)."""
    monkeypatch.setattr(timezone, "now", lambda: NOW)
    return timezone.now


def test_behaviour_on_the_demo(tmp_path: Path, frozen_clock: Callable[[], datetime]) -> None:
    out = Path(os.environ.get("BEHAVIOUR_OUT", ".data/behaviour.txt")).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    run = run_demo(tmp_path)
    report = Report(run.start)
    describe_run(report, run)
    diagnoses(report, out)
    tables(report)
    regressions(report)
    admin = User.objects.create_superuser("admin", password=None)
    client = Client()
    client.force_login(admin)
    pages(report, client, out)
    out.write_text("\n".join(report.lines).lstrip("\n") + "\n")
    assert report.lines and frozen_clock() == NOW
