"""Versions named in traffic: resolved by short sha or tag, recorded before their import and merged
into the imported version after it, and the deploy marker of the first request naming each."""

import json
from datetime import UTC, datetime, timedelta

import pytest
from django.db import DatabaseError, connection
from django.test import Client
from django.utils import timezone as django_timezone

from app.fleet.models import Server
from app.prompts.history import import_template_history
from app.prompts.models import DeployMarker, TemplateRepository, TemplateVersion
from app.prompts.selectors import find_version
from app.prompts.services import SEEN_MESSAGE, merge_versions, register_repository, template_version_seen
from app.traffic.models import RequestRecord
from tests.prompts.conftest import GitRepo

pytestmark = pytest.mark.django_db

DAY = datetime(2026, 3, 1, 8, 0, tzinfo=UTC)


@pytest.fixture
def shas(repo: GitRepo) -> dict[str, str]:
    repo.write("templates/support.j2", "v1\n")
    one = repo.commit("First", when=DAY)
    repo.write("templates/support.j2", "v2\n")
    two = repo.commit("Second", when=DAY + timedelta(hours=1))
    repo.git("tag", "-a", "v2.0", "-m", "release 2.0")
    repo.write("README.md", "docs\n")
    docs = repo.commit("Docs only", when=DAY + timedelta(hours=2))
    repo.git("tag", "docs-release")
    return {"one": one, "two": two, "docs": docs}


@pytest.fixture
def repository(repo: GitRepo) -> TemplateRepository:
    return register_repository(location=str(repo.path), globs=["templates/*.j2"])


def run_import(repository: TemplateRepository) -> None:
    assert import_template_history(repository_id=repository.pk, now=django_timezone.now()).error == ""


def seen(version: str, at: datetime = DAY) -> TemplateVersion:
    _, found = template_version_seen(template="support", version=version, tenant="acme", seen_at=at)
    assert found is not None
    return found


