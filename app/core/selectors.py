"""Readiness checks: can this process reach what it needs?"""

import logging

from django.db import DatabaseError, connection
from kombu.exceptions import OperationalError

logger = logging.getLogger(__name__)


def database_problem() -> str | None:
    """None when PostgreSQL answers a query, else what went wrong."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        logger.warning("database unreachable: %s", exc)
        return f"database: {exc.__class__.__name__}"
    return None


def broker_problem(timeout_seconds: int = 2) -> str | None:
    """None when the Celery broker accepts a connection, else what went wrong."""
    from app.celery import celery_app

    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=timeout_seconds)
    except (OperationalError, OSError) as exc:
        logger.warning("broker unreachable: %s", exc)
        return f"broker: {exc.__class__.__name__}"
    return None
