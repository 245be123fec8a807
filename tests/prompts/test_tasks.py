"""The Celery tasks: an import writes its progress to the repository's row; the schedule queues all."""

from datetime import UTC, datetime, timedelta

import pytest
from django.conf import settings

from app.prompts import history
from app.prompts.models import TemplateRepository, TemplateVersion
from app.prompts.services import register_repository
from app.prompts.tasks import import_template_history, refresh_template_repositories
from tests.prompts.conftest import GitRepo

pytestmark = pytest.mark.django_db
DAY = datetime(2026, 3, 1, tzinfo=UTC)


@pytest.fixture
def repository(repo: GitRepo) -> TemplateRepository:
    for i in range(45):
        repo.write(f"templates/t{i % 3}.j2", f"version {i}\n")
        repo.commit(f"Version {i}", when=DAY + timedelta(minutes=i))
    return register_repository(location=str(repo.path), globs=["templates/*.j2"])


def test_the_import_task_writes_its_progress_as_it_goes(
    repository: TemplateRepository, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[tuple[str, int, int]] = []
    write_state = history._write_state

    def watched(row: TemplateRepository, **changes: object) -> None:
        write_state(row, **changes)
        stored = TemplateRepository.objects.get(pk=row.pk)
        seen.append((stored.state, stored.commits_imported, stored.commits_total))

    monkeypatch.setattr(history, "_write_state", watched)
    import_template_history(repository.pk)

    progress = list(
        dict.fromkeys((done, total) for state, done, total in seen if state == "running" and total)
    )
    assert progress == [(0, 45), (20, 45), (40, 45), (45, 45)]
    repository.refresh_from_db()
    assert (repository.state, repository.commits_imported, repository.commits_total) == ("idle", 45, 45)
    assert TemplateVersion.objects.count() == 45


def test_an_import_already_running_is_tried_again_later(repository: TemplateRepository) -> None:
    from celery.exceptions import Retry

    from tests.support.sessions import session

    with session() as other:
        other.execute("SELECT pg_advisory_lock(%s, %s)", [history.IMPORT_LOCK_SPACE, repository.pk])
        with pytest.raises(Retry):
            import_template_history(repository.pk)
    assert not TemplateVersion.objects.exists()


def test_the_schedule_imports_every_repository(repository: TemplateRepository, eager: None) -> None:
    assert settings.CELERY_BEAT_SCHEDULE["refresh-template-repositories"]["task"] == (
        "prompts.refresh_template_repositories"
    )
    refresh_template_repositories()
    repository.refresh_from_db()
    assert (repository.state, repository.commits_imported) == ("idle", 45)
