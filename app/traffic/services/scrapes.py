"""The writer of /metrics pulls: samples as scraped, or the failure."""

from collections.abc import Sequence
from datetime import datetime

from django.db import transaction

from app.fleet.models import Server
from app.fleet.services import record_scrape_outcome
from app.traffic.models import MetricSeries, Scrape, ScrapeSample
from collectors.metrics.parse import Sample, cache_config, model_name


def record_scrape(
    *,
    server: Server,
    scraped_at: datetime,
    samples: Sequence[Sample] | None,
    duration_seconds: float,
    error: str = "",
) -> None:
    """Store one pull as scraped: every sample, or the failure (None samples) with its reason.

    A failed pull stores no values: the server shows as down, not as zeros. Storing the same
    pull twice (a redelivered task) writes it once.
    """
    ok = samples is not None
    with transaction.atomic():
        Scrape.objects.bulk_create(
            [Scrape(server=server, scraped_at=scraped_at, ok=ok, error=error[:2000],
                    duration_seconds=duration_seconds, sample_count=len(samples or ()))],
            ignore_conflicts=True,
        )  # fmt: skip
        if samples is not None:
            series = _series_ids(server, samples)
            ScrapeSample.objects.bulk_create(
                [
                    ScrapeSample(
                        server=server,
                        series_id=series[(s.name, s.labels)],
                        scraped_at=scraped_at,
                        value=s.value,
                    )
                    for s in samples
                ],
                ignore_conflicts=True,
            )
            record_scrape_outcome(
                server=server, at=scraped_at, ok=True, config=cache_config(samples), model=model_name(samples)
            )
        else:
            record_scrape_outcome(server=server, at=scraped_at, ok=False)


def _series_ids(
    server: Server, samples: Sequence[Sample]
) -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
    """Ids of the series of these samples, creating the ones this server has not exposed before."""

    def known() -> dict[tuple[str, tuple[tuple[str, str], ...]], int]:
        rows = MetricSeries.objects.filter(server=server).values_list("id", "name", "labels")
        return {(name, tuple(sorted(labels.items()))): pk for pk, name, labels in rows}

    ids = known()
    missing = {(s.name, s.labels): s.kind for s in samples if (s.name, s.labels) not in ids}
    if missing:
        MetricSeries.objects.bulk_create(
            [MetricSeries(server=server, name=name, labels=dict(labels), kind=kind)
             for (name, labels), kind in missing.items()],
            ignore_conflicts=True,
        )  # fmt: skip
        ids = known()
    return ids
