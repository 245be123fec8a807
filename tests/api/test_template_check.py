"""POST /api/v1/templates/check: the template check of a registered repository over HTTP, priced with
this server's own traffic (minute rollups written here, summed into hours as the rollup task does)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection
from django.test import Client
from django.utils import timezone

from app.prompts.history import import_template_history
from app.prompts.models import Template, TemplateRepository
from app.prompts.services import register_repository
from app.prompts.templatecheck.run import CannotCheck, CheckRequest, run_check
from app.rollups.catalog import derived_from
from app.rollups.derived import resum
from app.traffic.models import MinuteRollup
from simulator.scenario import load_scenario, resolve_scenario
from simulator.template_repo import Commit, create_repo
from tests.support.factories import a_server
from tests.support.tokens import reader_bearer

pytestmark = pytest.mark.django_db
URL = "/api/v1/templates/check"


@pytest.fixture
def demo(tmp_path: Path) -> list[Commit]:
    root = tmp_path / "demo-templates"
    commits = create_repo(root, load_scenario(resolve_scenario("demo")), datetime(2026, 12, 6, tzinfo=UTC))
    repository = register_repository(
        location=str(root), globs=["templates/*.j2"], branch="main", secret="", name="demo-templates"
    )
    import_template_history(repository_id=repository.pk, now=timezone.now())
    return commits


def demo_location() -> str:
    return TemplateRepository.objects.get(name="demo-templates").location


def fault(commits: list[Commit], template: str) -> tuple[str, str]:
    index = next(i for i, c in enumerate(commits) if c.template == template and c.time > 0)
    return commits[index - 1].sha, commits[index].sha


def post(client: Client, **body: Any) -> Any:
    return client.post(URL, body, content_type="application/json", headers=reader_bearer())


def test_a_fault_commit_is_priced_with_the_servers_own_traffic(client: Client, demo: list[Commit]) -> None:
    until = timezone.now().replace(second=0, microsecond=0)
    # 100 requests half an hour ago of 420 prompt tokens, 384 of them reused (support's 24 blocks).
    MinuteRollup.objects.create(
        server=a_server(block_size=16), template=Template.objects.get(name="support"),
        minute=until - timedelta(minutes=30), requests=100, prompt_tokens=42_000, cached_tokens=38_400,
        cache_known_prompt_tokens=42_000,
    )  # fmt: skip
    with connection.cursor() as cursor:
        for rollup in derived_from(MinuteRollup):
            resum(rollup, cursor, since=until - timedelta(hours=30), until=until + timedelta(hours=1))
    base, head = fault(demo, "support")

    response = post(client, repository="demo-templates", base=base, head=head, max_cost_per_hour=1000)

    assert response.status_code == 200, response.content
    report = response.json()
    [support] = [t for t in report["templates"] if t["name"] == "support"]
    assert (support["change"]["base_blocks"], support["change"]["head_blocks"]) == (24, 0)
    predicted = support["predicted"]
    # Every one of its 384 reused tokens a request is lost, at 100 requests in the half hour it has
    # been live (its first request's minute to now).
    assert predicted["requests_per_hour"] == pytest.approx(100 / 0.5)
    assert predicted["prefill_tokens_per_hour"] == pytest.approx(384 * 200)
    rate = settings.PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND
    assert predicted["gpu_seconds_per_hour"] == pytest.approx(384 * 200 / rate)
    assert predicted["cost_per_hour"] == pytest.approx(
        384 * 200 / rate / 3600 * settings.PREFIXSCOPE_GPU_HOUR_PRICE
    )
    # Under the threshold, the shrinking prefix is a warning: the price decides.
    assert [f["level"] for f in report["findings"] if f["rule"] == "prefix-shrinks"] == ["warning"]
    assert report["exit_status"] == 0 and report["pricing"].startswith("priced with the server's")
    # Over it, the price fails the check.
    over = post(client, repository="demo-templates", base=base, head=head, max_cost_per_hour=0.001).json()
    assert [f["rule"] for f in over["findings"] if f["level"] == "error"] == ["cost-over-threshold"]
    assert over["exit_status"] == 1


def test_a_template_without_traffic_is_not_priced_and_its_shrink_fails(
    client: Client, demo: list[Commit]
) -> None:
    base, head = fault(demo, "agent")

    report = post(client, repository="demo-templates", base=base, head=head).json()

    [agent] = [t for t in report["templates"] if t["name"] == "agent"]
    assert agent["predicted"] is None
    assert {f["rule"] for f in report["findings"]} == {"nondeterministic", "prefix-shrinks", "no-traffic"}
    assert report["exit_status"] == 1


def test_the_answer_can_be_sarif(client: Client, demo: list[Commit]) -> None:
    base, head = fault(demo, "support")

    log = post(client, repository="demo-templates", base=base, head=head, format="sarif").json()

    assert log["version"] == "2.1.0"
    results = {result["ruleId"]: result for result in log["runs"][0]["results"]}
    assert set(results) == {"prefix-shrinks", "no-traffic"}
    assert results["prefix-shrinks"]["level"] == "error"
    assert results["prefix-shrinks"]["locations"][0]["physicalLocation"] == {
        "artifactLocation": {"uri": "templates/support.j2"},
        "region": {"startLine": 1},
    }


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"repository": "demo-templates", "base": "no-such-branch", "head": "main"}, 400, "cannot_check"),
        ({"repository": "elsewhere", "base": "main", "head": "main"}, 404, "not_found"),
        ({"repository": "demo-templates", "base": "main"}, 400, ""),
    ],
)
def test_a_check_that_cannot_run_says_why(
    client: Client, demo: list[Commit], body: dict[str, str], status: int, code: str
) -> None:
    response = post(client, **body)

    assert response.status_code == status
    assert response.json()["code"] == code or not code


def test_a_check_needs_a_person(client: Client, demo: list[Commit]) -> None:
    response = client.post(URL, {"repository": "demo-templates", "base": "main", "head": "main"},
                           content_type="application/json")  # fmt: skip
    assert response.status_code == 401


@pytest.mark.django_db(transaction=True)
def test_the_command_prices_with_a_servers_traffic_over_http(live_server: Any, demo: list[Commit]) -> None:
    """manage.py check_templates --server: the traffic comes over GET /api/v1/templates/traffic with a
    personal token, as a template repository's CI would ask a Prefixscope server."""
    until = timezone.now().replace(second=0, microsecond=0)
    MinuteRollup.objects.create(
        server=a_server(block_size=16), template=Template.objects.get(name="support"),
        minute=until - timedelta(minutes=30), requests=100, prompt_tokens=42_000, cached_tokens=38_400,
        cache_known_prompt_tokens=42_000,
    )  # fmt: skip
    with connection.cursor() as cursor:
        for rollup in derived_from(MinuteRollup):
            resum(rollup, cursor, since=until - timedelta(hours=30), until=until + timedelta(hours=1))
    base, head = fault(demo, "support")
    token = reader_bearer()["Authorization"].removeprefix("Bearer ")
    request = CheckRequest(demo_location(), base, head, timezone.now(), server=live_server.url, token=token)

    report = run_check(request, cache=Path(settings.PREFIXSCOPE_TEMPLATE_CACHE_DIR))

    [support] = [r for r in report.results if r.name == "support"]
    assert support.predicted is not None and report.pricing.startswith("priced with the last 24 h"), (
        report.pricing,
        support.traffic,
        [f.message for f in support.findings],
    )
    assert support.predicted.tokens_per_hour == pytest.approx(384 * 200)


def test_an_unreachable_server_leaves_the_check_unpriced_or_stops_it(demo: list[Commit]) -> None:
    base, head = fault(demo, "support")
    nowhere = "http://127.0.0.1:9"  # the discard port: nothing listens
    request = CheckRequest(demo_location(), base, head, timezone.now(), server=nowhere)

    report = run_check(request, cache=Path(settings.PREFIXSCOPE_TEMPLATE_CACHE_DIR))
    assert report.pricing.startswith("not priced (http://127.0.0.1:9/api/v1/templates/traffic: Connect")
    with pytest.raises(CannotCheck, match="the server did not answer"):
        run_check(replace(request, require_server=True), cache=Path(settings.PREFIXSCOPE_TEMPLATE_CACHE_DIR))
