"""How long every page and API read takes over 10 million request records and 100 million KV events.

    .venv/bin/python -m bench pages [--records 10000000] [--kv-events 100000000] [--runs 20]
    .venv/bin/python -m bench pages --records 1000000 --kv-events 10000000   # a smaller fleet

Without DATABASE_URL it starts an embedded PostgreSQL in .data/bench-postgres (as app.devstack does),
kept between runs; with it, it uses that server. Either way the rows live in the database
bench_pages, kept after the run (its migrations applied by Django's test-database creation with
keepdb): a rerun with the same counts measures without loading again, and one stopped mid-load
resumes (bench/pages_load.py, its marker table). Other counts: --reload drops it and loads anew.

The load (bench/pages_load.py): binary COPY into the partitioned tables, their daily partitions made
by the product's service; request records over the last 7 days on 100 servers, 30 templates of 3
versions, 5 tenants; a diagnosis per record; KV events over the last 2 days (their retention). The
rollups are the product's: its services run over the loaded rows (request and loss minutes and
hours); the servers' own readings per minute are derived from the request rollups (no scrapes are
loaded), their evictions counted from the KV events by the product's service.

Each call goes through Django's whole stack in this process (test Client, logged in), PostgreSQL's
time included, as an admin and as a user of one tenant (app/core/tenancy.py): one untimed call,
then `runs` timed ones. Printed per call: p50, p95 and max in ms, p95 against the 300 ms target,
and the p95's ratio to the baseline's, GET /healthz in the same run. For a call whose p95 is over
300 ms, the EXPLAIN (ANALYZE, BUFFERS) of its slowest query.
"""

import argparse
import gc
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from unittest import mock

from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext, setup_test_environment

from app.compare.selectors import RecordKey
from app.compare.services import SideInput, create_comparison
from app.fleet.models import Server
from app.prompts.models import Template
from app.regressions.models import Regression
from app.traffic.models import RequestRecord
from bench import pages_load
from bench.harness import Page, print_figure, time_pages, verdict

TARGET_MS = 300.0


def prepare_database(database: str, reload: bool) -> None:
    """Point Django at `database`, created and migrated unless it exists (dropped first on reload)."""
    setup_test_environment()
    connection.settings_dict["TEST"]["NAME"] = database
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=not reload)


