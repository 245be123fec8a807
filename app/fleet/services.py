"""The writers of the fleet: servers, what their /metrics says of them, and their state."""

import logging
from collections.abc import Iterable
from datetime import datetime
from math import lcm
from urllib.parse import urlsplit

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils.text import slugify

from app.fleet.models import Server, ServerAlias
from collectors.metrics.parse import CacheConfig
from collectors.models.parse import ServedModels

logger = logging.getLogger(__name__)

SCRAPED_STATES = (Server.State.ACTIVE, Server.State.DOWN)


def record_scrape_outcome(
    *, server: Server, at: datetime, ok: bool, config: CacheConfig | None = None, model: str | None = None
) -> None:
    """Note a pull: a failure marks the server down; a success marks it active with what it exposed.

    Block size, KV blocks and hash algorithm come from `vllm:cache_config_info`; values the page lacks
    are kept. The hit granularity it states and whether speculative decoding runs are as it says now.
    """
    changes: dict[str, object] = {"last_scraped_at": at}
    if not ok:
        changes["state"] = Server.State.DOWN
    else:
        changes["state"] = Server.State.ACTIVE
        if config is not None:
            changes.update(block_size=config.block_size or server.block_size, discovered_at=at)
            changes["num_gpu_blocks"] = config.num_gpu_blocks or server.num_gpu_blocks
            changes["hash_algo"] = config.hash_algo or server.hash_algo
            changes["stated_hit_block"] = stated_hit_block(config)
            changes["drops_last_block"] = config.speculative
        if model:
            changes["model"] = model
    if server.state != changes["state"]:
        logger.info("server %s is %s", server.name, changes["state"])
    Server.objects.filter(pk=server.pk).update(**changes)
    for field, value in changes.items():
        setattr(server, field, value)


def stated_hit_block(config: CacheConfig) -> int | None:
    """The hit granularity cache_config_info states: vLLM's alignment when it gives one, else the
    LCM of the attention and Mamba block sizes it names; None when it names neither (a plain model,
    an older vLLM)."""
    if config.hit_alignment:
        return config.hit_alignment
    sizes = [size for size in (config.attention_block_size, config.mamba_block_size) if size]
    return lcm(*sizes) if sizes else None


KVCacheGroups = dict[str, dict[str, str | int]]  # group index -> {"kind": ..., "block_size": ...}


def record_kv_cache_groups(*, server_id: int, groups: KVCacheGroups) -> None:
    """Store the KV-cache groups a server's events named, {group index: {kind, block_size}}: all of
    them, replacing what was stored."""
    if Server.objects.filter(pk=server_id).exclude(kv_cache_groups=groups).update(kv_cache_groups=groups):
        logger.info("server %s has KV-cache groups %s", server_id, groups)


