"""GET /api/v1/templates/traffic: each template's traffic over the last hours, as the template check
prices a change with it. Minute rollup rows are written here (and summed into the hour rollups as
the rollup task does), and every figure expected is worked out from them."""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from app.api.services import create_personal_token
from app.core.models import Membership
from app.diagnosis.cost import prefill_sums, prefill_sums_by_template
from app.domain.prefill import PrefillSums, prefill_tokens_per_second
from app.fleet.models import Server
from app.prompts.models import Template, TemplateRepository
from app.rollups.catalog import derived_from
from app.rollups.derived import resum
from app.traffic.models import HourRollup, MinuteRollup
from tests.support.factories import a_server
from tests.support.tokens import reader_bearer

pytestmark = pytest.mark.django_db
URL = "/api/v1/templates/traffic"
HOUR = timedelta(hours=1)
NO_PREFILL = PrefillSums()


def _until() -> datetime:
    return timezone.now().replace(second=0, microsecond=0)


@dataclass(frozen=True, slots=True)
class Row:
    """One minute rollup row: `ago` before the current minute, of `requests` requests of `prompt`
    prompt tokens each, `cached` of them cached (None: not reported), and prefill sums."""

    server: Server
    template: Template
    ago: timedelta
    requests: int
    prompt: int
    cached: int | None
    prefill: PrefillSums = NO_PREFILL


def _stored(*rows: Row) -> None:
    """The rows as minute rollups, and the hour rollups summed from them as the rollup task does."""
    until = _until()
    for row in rows:
        known = row.cached is not None
        MinuteRollup.objects.create(
            server=row.server, template=row.template, minute=until - row.ago, requests=row.requests,
            prompt_tokens=row.requests * row.prompt, cached_tokens=row.requests * (row.cached or 0),
            cache_known_prompt_tokens=row.requests * row.prompt if known else 0,
            prefill_count=row.prefill.count, prefill_uncached_sum=row.prefill.x,
            prefill_ttft_sum=row.prefill.y, prefill_uncached_squares=row.prefill.xx,
            prefill_cross_sum=row.prefill.xy,
        )  # fmt: skip
    with connection.cursor() as cursor:
        for rollup in derived_from(MinuteRollup):
            resum(rollup, cursor, since=until - 200 * HOUR, until=until + HOUR)


def _prefill(count: int, *, seconds_per_token: float) -> PrefillSums:
    """Sums of `count` requests, half with 0 uncached tokens, half with 1,000, TTFT 0.1 s plus their
    uncached tokens at `seconds_per_token`."""
    half, high = count // 2, 1000.0
    ttft = 0.1 + high * seconds_per_token
    return PrefillSums(
        count=2 * half, x=half * high, y=half * (0.1 + ttft), xx=half * high**2, xy=half * high * ttft
    )


@pytest.fixture
def fleet() -> Iterator[dict[str, Any]]:
    repository = TemplateRepository.objects.create(
        name="prompts", location="https://git.example/p.git", globs=["*.j2"]
    )
    support = Template.objects.create(name="support", repository=repository, path="support.j2")
    billing = Template.objects.create(name="billing", repository=repository, path="billing.j2")
    other = Template.objects.create(name="loose")
    a, b = a_server(block_size=16), a_server(block_size=32)
    yield {"repository": repository, "support": support, "billing": billing, "loose": other, "a": a, "b": b}


def _get(client: Client, headers: dict[str, str] | None = None, **params: Any) -> Any:
    response = client.get(URL, params, headers=headers if headers is not None else reader_bearer())
    assert response.status_code == 200, response.content
    return response.json()


def _by_name(answer: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["name"]: t for t in answer["templates"]}


def test_each_templates_figures_are_its_rollups_over_the_window(
    client: Client, fleet: dict[str, Any]
) -> None:
    support, a, b = fleet["support"], fleet["a"], fleet["b"]
    measured = _prefill(40, seconds_per_token=0.0002)
    _stored(
        Row(a, support, 3 * HOUR, requests=100, prompt=2000, cached=1500, prefill=measured),
        Row(b, support, 20 * HOUR, requests=30, prompt=1000, cached=None),
        Row(a, support, timedelta(minutes=10), requests=10, prompt=2000, cached=500),
        Row(a, support, 30 * HOUR, requests=999, prompt=1, cached=1),  # before the window
    )
    answer = _get(client)
    until = datetime.fromisoformat(answer["until"])
    assert datetime.fromisoformat(answer["since"]) == until - 24 * HOUR
    assert datetime.fromisoformat(answer["recent_since"]) == until - HOUR
    assert until.second == until.microsecond == 0 and until <= timezone.now()
    assert answer["gpu_hour_price"] == settings.PREFIXSCOPE_GPU_HOUR_PRICE
    found = _by_name(answer)
    assert found["support"] == {
        "name": "support", "repository": "prompts", "path": "support.j2",
        "requests": 140, "requests_per_hour": pytest.approx(140 / 20),  # live for the last 20 hours
        "prompt_tokens_per_request": pytest.approx((100 * 2000 + 30 * 1000 + 10 * 2000) / 140),
        "reused_tokens_per_request": pytest.approx(500.0), "reused_window": "hour",
        "block_size": 16,  # server a served 110 of the 140
        "prefill_tokens_per_second": pytest.approx(prefill_tokens_per_second(measured)),
        "prefill_rate_source": "measured",
    }  # fmt: skip
    assert found["support"]["prefill_tokens_per_second"] == pytest.approx(5000)
    # No request: listed, with zeros and the configured rate.
    assert found["billing"] == {
        "name": "billing", "repository": "prompts", "path": "billing.j2", "requests": 0,
        "requests_per_hour": 0.0, "prompt_tokens_per_request": 0.0, "reused_tokens_per_request": 0.0,
        "reused_window": "window", "block_size": None,
        "prefill_tokens_per_second": settings.PREFIXSCOPE_PREFILL_TOKENS_PER_SECOND,
        "prefill_rate_source": "configured",
    }  # fmt: skip
    assert [t["name"] for t in answer["templates"]] == ["billing", "loose", "support"]
    assert found["loose"]["repository"] is None