def counts_match(records: int, kv_events: int) -> bool:
    """Whether what bench_pages holds (or began to load) is of these counts."""
    for phase, total, chunk in (("records", records, pages_load.RECORD_CHUNK),
                                ("kv_events", kv_events, pages_load.KV_CHUNK)):  # fmt: skip
        found = pages_load.marker(phase)
        if found is not None and found[1] != -(-total // chunk):
            return False
    return True


def load(args: argparse.Namespace) -> pages_load.Fleet:
    fleet = pages_load.make_fleet(servers=args.servers, days=args.days)
    pages_load.ensure_partitions(fleet)
    started = time.perf_counter()
    rates = {
        "request records": pages_load.load_records(fleet, args.records),
        "diagnoses": pages_load.load_diagnoses(fleet, args.records),
        "KV events": pages_load.load_kv_events(fleet, args.kv_events),
    }
    rollup_seconds = pages_load.compute_rollups(fleet)
    if any(rate == rate for rate in [*rates.values(), rollup_seconds]):  # loaded now: fresh statistics
        with connection.cursor() as cursor:
            cursor.execute("VACUUM ANALYZE")
    for name, rate in rates.items():
        print(f"{name}: " + ("loaded before" if rate != rate else f"{rate:,.0f} rows/s (binary COPY)"))
    if rollup_seconds == rollup_seconds:
        print(f"rollups by the product's services: {rollup_seconds:,.0f} s")
    print(f"load: {time.perf_counter() - started:,.0f} s; rows as of {fleet.anchor:%Y-%m-%d %H:%M} UTC")
    return fleet


def extras(fleet: pages_load.Fleet) -> dict[str, str]:
    """What the calls name: a server, template, request, regression and comparison, all of acme
    (seen by both viewers)."""
    server = Server.objects.get(name="vllm-000")
    template = Template.objects.get(name="tpl-00")
    record = (
        RequestRecord.objects.filter(server=server, arrived_at__gte=fleet.anchor - timedelta(hours=2))
        .order_by("-arrived_at")
        .values_list("request_id", flat=True)[0]
    )
    regression = _regression(fleet, template)
    return {"server": server.name, "template": str(template.pk), "template_name": template.name,
            "request": record, "regression": str(regression.pk),
            "compare": _comparison(fleet, template)}  # fmt: skip


def _regression(fleet: pages_load.Fleet, template: Template) -> Regression:
    """The template's regression for acme at its last version: stored as the detector would store
    it (the detector itself is bench_regressions' subject)."""
    changed = fleet.anchor - timedelta(days=pages_load.VERSION_DAYS[-1])
    regression, _ = Regression.objects.get_or_create(
        scope=Regression.Scope.TEMPLATE_TENANT, template=template, tenant="acme", changed_at=changed,
        defaults={"detected_at": changed + timedelta(minutes=20), "updated_at": fleet.anchor,
                  "rate_before": 0.8,
                  "rate_after": 0.4, "rate_now": 0.4, "requests_before": 5000, "requests_after": 5000,
                  "confidence": 0.99},
    )  # fmt: skip
    return regression


def _comparison(fleet: pages_load.Fleet, template: Template) -> str:
    """A comparison of two recorded requests of the template that kept their token ids."""
    keys = list(
        RequestRecord.objects.filter(
            template=template, tenant="acme", token_ids__isnull=False,
            arrived_at__gte=fleet.anchor - timedelta(days=fleet.days),
        ).order_by("arrived_at").values_list("server_id", "request_id", "arrived_at")[:2]
    )  # fmt: skip
    if len(keys) < 2:
        return ""
    a, b = (RecordKey(*key) for key in keys)
    return create_comparison(a=SideInput(record=a), b=SideInput(record=b), now=fleet.anchor).comparison.slug


def calls(client: Client, names: dict[str, str], week: int, day: int) -> dict[str, str]:
    """Every page and API read, by name: URL."""
    server, template, tpl = names["server"], names["template"], names["template_name"]
    series = {"fleet": "", "server": f"&scope=server&id={server}",
              "template": f"&scope=template&id={template}",
              "tenant": "&scope=tenant&id=acme"}  # fmt: skip
    found = {
        "baseline: /healthz": "/healthz",
        "Fleet 1h": "/", "Fleet 24h": "/?window=24h", "Fleet 7d": "/?window=7d",
        "Requests explorer, first page (24h)": "/requests/",
        "Requests explorer, server + missed (7d)": f"/requests/?window=7d&server={server}&missed=on",
        "Requests explorer, template + cause (7d)": f"/requests/?window=7d&template={tpl}&cause=evicted",
        "Requests explorer, page 50 by cursor": _page_50(client, "/requests/", "/api/v1/requests"),
        "Request page": f"/requests/{server}/{names['request']}/",
        "Collection": "/collection/",
        "Regressions list": "/regressions/", "Regression page": f"/regressions/{names['regression']}/",
        "Tenants": "/tenants/",
        "Templates list 1h": "/templates/", "Templates list 7d": "/templates/?window=7d",
        "Template page 1h": f"/templates/{template}/",
        "Template page 7d": f"/templates/{template}/?window=7d",
        "Server page 1h": f"/servers/{server}/", "Server page 7d": f"/servers/{server}/?window=7d",
        "Prefix families": "/templates/families/",
        "Compare (two recorded requests)": f"/compare/{names['compare']}/" if names["compare"] else "",
        "Set-up: servers": "/setup/servers/",
        "API requests (24h)": "/api/v1/requests",
        "API requests, page 50 by cursor": _page_50(client, "", "/api/v1/requests"),
        "API requests, server + 7d": f"/api/v1/requests?window=7d&server={server}",
        **{f"API series {scope} 1h/60 s": f"/api/v1/series?metric=hit_rate&bucket=60{extra}"
           for scope, extra in series.items()},
        **{f"API series {scope} 7d/3600 s": f"/api/v1/series?metric=hit_rate&bucket=3600&since={week}{extra}"
           for scope, extra in series.items()},
        "API series fleet ttft_p99 7d": f"/api/v1/series?metric=ttft_p99&bucket=3600&since={week}",
        "API series fleet lost_tokens 24h": f"/api/v1/series?metric=lost_tokens&bucket=900&since={day}",
        "API miss-causes 1h": "/api/v1/miss-causes",
        "API miss-causes 7d": f"/api/v1/miss-causes?since={week}",
        "API miss-causes template 7d": f"/api/v1/miss-causes?scope=template&id={tpl}&since={week}",
        "API servers": "/api/v1/servers", "API templates": "/api/v1/templates",
        "API regressions": "/api/v1/regressions", "API killers": "/api/v1/killers",
        "API deploys": "/api/v1/deploys",
    }  # fmt: skip
    return {name: url for name, url in found.items() if url}


def _page_50(client: Client, page: str, api: str) -> str:
    """The URL of page 50 (of the page, or of the API when `page` is empty), by the API's `next`
    cursors: the explorer's page takes the API's cursor (both are the same keyset)."""
    reached = f"{api}?window=7d"
    for _ in range(49):
        following = client.get(reached).json()["next"]
        if following is None:
            return ""
        reached = following
    return reached.replace(api, page, 1) if page else reached


def explain_slowest(client: Client, url: str) -> str:
    """EXPLAIN (ANALYZE, BUFFERS) of the slowest query one call of `url` runs."""
    with CaptureQueriesContext(connection) as captured:
        client.get(url)
    if not captured.captured_queries:
        return "  (no query)"
    slowest = max(captured.captured_queries, key=lambda q: float(q["time"]))
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, BUFFERS) {slowest['sql']}")
        plan = "\n".join(f"    {row[0]}" for row in cursor.fetchall())
    return f"  slowest query {float(slowest['time']) * 1000:.0f} ms of {len(captured.captured_queries)}:\n" \
           f"    {slowest['sql'][:600]}\n{plan}"  # fmt: skip