def ingest(client: Client, token: str, version: str, request_id: str, at: datetime) -> None:
    record = {
        "server": "vllm-0", "request_id": request_id, "arrived_at": at.isoformat(),
        "template": "support", "template_version": version, "tenant": "acme",
    }  # fmt: skip
    response = client.post(
        "/api/v1/requests",
        json.dumps([record]),
        content_type="application/json",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200, response.content


def test_short_shas_and_tags_name_the_imported_version(
    shas: dict[str, str], repository: TemplateRepository
) -> None:
    run_import(repository)
    two = TemplateVersion.objects.get(commit_sha=shas["two"])
    assert seen(shas["two"][:7]) == two
    assert seen(shas["two"][:12].upper()) == two
    assert seen("v2.0") == two
    # A tag on a commit that did not touch the template names the version in effect then.
    assert seen("docs-release") == two
    assert TemplateVersion.objects.get(pk=two.pk).tags == ["docs-release", "v2.0"]
    assert TemplateVersion.objects.count() == 2


def test_an_ambiguous_or_unknown_name_names_nothing(
    shas: dict[str, str], repository: TemplateRepository
) -> None:
    run_import(repository)
    template = TemplateVersion.objects.get(commit_sha=shas["one"]).template
    assert find_version(template, "") is None
    assert find_version(template, "nope") is None
    assert find_version(template, shas["one"][:6]) is None  # under 7 hex digits: no short sha
    twin = TemplateVersion.objects.create(
        template=template, commit_sha=shas["one"][:7] + "f" * 33, committed_at=DAY, imported_at=DAY
    )
    assert find_version(template, shas["one"][:7]) is None  # two imported versions begin so
    assert find_version(template, twin.commit_sha) == twin


def test_the_first_request_naming_a_version_is_its_deploy_marker_once(
    shas: dict[str, str], repository: TemplateRepository
) -> None:
    run_import(repository)
    version = seen(shas["one"], at=DAY + timedelta(days=1))
    seen(shas["one"][:8], at=DAY + timedelta(days=2))
    markers = list(DeployMarker.objects.filter(template_version=version))
    assert [(m.deployed_at, m.source) for m in markers] == [(DAY + timedelta(days=1), "traffic")]
    version.refresh_from_db()
    assert version.first_seen_at == DAY + timedelta(days=1)


def test_a_full_sha_seen_before_its_import_gets_its_commit_when_imported(
    shas: dict[str, str], repository: TemplateRepository
) -> None:
    placeholder = seen(shas["two"], at=DAY + timedelta(days=3))
    assert (placeholder.message, placeholder.imported_at, placeholder.committed_at) == (
        SEEN_MESSAGE, None, DAY + timedelta(days=3)
    )  # fmt: skip
    run_import(repository)
    version = TemplateVersion.objects.get(commit_sha=shas["two"])
    assert version.pk == placeholder.pk
    assert (version.message, version.content, version.committed_at) == (
        "Second",
        "v2\n",
        DAY + timedelta(hours=1),
    )
    assert version.first_seen_at == DAY + timedelta(days=3)


@pytest.mark.parametrize("name", ["short", "tag"])
def test_a_short_sha_or_tag_seen_before_the_import_is_merged_into_the_imported_version(
    client: Client, token: str, shas: dict[str, str], repository: TemplateRepository, name: str
) -> None:
    Server.objects.create(name="vllm-0", base_url="http://127.0.0.1:18000", block_size=16)
    version = shas["two"][:9] if name == "short" else "v2.0"
    now = django_timezone.now().replace(microsecond=0)
    ingest(client, token, version, "req-1", now - timedelta(minutes=2))
    ingest(client, token, version, "req-2", now - timedelta(minutes=1))
    placeholder = TemplateVersion.objects.get(commit_sha=version)
    assert set(RequestRecord.objects.values_list("template_version_id", flat=True)) == {placeholder.pk}

    run_import(repository)

    imported = TemplateVersion.objects.get(commit_sha=shas["two"])
    assert not TemplateVersion.objects.filter(pk=placeholder.pk).exists()
    assert set(RequestRecord.objects.values_list("template_version_id", flat=True)) == {imported.pk}
    assert [(m.template_version_id, m.source) for m in DeployMarker.objects.all()] == [
        (imported.pk, "traffic")
    ]
    assert imported.first_seen_at == now - timedelta(minutes=2)
    ingest(client, token, version, "req-3", now)  # later traffic names the imported version at once
    assert RequestRecord.objects.get(request_id="req-3").template_version_id == imported.pk


def test_a_seen_commit_that_did_not_touch_the_template_becomes_its_version_then(
    shas: dict[str, str], repository: TemplateRepository
) -> None:
    placeholder = seen(shas["docs"][:10])
    run_import(repository)
    version = TemplateVersion.objects.get(commit_sha=shas["docs"])
    assert (version.content, version.diff, version.message) == ("v2\n", "", "Docs only")
    assert not TemplateVersion.objects.filter(pk=placeholder.pk).exists()


def test_two_merged_first_seen_markers_keep_the_earlier(
    shas: dict[str, str], repository: TemplateRepository
) -> None:
    seen(shas["one"], at=DAY + timedelta(days=5))
    seen(shas["one"][:7], at=DAY + timedelta(days=4))
    run_import(repository)
    version = TemplateVersion.objects.get(commit_sha=shas["one"])
    assert version.first_seen_at == DAY + timedelta(days=4)
    assert list(DeployMarker.objects.values_list("template_version_id", "deployed_at")) == [
        (version.pk, DAY + timedelta(days=4))
    ]


def test_a_merge_that_fails_part_way_leaves_both_versions_as_they_were() -> None:
    """merge_versions is one transaction: here PostgreSQL refuses its last step, the delete."""
    template, source = template_version_seen(template="support", version="abc1234", tenant="", seen_at=DAY)
    assert template is not None and source is not None
    into = TemplateVersion.objects.create(
        template=template, commit_sha="abc1234" + "0" * 33, committed_at=DAY
    )
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE 'refused'; END $$;"
            "CREATE TRIGGER refuse BEFORE DELETE ON prompts_templateversion"
            " FOR EACH ROW EXECUTE FUNCTION refuse()"
        )

    with pytest.raises(DatabaseError, match="refused"):
        merge_versions(source=source, into=into)
    assert DeployMarker.objects.get().template_version_id == source.pk  # not moved to `into`
    assert TemplateVersion.objects.get(pk=into.pk).first_seen_at is None