def test_reused_tokens_fall_back_to_the_window_when_its_last_hour_has_no_request(
    client: Client, fleet: dict[str, Any]
) -> None:
    support, billing, a, b = fleet["support"], fleet["billing"], fleet["a"], fleet["b"]
    _stored(
        Row(a, support, 5 * HOUR, requests=20, prompt=1000, cached=600),
        Row(b, support, 2 * HOUR, requests=60, prompt=3000, cached=2000),
        # billing: its last hour's requests reported no cached tokens, the window's did
        Row(a, billing, timedelta(minutes=5), requests=4, prompt=500, cached=None),
        Row(a, billing, 4 * HOUR, requests=10, prompt=500, cached=100),
    )
    answer = _get(client, hours=6)
    found = _by_name(answer)
    assert found["support"]["reused_window"] == "window"
    assert found["support"]["reused_tokens_per_request"] == pytest.approx((20 * 600 + 60 * 2000) / 80)
    # Live for the last 5 hours of the 6: its requests an hour count from its first request on.
    assert found["support"]["requests_per_hour"] == pytest.approx(80 / 5)
    assert found["support"]["block_size"] == 32
    assert found["support"]["prefill_rate_source"] == "configured"  # no prefill sums
    # Requests that did not report cached tokens reuse at the rate of those that did.
    assert found["billing"]["reused_window"] == "window"
    rate, per_request = (10 * 100) / (10 * 500), (14 * 500) / 14
    assert found["billing"]["reused_tokens_per_request"] == pytest.approx(rate * per_request)
    # A window of one hour: its last hour is the window.
    one = _get(client, hours=1)
    assert one["recent_since"] == one["since"]
    assert _by_name(one)["billing"]["requests"] == 4 and _by_name(one)["support"]["requests"] == 0


def test_the_prefill_rate_is_the_cost_models_over_the_window(fleet: dict[str, Any]) -> None:
    """Per template in one read, the sums prefill_sums reads for each template alone."""
    support, billing, a, b = fleet["support"], fleet["billing"], fleet["a"], fleet["b"]
    slow, fast = _prefill(20, seconds_per_token=0.001), _prefill(20, seconds_per_token=0.0005)
    _stored(
        Row(a, support, 3 * HOUR, 10, 100, 50, prefill=slow),
        Row(b, support, timedelta(minutes=3), 10, 100, 50, prefill=fast),
        Row(
            b,
            billing,
            7 * HOUR + timedelta(minutes=17),
            10,
            100,
            50,
            prefill=_prefill(40, seconds_per_token=0.002),
        ),
    )
    until = _until()
    since = until - 24 * HOUR + timedelta(minutes=1)  # not a whole hour: minutes, hours, minutes
    found = prefill_sums_by_template(since=since, until=until, template_ids=[support.pk, billing.pk])
    for template in (support, billing):
        assert found[template.pk] == prefill_sums(since=since, until=until, template_id=template.pk)
    assert found[support.pk].count == 40 and found[billing.pk].count == 40
    assert prefill_tokens_per_second(found[billing.pk]) == pytest.approx(500)


def test_the_names_and_the_repository_choose_the_templates(client: Client, fleet: dict[str, Any]) -> None:
    other = TemplateRepository.objects.create(
        name="other", location="https://git.example/o.git", globs=["*.j2"]
    )
    Template.objects.filter(pk=fleet["loose"].pk).update(repository=other)

    def names(**params: Any) -> list[str]:
        return [t["name"] for t in _get(client, **params)["templates"]]

    assert names(name=["support", str(fleet["billing"].pk), "nope"]) == ["billing", "support"]
    assert names(repository="prompts") == ["billing", "support"]
    assert names(repository="other") == ["loose"]
    assert names(repository="prompts", name=["loose", "support"]) == ["support"]
    missing = client.get(URL, {"repository": "nope"}, headers=reader_bearer())
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def _member(username: str, tenant: str) -> dict[str, str]:
    user = User.objects.create_user(username)
    Membership.objects.create(user=user, tenant=tenant)
    return {"Authorization": f"Bearer {create_personal_token(user=user, name='ci')[1]}"}


