import time

import httpx
from celery import shared_task
from django.utils import timezone

from app.fleet.models import Server
from app.fleet.services import claim_due_scrapes
from app.traffic.services.scrapes import record_scrape
from collectors.metrics.client import ScrapeFailed, fetch_metrics
from collectors.metrics.parse import MetricsParseError, parse_metrics

DISPATCH_EVERY_SECONDS = 5.0


@shared_task(name="fleet.dispatch_scrapes")
def dispatch_scrapes() -> None:
    """Send one pull per due server; a pull not started within its interval is dropped, not replayed."""
    for server in claim_due_scrapes(now=timezone.now()):
        scrape_server.apply_async(args=(server.pk,), expires=server.scrape_interval_seconds)


@shared_task(name="fleet.scrape_server")
def scrape_server(server_id: int) -> None:
    server = Server.objects.get(pk=server_id)
    scraped_at, started = timezone.now(), time.monotonic()
    try:
        with httpx.Client() as client:
            text = fetch_metrics(
                client, server.effective_metrics_url, timeout_seconds=server.scrape_interval_seconds / 2
            )
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
