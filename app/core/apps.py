from django.apps import AppConfig


class CoreConfig(AppConfig):
    name = "app.core"
    label = "core"

    def ready(self) -> None:
        # Bind @shared_task to the configured Celery app in every Django process,
        # so that web requests can enqueue tasks (see app/celery.py).
        from app import celery  # noqa: F401
