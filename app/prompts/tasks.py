from celery import shared_task
from celery.app.task import Task
from django.conf import settings
from django.utils import timezone
from kombu.exceptions import OperationalError as BrokerUnavailable

from app.prompts import history, services
from app.prompts.models import TemplateRepository

BUSY_RETRY_SECONDS = 30
REFRESH_SECONDS = settings.PREFIXSCOPE_TEMPLATE_REFRESH_SECONDS


@shared_task(name="prompts.import_template_history", bind=True, max_retries=10)
def import_template_history(self: Task[[int], None], repository_id: int) -> None:
    """Import a repository's new commits; while another import of it runs, try again a little later
    (a push during an import may have come after the commits it reads)."""
    try:
        history.import_template_history(repository_id=repository_id, now=timezone.now())
    except history.ImportBusy as exc:
        raise self.retry(countdown=BUSY_RETRY_SECONDS) from exc


@shared_task(name="prompts.refresh_template_repositories")
def refresh_template_repositories() -> None:
    """Enqueue an import of every registered repository (kept current between webhooks)."""
    for repository_id in TemplateRepository.objects.values_list("pk", flat=True):
        queue_import(repository_id)


def queue_import(repository_id: int) -> bool:
    """Queue an import and show it queued; False when the broker is away (nothing queued)."""
    services.mark_import_queued(repository_id=repository_id)
    try:
        import_template_history.apply_async(args=(repository_id,), expires=REFRESH_SECONDS)
    except BrokerUnavailable:
        services.mark_import_queued(repository_id=repository_id, queued=False)
        return False
    return True