def report(viewer: str, pages: list[Page], client: Client, explain: bool) -> None:
    """Each call's p95 against the target and its ratio to the baseline's p95 (GET /healthz)."""
    print(f"\n{viewer}: p95 of the runs in ms, its ratio to the baseline's; target p95 < {TARGET_MS:.0f} ms")
    for page in pages:
        t = page.timings
        note = f"p50 {t.p50:.1f}, max {t.worst:.1f}, {len(t.ms)} runs, {page.status}"
        print_figure(
            page.name, t.p95, "ms p95", pages[0].timings.p95, f"{verdict(t.p95 < TARGET_MS)}  {note}"
        )
    if explain:
        for page in pages:
            if page.timings.p95 >= TARGET_MS:
                print(f"\nEXPLAIN, {viewer}, {page.name} ({page.url}):\n{explain_slowest(client, page.url)}")


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--kv-events", type=int, default=100_000_000)
    parser.add_argument("--servers", type=int, default=100)
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--database", default="bench_pages", help="the database the fleet is kept in")
    parser.add_argument("--reload", action="store_true", help="drop the database and load it anew")
    parser.add_argument("--load-only", action="store_true")
    parser.add_argument("--only", default="", help="measure only the calls whose name contains this")
    parser.add_argument("--no-explain", action="store_true")
    args = parser.parse_args(argv)
    prepare_database(args.database, args.reload)
    if not counts_match(args.records, args.kv_events):
        sys.exit("bench_pages holds other counts: rerun with --reload (or the counts it holds)")
    fleet = load(args)
    if args.load_only:
        return
    names = extras(fleet)
    # As a web worker is measured: gunicorn.conf.py's post_worker_init freezes what is loaded by then,
    # and the garbage collector no longer walks it (here, a full collection added ~140 ms to one call in 15).
    gc.freeze()
    clock = as_of(fleet.anchor)
    print(f"\n{args.records:,} request records over {args.days} days, {args.kv_events:,} KV events, "
          f"{args.servers} servers; measured as of the load's end, {fleet.anchor:%Y-%m-%d %H:%M} UTC "
          f"(the product's clock; {(time.time() - fleet.anchor.timestamp()) / 3600:,.1f} h ago)")  # fmt: skip
    with mock.patch("django.utils.timezone.now", clock):
        for viewer, username in (("admin", "bench-admin"), ("tenant user (acme)", "bench-acme")):
            client = Client()
            client.force_login(User.objects.get(username=username))
            now = clock().timestamp()
            urls = calls(client, names, int(now - args.days * 86400), int(now - 86400))
            chosen = {
                name: url for name, url in urls.items() if name.startswith("baseline") or args.only in name
            }
            report(
                viewer, time_pages(client, chosen, args.runs, require_ok=False), client, not args.no_explain
            )


def as_of(anchor: datetime) -> Callable[[], datetime]:
    """The product's clock while measuring (django.utils.timezone.now, which every page and API read
    asks): a minute after the load's anchor, ticking from now. The rows end at the anchor, so a
    measurement hours or days after the load (a rerun) reads the same windows as one right after it,
    its last hour full, not empty."""
    started = time.monotonic()
    return lambda: anchor + timedelta(minutes=1, seconds=time.monotonic() - started)
