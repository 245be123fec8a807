"""The request records the ingest benches send, by kind (small, and prompts of real sizes), and the
rows of traffic_requestrecord they become.

A small record has counts and timings only. A prompt record also carries its prompt's token ids
(2,048 or 8,192, ids drawn from a 151,936-token vocabulary), so the ingest computes its block hashes
(64 or 256 at block size 32) and keeps its token ids. `row` gives the row the ingest stores for a
record, with those very hashes: the baseline copies exactly what the endpoint writes.
"""

import hashlib
import random
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from app.domain.blockhash import signed_block_hashes
from app.traffic.services.record_rows import RecordRow
from collectors.records import RequestFacts

BLOCK_SIZE = 32  # the bench servers' block size
VOCABULARY = 151_936  # Qwen2's: ids up to 2**17 and beyond, as CBOR and PostgreSQL see real ones


@dataclass(frozen=True, slots=True)
class Kind:
    """Records of one shape: how many token ids each carries, how many a round sends, in what batches."""

    name: str
    tokens: int  # prompt token ids per record; 0: none (no hashes either)
    records: int  # per round
    batch: int  # records per POST (REST bodies stay far below the 32 MiB limit)


KINDS = {
    "small": Kind("small records", 0, 20_000, 1_000),
    "2k": Kind("2K-token prompts", 2_048, 4_000, 250),
    "8k": Kind("8K-token prompts", 8_192, 1_000, 100),
}


@dataclass(frozen=True, slots=True)
class Record:
    """One request as a source reports it."""

    server: str
    request_id: str
    arrived_at: datetime
    token_ids: list[int] | None
    cache_salt: str | None

    def json(self) -> dict[str, object]:
        """As POST /api/v1/requests takes it."""
        body: dict[str, object] = {
            "server": self.server, "request_id": self.request_id, "arrived_at": self.arrived_at.isoformat(),
            "model": "tiny", "tenant": "acme", "client_ttft_seconds": 0.05, "prompt_tokens": 2048,
            "cached_tokens": 1536, "completion_tokens": 16,
        }  # fmt: skip
        if self.token_ids is not None:
            body["prompt_token_ids"] = self.token_ids
        if self.cache_salt is not None:
            body["cache_salt"] = self.cache_salt
        return body

    def facts(self) -> RequestFacts:
        """As the gateway's proxy hands it to its writer."""
        return RequestFacts(
            request_id=self.request_id, arrived_at=self.arrived_at, server=self.server, model="tiny",
            tenant="acme", client_ttft_seconds=0.05, prompt_tokens=2048, cached_tokens=1536,
            completion_tokens=16, cache_salt=self.cache_salt, prompt_token_ids=self.token_ids,
        )  # fmt: skip

    def row(self, server_id: int, *, source: str) -> RecordRow:
        """The row the ingest stores for this record (token ids kept, as by default)."""
        hashes, neutral = [], []
        if self.token_ids:
            hashes = signed_block_hashes(self.token_ids, BLOCK_SIZE, cache_salt=self.cache_salt)
            if self.cache_salt:
                neutral = signed_block_hashes(self.token_ids, BLOCK_SIZE)
        salt_hash = hashlib.sha256(self.cache_salt.encode()).hexdigest() if self.cache_salt else ""
        return RecordRow(
            server_id=server_id, request_id=self.request_id, arrived_at=self.arrived_at, trace_id="",
            model="tiny", tenant="acme", template_id=None, template_version_id=None, source=source,
            client_ttft_seconds=0.05, server_ttft_seconds=None, queue_seconds=None, prefill_seconds=None,
            prompt_tokens=2048, cached_tokens=1536, completion_tokens=16, salt_hash=salt_hash,
            block_hashes=hashes, neutral_hashes=neutral, token_ids=self.token_ids,
        )  # fmt: skip


def kinds_scaled(names: Sequence[str], scale: float) -> list[Kind]:
    """The kinds named, with `scale` times their records per round (whole batches, at least one)."""
    kinds = [KINDS[name] for name in names]
    return [replace(k, records=max(1, round(k.records * scale / k.batch)) * k.batch) for k in kinds]


def records(kind: Kind, servers: Sequence[str], now: datetime, *, seed: int = 0) -> list[Record]:
    """`kind.records` records of today, the servers taking turns by batch; every third prompt salted
    (a tenant's). Prompts are distinct runs of one random pool of ids, so a million of them share
    the pool's int objects: memory for the lists only."""
    rng = random.Random(seed)
    pool = [rng.randrange(VOCABULARY) for _ in range(kind.tokens * 64)] if kind.tokens else []
    found = []
    for n in range(kind.records):
        tokens = None
        if kind.tokens:
            start = rng.randrange(len(pool) - kind.tokens)
            tokens = pool[start : start + kind.tokens]
        salt = "tenant-a" if kind.tokens and n % 3 == 0 else None
        server = servers[n // kind.batch % len(servers)]
        found.append(Record(server, f"bench-{uuid.uuid4().hex}", now, tokens, salt))
    return found
