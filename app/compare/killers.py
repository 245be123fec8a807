"""The search for cache killers in each template's recent traffic, and their samples' text.

Each run (task ``compare.find_killers``, every five minutes) takes every template with requests in the
last PREFIXSCOPE_KILLER_WINDOW_MINUTES, the most recent PREFIXSCOPE_KILLER_MAX_REQUESTS of them at most,
splits them by compatibility record (salt, model, and the block size and hash algorithm of their
server), and runs ``app.domain.killers.find_killers`` on each group in arrival order: token mode where
every request of the group still has its token ids (within token retention), hash-only mode otherwise.
The template's stored killers are then replaced with what was found (app/prompts/killers.py), so a
rerun replaces, never adds; a template without requests in the window has none left.

Text is decoded here to classify a killer (the servers' /detokenize, else the configured tokenizer),
and never stored: a killer keeps its sample requests' keys, and ``killer_samples`` decodes them again
for a viewer who may read prompts, while their token ids are kept.

This lives in compare rather than prompts: it reads request records and decodes with the servers'
tokenizers, which the prompts app, below traffic and compare, may not import.
"""

import logging
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import reduce
from operator import or_
from typing import Any

import numpy as np
from django.conf import settings
from django.db.models import Q, QuerySet

from app.compare.tokenization import Detokenizer
from app.core.retention import kept_token_ids_since
from app.core.tenancy import SEES_ALL, Viewer
from app.domain.killers import SUGGESTIONS, Killer, KillerClass, Prompt, find_killers, sample_texts
from app.domain.retention import keeps_token_ids
from app.fleet.models import Server
from app.prompts.killers import FoundKillers, SampleKey, killer_rows, replace_killers
from app.prompts.models import CacheKiller
from app.traffic.models import MinuteRollup, RequestRecord

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Record:
    key: SampleKey
    model: str
    salt_hash: str
    prompt: Prompt


@dataclass(frozen=True, slots=True)
class _Group:
    """The compatibility record of a group of requests: what makes their block hashes comparable."""

    salt_hash: str
    model: str
    block_size: int
    hash_algo: str


def find_all_killers(*, now: datetime) -> int:
    """Search every template with requests in the window, and clear the killers of those without;
    returns how many killers are stored."""
    since = now - timedelta(minutes=settings.PREFIXSCOPE_KILLER_WINDOW_MINUTES)
    # The per-minute rollups say which templates had requests, without a scan of the raw records.
    active = MinuteRollup.objects.filter(minute__gte=since, minute__lt=now, template__isnull=False)
    template_ids = set(active.values_list("template_id", flat=True).distinct())
    template_ids |= set(CacheKiller.objects.values_list("template_id", flat=True).distinct())
    stored = 0
    for template_id in sorted(template_ids):
        try:
            stored += find_template_killers(template_id=template_id, now=now)
        except Exception:  # one template's failure must not keep the others' killers from being found
            logger.exception("cache killers of template %s not searched", template_id)
    return stored


def find_template_killers(*, template_id: int, now: datetime) -> int:
    """Search one template's requests of the window ending at ``now`` and replace its killers; returns
    how many are stored."""
    since = now - timedelta(minutes=settings.PREFIXSCOPE_KILLER_WINDOW_MINUTES)
    servers = {server.pk: server for server in Server.objects.all()}
    groups = _grouped(_window_records(template_id, since=since, until=now, now=now), servers)
    found = _classes_kept(
        template_id, [_search(group, records, servers) for group, records in groups.items()]
    )
    return replace_killers(template_id=template_id, found=found, window_start=since, window_end=now, now=now)


def _classes_kept(template_id: int, found: list[FoundKillers]) -> list[FoundKillers]:
    """The killers found, each with the class of the template's stored killer (the last search's) in
    the same block of the same compatibility record whose samples are of the same template version:
    what varies at one place of one version's text does not change from one search to the next,
    where the few requests a search decodes (others as the window moves, fewer as traffic leaves it,
    other versions' among them) may tell it otherwise."""
    stored = list(CacheKiller.objects.filter(template_id=template_id))
    keys = {SampleKey.of(sample) for killer in stored for sample in killer.samples}
    keys |= {key for group in found for samples in group.samples for key in samples}
    if not stored or not keys:
        return found
    rows = _records(keys, SEES_ALL).values_list(
        "server_id", "request_id", "arrived_at", "template_version_id"
    )
    versions = {SampleKey(server, request, at): version for server, request, at, version in rows}
    classes = {
        (k.salt_hash, k.model, k.block_size, k.mode, k.block_index, _version_of(k.samples, versions)): k.kind
        for k in stored
    }
    return [
        replace(group, killers=tuple(
            _with_class(killer, classes.get(
                (group.salt_hash, group.model, group.block_size, group.mode, killer.position_block,
                 _version_of([key.stored() for key in samples], versions))
            ))
            for killer, samples in zip(group.killers, group.samples, strict=True)
        ))
        for group in found
    ]  # fmt: skip


