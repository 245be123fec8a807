"""Every template parameter of the API (path or query) takes the template's name or its id, and
answers the same for both."""

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from app.api.api import api
from app.prompts.models import DeployMarker, Template, TemplateVersion
from app.prompts.selectors import find_template
from app.traffic.models import LossMinute
from tests.support.factories import a_server, facts, ingested
from tests.support.tokens import reader_bearer

pytestmark = pytest.mark.django_db
SHA = "c" * 40
# {t}: the template, by name or id. The series and the miss causes take it as `id` of scope=template.
URLS = [
    "/api/v1/templates/{t}/versions",
    f"/api/v1/templates/{{t}}/versions/{SHA}",
    "/api/v1/templates/{t}/killers",
    "/api/v1/deploys?template={t}",
    "/api/v1/killers?template={t}",
    "/api/v1/requests?template={t}",
    "/api/v1/miss-causes?scope=template&id={t}",
    "/api/v1/series?metric=lost_tokens&scope=template&id={t}",
]


@pytest.fixture
def template() -> Template:
    now = timezone.now()
    server = a_server(name="vllm-0")
    template = Template.objects.create(name="support-bot")
    Template.objects.create(name="billing")
    version = TemplateVersion.objects.create(template=template, commit_sha=SHA, committed_at=now)
    DeployMarker.objects.create(template_version=version, deployed_at=now - timedelta(minutes=30))
    minute = now.replace(second=0, microsecond=0) - timedelta(minutes=5)
    LossMinute.objects.create(
        server=server, template=template, minute=minute, requests=2, diagnosed=2, evicted_tokens=48
    )
    sent = facts(
        server="vllm-0",
        arrived_at=now - timedelta(minutes=3),
        model="m",
        template="support-bot",
        template_version=SHA,
        prompt_tokens=40,
        cached_tokens=16,
    )
    ingested(sent, now=now)
    return template


def test_every_template_parameter_of_the_schema_is_covered() -> None:
    taking = {
        path
        for path, item in api.get_openapi_schema()["paths"].items()
        for operation in item.values()
        for parameter in operation.get("parameters", ())
        if parameter["name"] == "template" and (parameter["in"] == "path" or "get" in item)
    }
    covered = {url.split("?")[0].replace("{t}", "{template}").replace(SHA, "{name}") for url in URLS}
    assert taking <= covered


@pytest.mark.parametrize("url", URLS)
def test_a_template_by_name_or_by_id_is_the_same_answer(template: Template, url: str) -> None:
    bearer = reader_bearer()

    def answer(key: object) -> Any:
        response = Client().get(url.format(t=key), headers=bearer)
        assert response.status_code == 200, (key, response.content[:300])
        return response.json()

    assert answer("support-bot") == answer(template.pk)
    if "killers" not in url:  # (no template has any) the answer is the template's, not anyone's
        other = Client().get(url.format(t=Template.objects.get(name="billing").pk), headers=bearer)
        assert other.status_code == 404 or other.json() != answer(template.pk)


def test_a_name_wins_over_another_templates_id(template: Template) -> None:
    named_as_id = Template.objects.create(name=str(template.pk))
    assert find_template(str(template.pk)) == named_as_id
    assert find_template("support-bot") == template
    assert find_template("nope") is None and find_template("9" * 30) is None
