"""The writers of the fleet: servers, what their /metrics says of them, and their state."""

import logging
from datetime import datetime

from django.db.models import Q

from app.fleet.models import Server
from collectors.metrics.parse import CacheConfig

logger = logging.getLogger(__name__)

SCRAPED_STATES = (Server.State.ACTIVE, Server.State.DOWN)


def record_scrape_outcome(
    *, server: Server, at: datetime, ok: bool, config: CacheConfig | None = None, model: str | None = None
) -> None:
    """Note a pull: a failure marks the server down; a success marks it active with what it exposed.

    Block size and hash algorithm come from `vllm:cache_config_info`; values the page lacks are kept.
    """
    changes: dict[str, object] = {"last_scraped_at": at}
    if not ok:
        changes["state"] = Server.State.DOWN
    else:
        changes["state"] = Server.State.ACTIVE
        if config is not None:
            changes.update(block_size=config.block_size or server.block_size, discovered_at=at)
            changes["hash_algo"] = config.hash_algo or server.hash_algo
        if model:
            changes["model"] = model
    if server.state != changes["state"]:
        logger.info("server %s is %s", server.name, changes["state"])
    Server.objects.filter(pk=server.pk).update(**changes)
    for field, value in changes.items():
        setattr(server, field, value)


def claim_due_scrapes(*, now: datetime) -> list[Server]:
    """Servers whose next pull is due, each claimed once: its next pull moves one interval on.

    Two dispatchers running at once never claim the same server for the same interval.
    """
    due = Server.objects.filter(state__in=SCRAPED_STATES).filter(
        Q(next_scrape_at__isnull=True) | Q(next_scrape_at__lte=now)
    )
    claimed = []
    for server in due:
        next_at = now + server.scrape_interval_timedelta
        if Server.objects.filter(pk=server.pk, next_scrape_at=server.next_scrape_at).update(
            next_scrape_at=next_at
        ):
            claimed.append(server)
    return claimed


def register_server(
    *,
    name: str,
    base_url: str,
    metrics_url: str = "",
    kv_events_endpoint: str = "",
    kv_replay_endpoint: str = "",
    kv_topic: str = "",
    model: str = "",
    tenant: str = "",
) -> Server:
    """Create the server, or update its endpoints when one of that name exists; it becomes active.

    What was discovered from its /metrics (block size, hash algorithm) is kept.
    """
    server, created = Server.objects.update_or_create(
        name=name,
        defaults={
            "base_url": base_url, "metrics_url": metrics_url, "kv_events_endpoint": kv_events_endpoint,
            "kv_replay_endpoint": kv_replay_endpoint, "kv_topic": kv_topic, "model": model,
            "tenant": tenant, "state": Server.State.ACTIVE,
        },
    )  # fmt: skip
    logger.info("%s server %s", "registered" if created else "updated", name)
    return server
