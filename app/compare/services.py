"""The writers of comparisons: made from two sides (recorded requests or prompts), and expired.

Pasted prompts' token ids are prompt text: a comparison that holds them is saved only while the
token retention setting allows keeping them (not in hash-only mode), and they are cleared when
that retention passes. Recorded requests are saved by their keys: their tokens stay theirs.
"""

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser, User
from django.db import transaction

from app.compare.models import Comparison, ComparisonSide
from app.compare.selectors import RecordKey, block_size_for, record_compatibility, request_record
from app.compare.tokenization import Prompt, Tokenized, tokenize_prompts
from app.core.retention import kept_token_ids_since
from app.domain.divergence import Compatibility
from app.fleet.models import Server
from app.traffic.models import RequestRecord

logger = logging.getLogger(__name__)

MAX_BLOCK_SIZE = 4096


class ComparisonError(ValueError):
    """The sides cannot be compared as given; the message says why, for the person who gave them."""


@dataclass(frozen=True, slots=True)
class SideInput:
    """One side as asked for: a recorded request, or a prompt (with its salt and LoRA adapter)."""

    record: RecordKey | None = None
    prompt: Prompt | None = None
    cache_salt: str | None = None  # hashed here, never stored
    lora_adapter: str | None = None

    def __post_init__(self) -> None:
        if (self.record is None) == (self.prompt is None):
            raise ComparisonError("a side is a recorded request or a prompt")


@dataclass(frozen=True, slots=True)
class Compared:
    """A comparison and its two sides; ``saved`` is False when the prompts' tokens may not be kept
    (no permalink: the sides hold the tokens in memory only)."""

    comparison: Comparison
    sides: tuple[ComparisonSide, ComparisonSide]
    saved: bool


def create_comparison(
    *,
    a: SideInput,
    b: SideInput,
    server: Server | None = None,
    model: str = "",
    block_size: int | None = None,
    created_by: AbstractBaseUser | AnonymousUser | None = None,
    now: datetime,
) -> Compared:
    """Make a comparison of a cached prompt ``a`` and a later prompt ``b`` and save it when allowed.

    Prompts are tokenized by ``server`` (else a server of ``model``, else the server of the other
    side's recorded request) or by the bundled tokenizer. The block size is ``block_size``, else
    b's server's, a's, the tokenizing server's, else 16. Raises ComparisonError for a request
    that is not recorded, a block size out of range, or a prompt that cannot be tokenized.
    """
    records = {name: _record(side.record) for name, side in (("a", a), ("b", b)) if side.record is not None}
    host = server or next((r.server for r in records.values()), None)
    prompts = {name: side.prompt for name, side in (("a", a), ("b", b)) if side.prompt is not None}
    tokenized = dict(
        zip(prompts, tokenize_prompts(list(prompts.values()), server=host, model=model), strict=True)
    )
    tokenizing = [t.server for t in tokenized.values()]
    size = block_size or block_size_for(
        *(records[n].server for n in ("b", "a") if n in records), host, *tokenizing
    )
    if not 0 < size <= MAX_BLOCK_SIZE:
        raise ComparisonError(f"the block size must be between 1 and {MAX_BLOCK_SIZE}")
    comparison = Comparison(slug=_new_slug(), block_size=size, created_at=now, created_by=_user(created_by))
    sides = tuple(
        _record_side(name, records[name]) if name in records
        else _prompt_side(name, side, tokenized[name], host, model)
        for name, side in (("a", a), ("b", b))
    )  # fmt: skip
    if prompts and kept_token_ids_since(now) is None:  # pasted prompts are kept only with their tokens
        return Compared(comparison, (sides[0], sides[1]), saved=False)
    with transaction.atomic():
        comparison.save()
        for side in sides:
            side.comparison = comparison
            side.save()
    return Compared(comparison, (sides[0], sides[1]), saved=True)


def _record(key: RecordKey) -> RequestRecord:
    record = request_record(key)
    if record is None:
        raise ComparisonError(f"no request {key.request_id!r} recorded at {key.arrived_at.isoformat()}")
    return record


def _record_side(name: str, record: RequestRecord) -> ComparisonSide:
    compatibility = record_compatibility(record)
    return ComparisonSide(
        side=name, source=ComparisonSide.Source.RECORD, server=record.server,
        request_id=record.request_id, arrived_at=record.arrived_at,
        tokenizer_used=f"recorded token ids (server {record.server.name})",
        compatibility=_as_json(compatibility),
    )  # fmt: skip


def _prompt_side(
    name: str, side: SideInput, tokenized: Tokenized, host: Server | None, model: str
) -> ComparisonSide:
    assert side.prompt is not None
    # The compatibility of a prompt sent to the server it was tokenized for (or the one chosen).
    server = tokenized.server or host
    compatibility = Compatibility(
        model=(server.model if server is not None and server.model else model),
        tokenizer=tokenized.tokenizer,
        lora_adapter=side.lora_adapter or None,
        tenant_salt=hashlib.sha256(side.cache_salt.encode()).hexdigest() if side.cache_salt else None,
        hash_algo=(server.hash_algo or None) if server is not None else None,
    )
    return ComparisonSide(
        side=name, source=side.prompt.source, server=tokenized.server,
        token_ids=tokenized.token_ids, token_strs=tokenized.token_strs,
        tokenizer_used=tokenized.tokenizer_used, tokenizer_warning=tokenized.warning,
        compatibility=_as_json(compatibility),
    )  # fmt: skip


def _as_json(compatibility: Compatibility) -> dict[str, str | None]:
    return {name: getattr(compatibility, name) for name in Compatibility.__dataclass_fields__}


SLUG_ALPHABET = "abcdefghijkmnpqrstuvwxyz23456789"  # no 0/o, 1/l: read aloud or typed
SLUG_LENGTH = 10  # 50 random bits


def _new_slug() -> str:
    while True:
        slug = "".join(secrets.choice(SLUG_ALPHABET) for _ in range(SLUG_LENGTH))
        if not Comparison.objects.filter(slug=slug).exists():
            return slug


def _user(user: AbstractBaseUser | AnonymousUser | None) -> User | None:
    return user if isinstance(user, User) and user.is_authenticated else None


def expire_token_ids(*, now: datetime) -> int:
    """Clear pasted prompts' token ids past PREFIXSCOPE_TOKEN_RETENTION_DAYS (all of them in
    hash-only mode); return how many sides were cleared. Their permalinks then say so."""
    sides = ComparisonSide.objects.filter(token_ids__isnull=False)
    if (cutoff := kept_token_ids_since(now)) is not None:
        sides = sides.filter(comparison__created_at__lt=cutoff)
    cleared = sides.update(token_ids=None, token_strs=None)
    if cleared:
        logger.info("cleared the token ids of %d pasted prompts past retention", cleared)
    return cleared