def record_served_models(*, server: Server, served: ServedModels, at: datetime) -> None:
    """Store what the server's /v1/models lists: its base model names and LoRA adapters {name: path}.

    The list replaces the last one: an adapter unloaded since is gone, one re-pointed at another
    path has the new path (vLLM hashes the path, so its new blocks hash apart from the old ones).
    """
    adapters = dict(served.lora_adapters)
    if adapters != server.lora_adapters:
        logger.info("server %s serves LoRA adapters %s", server.name, sorted(adapters) or "none")
    changes = {"base_models": list(served.base_models), "lora_adapters": adapters, "models_read_at": at}
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

    What was discovered from its /metrics (block size, hash algorithm) is kept, and so is its group
    (a new one's is the default, platform).
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


class NameTaken(ValueError):
    """A server (a proposed one too) has that name already."""


def create_server(*, name: str, base_url: str, scrape_interval_seconds: int = 15, **endpoints: str) -> Server:
    """A new active server (its /metrics pulls begin); `endpoints`: the other fields update_server
    takes. NameTaken when a server of that name exists: a proposed one is accepted, not registered."""
    try:
        with transaction.atomic():
            server = Server.objects.create(
                name=name, base_url=base_url, scrape_interval_seconds=scrape_interval_seconds,
                state=Server.State.ACTIVE, **endpoints,
            )  # fmt: skip
    except IntegrityError:
        raise NameTaken(f"a server named {name} exists already") from None
    logger.info("registered server %s", name)
    return server


def update_server(
    *,
    server_id: int,
    base_url: str,
    metrics_url: str = "",
    kv_events_endpoint: str = "",
    kv_replay_endpoint: str = "",
    kv_topic: str = "",
    model: str = "",
    tenant: str = "",
    group: str = "platform",
    scrape_interval_seconds: int = 15,
) -> Server:
    """Change a registered server's endpoints, model, tenant, group or pull interval; its name stays (request
    records name their server by it) and so does its state. ServerStateError when it is gone or proposed
    (a proposed server is accepted or merged, not edited)."""
    with transaction.atomic():
        server = locked_server(server_id)
        if server.state == Server.State.PROPOSED:
            raise ServerStateError(f"{server.name} is proposed: accept it or merge it first")
        changes = {
            "base_url": base_url, "metrics_url": metrics_url, "kv_events_endpoint": kv_events_endpoint,
            "kv_replay_endpoint": kv_replay_endpoint, "kv_topic": kv_topic, "model": model,
            "tenant": tenant, "group": group, "scrape_interval_seconds": scrape_interval_seconds,
        }  # fmt: skip
        for field, value in changes.items():
            setattr(server, field, value)
        server.save(update_fields=list(changes))
    logger.info("updated server %s", server.name)
    return server


def set_server_enabled(*, server_id: int, enabled: bool) -> Server:
    """Disable a server (its pulls stop; its data stays) or enable it again (active: its pulls
    resume at once). ServerStateError when it is gone or proposed."""
    with transaction.atomic():
        server = locked_server(server_id)
        if server.state == Server.State.PROPOSED:
            raise ServerStateError(f"{server.name} is proposed: accept it or merge it first")
        server.state = Server.State.ACTIVE if enabled else Server.State.DISABLED
        server.next_scrape_at = None
        server.save(update_fields=["state", "next_scrape_at"])
    logger.info("server %s is %s", server.name, server.state)
    return server


class ServerStateError(ValueError):
    """The server is gone, or not in the state the change needs (a person changed it meanwhile)."""


class ServerGone(ServerStateError):
    """No server has that id: merged or deleted meanwhile (or never there)."""


def accept_server(*, server_id: int, base_url: str) -> Server:
    """Register a proposed server, which a person has confirmed is real: it becomes active at
    `base_url` and its /metrics pulls begin. ServerStateError when it is no longer proposed."""
    with transaction.atomic():
        server = locked_server(server_id)
        if server.state != Server.State.PROPOSED:
            raise ServerStateError(f"{server.name} is {server.get_state_display().lower()}, not proposed")
        server.base_url, server.state = base_url, Server.State.ACTIVE
        server.save(update_fields=["base_url", "state"])
    logger.info("accepted proposed server %s", server.name)
    return server


def locked_server(server_id: int) -> Server:
    """The server, locked FOR UPDATE until the transaction ends; ServerStateError when it is gone."""
    server = Server.objects.select_for_update().filter(pk=server_id).first()
    if server is None:
        raise ServerGone(f"no server {server_id}: merged or deleted meanwhile")
    return server


def servers_named(references: Iterable[str], *, propose_unknown: bool) -> dict[str, Server | None]:
    """The server each reference (a registered server's name, else its base URL) names.

    A name wins over a base URL; of several servers with one base URL, the first by name. A
    reference nobody registered names the server its proposed server was merged into (an alias),
    else is None, or with `propose_unknown` a server proposed under it (state PROPOSED: shown apart
    until a person accepts it or merges it into a registered one).
    """
    wanted = set(references)
    by_name: dict[str, Server] = {}
    by_url: dict[str, Server] = {}
    for server in Server.objects.filter(Q(name__in=wanted) | Q(base_url__in=wanted)).order_by("name"):
        by_name[server.name] = server
        by_url.setdefault(server.base_url, server)
    found: dict[str, Server | None] = {ref: by_name.get(ref) or by_url.get(ref) for ref in wanted}
    found |= _aliased([ref for ref, server in found.items() if server is None])
    if propose_unknown:
        found |= {ref: _propose(ref) for ref, server in found.items() if server is None}
    return found


def _aliased(references: list[str]) -> dict[str, Server]:
    """The registered server each reference's proposed server (by the name _propose gives it) was
    merged into, for the references whose was."""
    if not references:
        return {}
    names = {ref: _proposed_name(ref) for ref in references}
    aliases = ServerAlias.objects.filter(name__in=set(names.values())).select_related("server")
    into = {alias.name: alias.server for alias in aliases}
    return {ref: into[name] for ref, name in names.items() if name in into}


def alias_merged_server(*, name: str, into: Server) -> None:
    """Remember that the proposed server `name` was merged into `into`: references that proposed it
    name `into` from now on (servers_named)."""
    ServerAlias.objects.update_or_create(name=name, defaults={"server": into})
    logger.info("%s is an alias of server %s", name, into.name)


def _proposed_name(reference: str) -> str:
    is_url = "://" in reference
    return slugify(urlsplit(reference).netloc if is_url else reference)[:100] or "unnamed"


def _propose(reference: str) -> Server:
    is_url = "://" in reference
    name = _proposed_name(reference)
    server, created = Server.objects.get_or_create(
        name=name, defaults={"base_url": reference if is_url else "", "state": Server.State.PROPOSED}
    )
    if created:
        logger.info("proposed server %s, seen in ingested requests", name)
    return server
