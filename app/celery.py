"""The Celery application. Workers start with `celery -A app.celery worker`."""

import os

from celery import Celery
from celery.signals import beat_init, worker_process_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")

celery_app = Celery("prefixscope")
celery_app.config_from_object("django.conf:settings", namespace="CELERY")
celery_app.autodiscover_tasks()


@worker_process_init.connect
def _trace_worker_process(**_: object) -> None:
    # After the prefork pool forks: exporters hold threads that do not survive a fork.
    from app.telemetry import configure_tracing

    configure_tracing("prefixscope-worker")


@beat_init.connect
def _trace_beat(**_: object) -> None:
    from app.telemetry import configure_tracing

    configure_tracing("prefixscope-beat")