def _version_of(samples: Sequence[dict[str, Any]], versions: Mapping[SampleKey, int | None]) -> int | None:
    """The template version most of a killer's sample requests are of (None: none known)."""
    counted = Counter(versions.get(SampleKey.of(sample)) for sample in samples)
    return counted.most_common(1)[0][0] if counted else None


def _with_class(killer: Killer, kind: str | None) -> Killer:
    if kind is None or kind == killer.klass.value:
        return killer
    klass = KillerClass(kind)
    return replace(killer, klass=klass, suggestion=SUGGESTIONS[klass])


def killers_between(
    *,
    template_id: int,
    since: datetime,
    until: datetime,
    now: datetime,
    server_id: int | None = None,
    tenant: str | None = None,
) -> list[CacheKiller]:
    """The killers of the template's requests that arrived in [since, until) (on one server, of one
    tenant, when given), costliest first, as rows not saved: a regression's own, found in its
    requests since its change alone, and their samples among them. The template's stored killers
    are left as they are."""
    servers = {server.pk: server for server in Server.objects.all()}
    records = _window_records(
        template_id, since=since, until=until, now=now, server_id=server_id, tenant=tenant
    )
    found = [_search(group, kept, servers) for group, kept in _grouped(records, servers).items()]
    rows = killer_rows(template_id=template_id, found=found, window_start=since, window_end=until, now=now)
    return sorted(rows, key=lambda row: -row.tokens_lost)


def _window_records(
    template_id: int,
    *,
    since: datetime,
    until: datetime,
    now: datetime,
    server_id: int | None = None,
    tenant: str | None = None,
) -> list[_Record]:
    """The template's most recent records of the window (at most MAX_REQUESTS), in arrival order,
    with their token ids only where retention still keeps them."""
    scoped = RequestRecord.objects.filter(
        template_id=template_id, arrived_at__gte=since, arrived_at__lt=until
    )
    if server_id is not None:
        scoped = scoped.filter(server_id=server_id)
    if tenant is not None:
        scoped = scoped.filter(tenant=tenant)
    rows = (
        scoped.exclude(block_hashes=[])
        .order_by("-arrived_at", "-server_id", "-request_id")
        .values_list(
            "server_id",
            "request_id",
            "arrived_at",
            "tenant",
            "model",
            "salt_hash",
            "block_hashes",
            "token_ids",
        )
    )[: settings.PREFIXSCOPE_KILLER_MAX_REQUESTS]
    cutoff = kept_token_ids_since(now)
    return [
        _Record(
            SampleKey(server_id, request_id, arrived_at),
            model,
            salt_hash,
            Prompt(
                block_hashes=np.asarray(hashes, dtype=np.int64),
                token_ids=token_ids
                if token_ids is not None and keeps_token_ids(arrived_at, cutoff)
                else None,
                tenant=tenant or None,
            ),
        )
        for server_id, request_id, arrived_at, tenant, model, salt_hash, hashes, token_ids in reversed(rows)
    ]


def _grouped(records: list[_Record], servers: dict[int, Server]) -> dict[_Group, list[_Record]]:
    groups: dict[_Group, list[_Record]] = defaultdict(list)
    for record in records:
        server = servers[record.key.server_id]
        if server.block_size:  # else no block size read yet: its chains compare with no other's
            group = _Group(
                record.salt_hash, record.model or server.model, server.block_size, server.hash_algo
            )
            groups[group].append(record)
    return groups


