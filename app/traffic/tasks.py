import logging
import time
from datetime import datetime

import httpx
from celery import shared_task
from django.utils import timezone

from app.fleet.models import Server
from app.fleet.services import claim_due_scrapes, record_served_models
from app.traffic.services import partitions, requests
from app.traffic.services.scrapes import record_scrape
from collectors.metrics.client import ScrapeFailed, fetch_metrics
from collectors.metrics.parse import MetricsParseError, parse_metrics
from collectors.models.client import fetch_models
from collectors.models.parse import ModelsParseError, parse_models

logger = logging.getLogger(__name__)


@shared_task(name="traffic.maintain_partitions")
def maintain_partitions() -> None:
    partitions.maintain_partitions(now=timezone.now())


@shared_task(name="traffic.expire_token_ids")
def expire_token_ids() -> None:
    requests.expire_token_ids(now=timezone.now())


DISPATCH_EVERY_SECONDS = 5.0


@shared_task(name="traffic.dispatch_scrapes")
def dispatch_scrapes() -> None:
    """Send one pull per due server; a pull not started within its interval is dropped, not replayed."""
    for server in claim_due_scrapes(now=timezone.now()):
        scrape_server.apply_async(args=(server.pk,), expires=server.scrape_interval_seconds)


@shared_task(name="traffic.scrape_server")
def scrape_server(server_id: int) -> None:
    """Pull /metrics, then (when it answered) /v1/models for the LoRA adapters the server serves."""
    server = Server.objects.get(pk=server_id)
    scraped_at, started = timezone.now(), time.monotonic()
    timeout = server.scrape_interval_seconds / 2
    with httpx.Client() as client:
        try:
            text = fetch_metrics(client, server.effective_metrics_url, timeout_seconds=timeout)
            samples, error = parse_metrics(text), ""
        except (ScrapeFailed, MetricsParseError) as exc:
            samples, error = None, str(exc)
        record_scrape(
            server=server,
            scraped_at=scraped_at,
            samples=samples,
            duration_seconds=time.monotonic() - started,
            error=error,
        )
        if samples is not None:
            _read_served_models(client, server, at=scraped_at, timeout_seconds=timeout)


def _read_served_models(
    client: httpx.Client, server: Server, *, at: datetime, timeout_seconds: float
) -> None:
    """Store the server's /v1/models as read with the pull begun ``at``; unread, the last read stays."""
    try:
        served = parse_models(fetch_models(client, server.models_url, timeout_seconds=timeout_seconds))
    except (ScrapeFailed, ModelsParseError) as exc:
        logger.warning("server %s: /v1/models not read, adapters kept as last read: %s", server.name, exc)
        return
    record_served_models(server=server, served=served, at=at)
