from celery import shared_task
from django.utils import timezone

from app.diagnosis import run, template_traffic

DIAGNOSIS_EVERY_SECONDS = 30.0


@shared_task(name="diagnosis.dispatch_diagnoses")
def dispatch_diagnoses() -> None:
    """One diagnosis task per compatibility group, so that the workers share the fleet; a task not
    started before the next dispatch is dropped (that one covers its records)."""
    for group in run.compatibility_groups():
        diagnose_group.apply_async(args=(list(group),), expires=DIAGNOSIS_EVERY_SECONDS)


@shared_task(name="diagnosis.diagnose_group")
def diagnose_group(group: list[object]) -> int:
    """Diagnose one group's records due; another worker's run of the same group makes this one a no-op."""
    return run.diagnose_requests(now=timezone.now(), group=tuple(group))


@shared_task(name="diagnosis.diagnose_requests")
def diagnose_requests() -> None:
    """The whole fleet in one run (the groups no other run holds)."""
    run.diagnose_requests(now=timezone.now())


@shared_task(name="diagnosis.price_version_checks")
def price_version_checks(version_ids: list[int]) -> int:
    """Price imported versions' checks with their templates' traffic (queued by the import, by name)."""
    return template_traffic.price_version_checks(version_ids=version_ids, now=timezone.now())
