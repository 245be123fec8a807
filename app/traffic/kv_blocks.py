"""Each server's KV blocks as its cache_config_info pulls say them (vLLM's num_gpu_blocks label)."""

from datetime import datetime

from app.fleet.models import Server
from app.traffic.models import MetricSeries, ScrapeSample

CACHE_CONFIG = "vllm:cache_config_info"


def kv_blocks(server: Server, *, since: datetime, until: datetime, first: bool = False) -> int | None:
    """num_gpu_blocks of the server's last (`first`: first) cache_config_info pull in [since, until);
    None if none."""
    labels = _blocks_by_series(server)
    last = (
        _pulls(server, labels, since=since, until=until)
        .order_by("scraped_at" if first else "-scraped_at")
        .values_list("series_id", flat=True)
        .first()
    )  # fmt: skip
    return None if last is None else labels[last]


def kv_blocks_seen(server: Server, *, since: datetime, until: datetime) -> set[int]:
    """Every num_gpu_blocks the server's pulls in [since, until) said (one per restart that changed it)."""
    labels = _blocks_by_series(server)
    series = _pulls(server, labels, since=since, until=until).values_list("series_id", flat=True).distinct()
    return {labels[pk] for pk in series}


def _blocks_by_series(server: Server) -> dict[int, int]:
    found = {}
    for pk, labels in MetricSeries.objects.filter(server=server, name=CACHE_CONFIG).values_list(
        "pk", "labels"
    ):
        value = labels.get("num_gpu_blocks")
        if isinstance(value, str) and value.isdigit():
            found[pk] = int(value)
    return found


def _pulls(server: Server, labels: dict[int, int], *, since: datetime, until: datetime):  # type: ignore[no-untyped-def]
    return ScrapeSample.objects.filter(
        server=server, series_id__in=list(labels), scraped_at__gte=since, scraped_at__lt=until
    )