def _search(group: _Group, records: list[_Record], servers: dict[int, Server]) -> FoundKillers:
    token_mode = all(r.prompt.token_ids is not None for r in records)
    prompts = [
        r.prompt if token_mode else Prompt(r.prompt.block_hashes, None, r.prompt.tenant) for r in records
    ]
    if token_mode:  # decoded to classify the killers; nothing decoded is kept
        with Detokenizer(server=servers[records[-1].key.server_id], model=group.model) as decode:
            killers = find_killers(prompts, group.block_size, decode=decode)
    else:
        killers = find_killers(prompts, group.block_size)
    return FoundKillers(
        salt_hash=group.salt_hash,
        model=group.model,
        block_size=group.block_size,
        mode=CacheKiller.Mode.TOKENS if token_mode else CacheKiller.Mode.HASHES,
        killers=killers,
        samples=tuple(tuple(records[i].key for i in killer.sample_requests) for killer in killers),
    )


@dataclass(frozen=True, slots=True)
class Samples:
    """A killer's samples of the varying text, and why there are none (``missing``) when there are none."""

    texts: tuple[str, ...]
    missing: str = ""


def killer_samples(
    killers: Sequence[CacheKiller], *, now: datetime, viewer: Viewer = SEES_ALL
) -> dict[int, Samples]:
    """The samples' text of each killer (by id), decoded from its sample requests' token ids where
    retention still keeps them. Prompt text: call it only for a viewer who may read prompts
    (app.prompts.killers.may_read_prompts), and never log what it gives."""
    return {
        killer.pk: samples
        for killer, samples in zip(killers, samples_in_order(killers, now=now, viewer=viewer), strict=True)
    }


def samples_in_order(
    killers: Sequence[CacheKiller], *, now: datetime, viewer: Viewer = SEES_ALL
) -> list[Samples]:
    """``killer_samples`` in the killers' order, for killers not stored (a regression's frozen copies).
    Only the text of sample requests the viewer sees."""
    keys = {SampleKey.of(stored) for killer in killers for stored in killer.samples}
    tokens = _token_ids(keys, now=now, viewer=viewer)
    servers = {server.pk: server for server in Server.objects.all()}
    return [_samples_of(killer, tokens, servers) for killer in killers]


def _samples_of(
    killer: CacheKiller, tokens: dict[SampleKey, list[int]], servers: dict[int, Server]
) -> Samples:
    if killer.position_token is None:
        return Samples((), "hash-only mode: block hashes alone hold no text")
    keys = [key for stored in killer.samples if (key := SampleKey.of(stored)) in tokens]
    if not keys:
        return Samples((), "the sample requests' token ids are no longer kept")
    with Detokenizer(server=servers.get(keys[0].server_id), model=killer.model) as decode:
        texts = sample_texts([tokens[key] for key in keys], killer.position_token, decode)
    return Samples(texts, "" if texts else "the sample requests end before the killer's token")


def _token_ids(keys: set[SampleKey], *, now: datetime, viewer: Viewer) -> dict[SampleKey, list[int]]:
    """The token ids of these records that retention still keeps, and the viewer sees."""
    if not keys:
        return {}
    rows = (
        _records(keys, viewer)
        .filter(token_ids__isnull=False)
        .values_list("server_id", "request_id", "arrived_at", "token_ids")
    )
    cutoff = kept_token_ids_since(now)
    return {
        SampleKey(server_id, request_id, arrived_at): ids
        for server_id, request_id, arrived_at, ids in rows
        if ids is not None and keeps_token_ids(arrived_at, cutoff)
    }


def _records(keys: set[SampleKey], viewer: Viewer) -> QuerySet[RequestRecord]:
    wanted = reduce(
        or_, (Q(server_id=k.server_id, request_id=k.request_id, arrived_at=k.arrived_at) for k in keys)
    )
    return viewer.traffic(RequestRecord.objects.all()).filter(wanted)


def visible_killers(
    killers: Sequence[CacheKiller], *, viewer: Viewer
) -> tuple[list[CacheKiller], set[SampleKey]]:
    """The killers a viewer sees, and which of their sample requests: a killer is found in the
    traffic of a salt, which several tenants share when they send none, so a tenant sees a killer
    when it sees one of its samples, and only those samples. Admins see all."""
    keys = {SampleKey.of(stored) for killer in killers for stored in killer.samples}
    if viewer.sees_all:
        return list(killers), keys
    seen = (
        {
            SampleKey(*row)
            for row in _records(keys, viewer).values_list("server_id", "request_id", "arrived_at")
        }
        if keys
        else set()
    )
    shown = [k for k in killers if any(SampleKey.of(stored) in seen for stored in k.samples)]
    return shown, seen