def test_a_tenant_sees_its_templates_and_its_traffic_only(client: Client, fleet: dict[str, Any]) -> None:
    support, billing, a, b = fleet["support"], fleet["billing"], fleet["a"], fleet["b"]
    Template.objects.filter(pk=support.pk).update(tenant="alpha")
    Template.objects.filter(pk=billing.pk).update(tenant="bravo")
    Server.objects.filter(pk=a.pk).update(tenant="alpha")
    shared = fleet["loose"]  # a shared template: alpha sees its rows on alpha's server only
    _stored(
        Row(a, support, 2 * HOUR, requests=10, prompt=100, cached=50),
        Row(b, support, 2 * HOUR, requests=5, prompt=100, cached=50),  # alpha's template: alpha's traffic
        Row(b, billing, 2 * HOUR, requests=7, prompt=100, cached=50),
        Row(a, shared, 2 * HOUR, requests=3, prompt=100, cached=50),
        Row(b, shared, 2 * HOUR, requests=11, prompt=100, cached=50),  # a shared server: not alpha's
        Row(a, shared, timedelta(minutes=9), requests=1, prompt=100, cached=20),
        Row(b, shared, timedelta(minutes=9), requests=2, prompt=100, cached=90),
    )
    alpha = _member("alpha-ci", "alpha")
    found = _by_name(_get(client, alpha))
    assert set(found) == {"support", "loose"}
    assert found["support"]["requests"] == 15 and found["loose"]["requests"] == 4
    assert found["loose"]["reused_tokens_per_request"] == pytest.approx(20.0)
    assert _by_name(_get(client, alpha, name=["billing"])) == {}
    theirs = TemplateRepository.objects.create(
        name="bravo-prompts", location="https://git.example/b.git", globs=[]
    )
    Template.objects.filter(pk=billing.pk).update(repository=theirs)
    refused = client.get(URL, {"repository": "bravo-prompts"}, headers=alpha)
    assert refused.status_code == 404 and b"billing" not in refused.content
    assert [t["name"] for t in _get(client, repository="bravo-prompts")["templates"]] == ["billing"]
    every = _by_name(_get(client))["loose"]  # an admin: every row
    assert every["requests"] == 17 and every["reused_tokens_per_request"] == pytest.approx((20 + 180) / 3)
    nobody = client.get(URL)
    assert nobody.status_code == 401 and nobody.json()["code"] == "unauthorized"


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"hours": 0}, "hours"),
        ({"hours": 169}, "hours"),
        ({"hours": "many"}, "hours"),
        ({"repository": ""}, "repository"),
    ],
)
def test_a_bad_parameter_is_a_400_in_the_error_shape(
    client: Client, fleet: dict[str, Any], params: dict[str, Any], field: str
) -> None:
    response = client.get(URL, params, headers=reader_bearer())
    assert response.status_code == 400
    assert response.json()["code"] == "invalid" and field in response.json()["fields"]


def test_a_nul_in_a_name_is_a_400(client: Client, fleet: dict[str, Any]) -> None:
    response = client.get(URL, {"name": "a\x00b"}, headers=reader_bearer())
    assert response.status_code == 400 and response.json()["code"]


def test_the_read_takes_as_many_queries_for_many_templates_as_for_one(
    client: Client, fleet: dict[str, Any]
) -> None:
    """Per window part, not per template: a repository of fifty templates is one CI call's read."""
    headers = reader_bearer()

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            _get(client, headers)
        return len(captured.captured_queries)

    _stored(Row(fleet["a"], fleet["support"], 2 * HOUR, requests=1, prompt=10, cached=5))
    queries()  # the token's first use is recorded once
    few = queries()
    for n in range(20):
        template = Template.objects.create(name=f"t{n}", repository=fleet["repository"], path=f"t{n}.j2")
        _stored(Row(fleet["b"], template, HOUR * (n % 5 + 1), requests=2, prompt=10, cached=5))
    assert queries() == few


def test_a_template_whose_minutes_are_gone_counts_from_its_first_hour(
    client: Client, fleet: dict[str, Any]
) -> None:
    """Where the minute rollups of its first hour are no longer kept, the hour's start stands for its
    first request."""
    until = _until()
    first_hour = (until - 5 * HOUR).replace(minute=0)
    HourRollup.objects.create(
        server=fleet["a"], template=fleet["support"], hour=first_hour, requests=60,
        prompt_tokens=60_000, cached_tokens=30_000, cache_known_prompt_tokens=60_000,
    )  # fmt: skip

    found = _by_name(_get(client, hours=24))

    assert found["support"]["requests_per_hour"] == pytest.approx(60 / ((until - first_hour) / HOUR))
