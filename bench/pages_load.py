"""The fleet bench_pages measures: request records, their diagnoses and KV events COPYed into the
product's tables (daily partitions made by the product's own service), then the rollups computed
from them by the product's rollup services.

Every chunk of rows is drawn by numpy from a seed of its own (its number), so a load that stopped
resumes at the first chunk not recorded in `bench_pages_loaded`, the marker table, which each chunk's
COPY updates in its own transaction. A finished phase is skipped on a rerun.

The fleet: `servers` servers (four in five owned by one of five tenants, the rest shared), 30
templates (two in three owned) with three versions each, committed six, four and two days before
the load; one template's last version halves its hit rate (a regression to find). Records: 256 to
2,048 prompt tokens, blocks of 32, a template's prefix chain then a random tail; one tenant in
three salts its prompts; one record in a thousand keeps its token ids (a gateway capturing
prompts), its hashes then computed from them. Every record has a diagnosis, its cause drawn per
template. KV events: the last KV_DAYS days (their retention), stored and removed blocks in batches
of 16 per server, built as one binary COPY stream by numpy (fixed-width rows).
"""

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from django.contrib.auth.models import User
from django.db import connection, transaction
from psycopg.types.json import Jsonb

from app.core.models import Membership
from app.domain.blockhash import signed_block_hashes
from app.fleet.models import Server
from app.prompts.models import DeployMarker, Template, TemplateRepository, TemplateVersion
from app.rollups.catalog import rollup_of
from app.rollups.derived import resum
from app.rollups.refresh import refresh_loss_minutes, refresh_minute_rollups
from app.rollups.servers import refresh_server_minutes
from app.traffic.models import KVEvent, KVStream, RequestDiagnosis, RequestRecord, ServerHour
from app.traffic.services.copy_rows import write_rows
from app.traffic.services.partitions import create_day_partitions, day_of
from app.traffic.services.record_rows import TABLE_TYPES, RecordRow

TENANTS = ("acme", "globex", "initech", "umbrella", "hooli")
SALTED = frozenset({"globex"})  # a tenant that salts its prompts
TEMPLATES = 30
VERSION_DAYS = (6, 4, 2)  # days before the load each template's versions were committed
REGRESSED = 3  # the template whose last version halves its hit rate
BLOCK = 32
MAX_BLOCKS = 64
KV_DAYS = 2  # PREFIXSCOPE_KV_EVENT_RETENTION_DAYS' default
RECORD_CHUNK = 100_000
KV_CHUNK = 1_000_000
TOKEN_SHARE = 0.001  # records that keep their token ids
CAUSES = ("prompt_changed", "evicted", "routed_elsewhere", "cold", "unexplained")
CAUSE_WEIGHTS = (0.35, 0.3, 0.15, 0.15, 0.05)
_MARKER_SQL = """CREATE TABLE IF NOT EXISTS bench_pages_loaded (
    phase text PRIMARY KEY, done bigint NOT NULL, total bigint NOT NULL, anchor timestamptz NOT NULL,
    finished boolean NOT NULL DEFAULT false)"""
# The keys, indexes and foreign keys of a table being loaded, dropped until its last chunk is in.
_SET_ASIDE_SQL = """CREATE TABLE IF NOT EXISTS bench_pages_set_aside (
    name text PRIMARY KEY, tbl text NOT NULL, position int NOT NULL, restore text NOT NULL,
    drop text NOT NULL)"""
# A table's own (not its partitions') keys and foreign keys, then its other indexes, as the
# statements that make them again; foreign keys are dropped first and made last.
_DEFINITIONS_SQL = """
SELECT conname, CASE contype WHEN 'f' THEN 2 ELSE 0 END,
       format('ALTER TABLE %%I ADD CONSTRAINT %%I %%s', %(table)s, conname, pg_get_constraintdef(oid)),
       format('ALTER TABLE %%I DROP CONSTRAINT %%I', %(table)s, conname)
FROM pg_constraint WHERE conrelid = %(table)s::regclass AND contype IN ('p', 'u', 'f')
UNION ALL
SELECT i.indexrelid::regclass::text, 1, replace(pg_get_indexdef(i.indexrelid), ' ON ONLY ', ' ON '),
       format('DROP INDEX %%s', i.indexrelid::regclass)
FROM pg_index i WHERE i.indrelid = %(table)s::regclass
  AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid AND c.conrelid = i.indrelid)
"""


@dataclass(frozen=True, slots=True)
class Fleet:
    """What the rows refer to, by position: ids of servers, templates and versions."""

    anchor: datetime  # the load's "now": the records end there
    days: int
    server_ids: np.ndarray
    server_tenants: list[str]
    template_ids: np.ndarray
    template_tenants: list[str]
    version_ids: np.ndarray  # (templates, versions)
    version_times: np.ndarray  # seconds before the anchor each version was committed, oldest first


def marker(phase: str) -> tuple[int, int, datetime, bool] | None:
    with connection.cursor() as cursor:
        cursor.execute(_MARKER_SQL)
        cursor.execute(
            "SELECT done, total, anchor, finished FROM bench_pages_loaded WHERE phase = %s", [phase]
        )
        row = cursor.fetchone()
    return None if row is None else (int(row[0]), int(row[1]), row[2], bool(row[3]))


def _mark(phase: str, done: int, total: int, anchor: datetime, *, finished: bool = False) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO bench_pages_loaded VALUES (%s, %s, %s, %s, %s) ON CONFLICT (phase) DO UPDATE "
            "SET done = EXCLUDED.done, total = EXCLUDED.total, finished = EXCLUDED.finished",
            [phase, done, total, anchor, finished],
        )


def make_fleet(*, servers: int, days: int) -> Fleet:
    """The servers, tenants, users' memberships, templates, versions and deploys (made once)."""
    found = marker("fleet")
    if found is None:
        anchor = datetime.now(UTC).replace(second=0, microsecond=0)
        with transaction.atomic():
            _create_fleet(servers, anchor)
            _mark("fleet", servers, servers, anchor, finished=True)
    else:
        anchor = found[2]
    return _fleet(anchor, days)


def _create_fleet(servers: int, anchor: datetime) -> None:
    for n in range(servers):
        tenant = TENANTS[n % len(TENANTS)] if n < servers * 4 // 5 else ""
        server = Server.objects.create(
            name=f"vllm-{n:03d}", base_url=f"http://127.0.0.1:9/{n}", model="qwen2.5-7b", block_size=BLOCK,
            hash_algo="sha256_cbor", tenant=tenant, last_scraped_at=anchor,
        )  # fmt: skip
        KVStream.objects.create(server=server, last_seq=10_000_000, last_event_at=anchor)
    repository = TemplateRepository.objects.create(name="bench", location="/nowhere", globs=["*.j2"])
    for n in range(TEMPLATES):
        tenant = TENANTS[n % len(TENANTS)] if n < TEMPLATES * 2 // 3 else ""
        template = Template.objects.create(
            repository=repository, name=f"tpl-{n:02d}", path=f"tpl-{n:02d}.j2", tenant=tenant
        )
        for days in VERSION_DAYS:
            sha = hashlib.sha1(f"{n}-{days}".encode()).hexdigest()
            version = TemplateVersion.objects.create(
                template=template, commit_sha=sha, committed_at=anchor - timedelta(days=days),
                message=f"v{days}", content="{{ system }}\n{{ question }}", diff="+ line",
            )  # fmt: skip
            DeployMarker.objects.create(template_version=version, deployed_at=anchor - timedelta(days=days))
    admin = User.objects.create_superuser("bench-admin")
    member = User.objects.create_user("bench-acme")
    Membership.objects.create(user=member, tenant="acme")
    assert admin.pk and member.pk


def _fleet(anchor: datetime, days: int) -> Fleet:
    servers = list(
        Server.objects.filter(name__startswith="vllm-").order_by("name").values_list("pk", "tenant")
    )
    templates = list(
        Template.objects.filter(name__startswith="tpl-").order_by("name").values_list("pk", "tenant")
    )
    versions = np.array(
        [
            list(
                TemplateVersion.objects.filter(template_id=pk)
                .order_by("committed_at")
                .values_list("pk", flat=True)
            )
            for pk, _ in templates
        ]
    )
    return Fleet(
        anchor=anchor, days=days, server_ids=np.array([pk for pk, _ in servers]),
        server_tenants=[t for _, t in servers], template_ids=np.array([pk for pk, _ in templates]),
        template_tenants=[t for _, t in templates], version_ids=versions,
        version_times=np.array([d * 86400.0 for d in VERSION_DAYS]),
    )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk of records as columns (numpy), and what their diagnoses need."""

    first: int
    seconds: np.ndarray  # before the anchor
    server: np.ndarray  # positions in fleet.server_ids
    template: np.ndarray  # positions; -1: no template
    version: np.ndarray  # positions among the template's versions; -1: none
    tenant: list[str]
    prompt: np.ndarray
    cached: np.ndarray
    completion: np.ndarray
    ttft: np.ndarray
    cause: np.ndarray  # positions in CAUSES


def record_chunk(fleet: Fleet, number: int, total: int) -> Chunk:
    """Chunk `number` of `total` records, oldest first: the same rows for the same arguments."""
    rng = np.random.default_rng(number)
    first = number * RECORD_CHUNK
    n = min(RECORD_CHUNK, total - first)
    span = fleet.days * 86400.0
    seconds = span - (np.arange(first, first + n) + rng.random(n)) * span / total
    server = rng.integers(0, len(fleet.server_ids), n)
    template = np.where(rng.random(n) < 0.85, (rng.zipf(1.6, n) - 1) % TEMPLATES, -1)
    version = np.where(template >= 0, (seconds[:, None] < fleet.version_times[None, :]).sum(axis=1) - 1, -1)
    tenant = [
        _tenant(fleet, s, t, r)
        for s, t, r in zip(server.tolist(), template.tolist(), rng.integers(0, 8, n).tolist(), strict=True)
    ]
    prompt = rng.integers(256, MAX_BLOCKS * BLOCK + 1, n)
    rate = 0.45 + 0.4 * ((template * 7919) % 100) / 100.0
    rate = np.where((template == REGRESSED) & (version == len(VERSION_DAYS) - 1), rate / 2, rate)
    cached = (np.clip(rate + rng.normal(0, 0.15, n), 0, 1) * prompt // BLOCK * BLOCK).astype(np.int64)
    ttft = 0.03 + (prompt - cached) * 4e-5 + rng.exponential(0.02, n)
    cause = rng.choice(len(CAUSES), n, p=CAUSE_WEIGHTS)
    cause = np.where((template == REGRESSED) & (version == len(VERSION_DAYS) - 1), 0, cause)
    return Chunk(first, seconds, server, template, version, tenant, prompt, cached,
                 rng.integers(16, 512, n), ttft, cause)  # fmt: skip


def _tenant(fleet: Fleet, server: int, template: int, draw: int) -> str:
    """The server's tenant; on a shared server the template's, else one of the tenants or none."""
    owner = fleet.server_tenants[server] or (fleet.template_tenants[template] if template >= 0 else "")
    return owner or (TENANTS[draw] if draw < len(TENANTS) else "")


def _chains(fleet: Fleet, chunk: Chunk, rng: np.random.Generator) -> np.ndarray:
    """Block hashes, (rows, MAX_BLOCKS): the template version's prefix chain for its shared blocks
    (as many as the record's cached tokens), random blocks after it."""
    n = len(chunk.prompt)
    hashes = rng.integers(-(2**63), 2**63 - 1, (n, MAX_BLOCKS), dtype=np.int64)
    prefixes = np.random.default_rng(7).integers(
        -(2**63), 2**63 - 1, (TEMPLATES * 3, MAX_BLOCKS), dtype=np.int64
    )
    templated = chunk.template >= 0
    shared = np.arange(MAX_BLOCKS)[None, :] < (chunk.cached // BLOCK)[:, None]
    rows = np.where(templated, chunk.template * 3 + chunk.version, 0)
    return np.where(shared & templated[:, None], prefixes[rows], hashes)


def record_rows(fleet: Fleet, chunk: Chunk) -> Iterator[RecordRow]:
    rng = np.random.default_rng(1_000_000 + chunk.first)
    chains = _chains(fleet, chunk, rng)
    captured = rng.random(len(chunk.prompt)) < TOKEN_SHARE
    pool = np.random.default_rng(11).integers(0, 151_936, (TEMPLATES, MAX_BLOCKS * BLOCK))
    for i in range(len(chunk.prompt)):
        yield _record_row(fleet, chunk, i, chains[i], pool if captured[i] else None)


def _record_row(fleet: Fleet, chunk: Chunk, i: int, chain: np.ndarray, pool: np.ndarray | None) -> RecordRow:
    template, version, tenant = int(chunk.template[i]), int(chunk.version[i]), chunk.tenant[i]
    prompt, cached, ttft = int(chunk.prompt[i]), int(chunk.cached[i]), float(chunk.ttft[i])
    salt = hashlib.sha256(tenant.encode()).hexdigest() if tenant in SALTED else ""
    # numpy arrays where RecordRow says lists: write_rows encodes either whole (copy_rows.integer_array).
    hashes: Any = chain[: prompt // BLOCK]
    neutral: Any = np.empty(0, np.int64)
    tokens = None
    if pool is not None:
        tokens = pool[max(template, 0), :prompt].copy()
        tokens[cached:] = (tokens[cached:] + chunk.first + i) % 151_936  # differs after its cached part
        hashes = np.array(signed_block_hashes(tokens.tolist(), BLOCK), np.int64)
    if salt:
        neutral, hashes = hashes, hashes ^ np.int64(0x5A17)
    return RecordRow(
        server_id=int(fleet.server_ids[chunk.server[i]]), request_id=f"req-{chunk.first + i:010d}",
        arrived_at=fleet.anchor - timedelta(seconds=float(chunk.seconds[i])), trace_id="", model="qwen2.5-7b",
        tenant=tenant, template_id=int(fleet.template_ids[template]) if template >= 0 else None,
        template_version_id=int(fleet.version_ids[template, version]) if template >= 0 else None,
        source="gateway", client_ttft_seconds=ttft, server_ttft_seconds=ttft * 0.8, queue_seconds=0.004,
        prefill_seconds=ttft * 0.7, prompt_tokens=prompt, cached_tokens=cached,
        completion_tokens=int(chunk.completion[i]), salt_hash=salt, block_hashes=hashes,
        neutral_hashes=neutral,
        token_ids=tokens,
    )  # fmt: skip


_DIAGNOSIS_COLUMNS = (
    "server_id", "request_id", "arrived_at", "diagnosed_at", "template_id", "template_version_id", "tenant",
    "cause", "unknown", "diverged_at", "unexpected_hit", "prompt_tokens", "seen_before_tokens",
    "resident_anywhere_tokens", "resident_here_tokens", "reused_tokens",
    *(f"{c}_tokens" for c in RequestDiagnosis.Cause.values), "losses",
)  # fmt: skip
_DIAGNOSIS_TYPES = ("int8", "varchar", "timestamptz", "timestamptz", "int8", "int8", "varchar", "varchar",
                    "varchar", "int4", "bool", *["int4"] * 14, "jsonb")  # fmt: skip


def diagnosis_rows(fleet: Fleet, chunk: Chunk) -> Iterator[tuple[Any, ...]]:
    """A diagnosis per record, consistent with it: the lost tokens are its uncached whole blocks,
    all to the chunk's cause for it."""
    for i in range(len(chunk.prompt)):
        template, version = int(chunk.template[i]), int(chunk.version[i])
        prompt, reused = int(chunk.prompt[i]), int(chunk.cached[i])
        lost = (prompt // BLOCK) * BLOCK - reused
        cause = CAUSES[chunk.cause[i]] if lost > 0 else ""
        lost_by = {c: (lost if c == cause else 0) for c in RequestDiagnosis.Cause.values}
        anywhere = reused + (lost if cause in ("routed_elsewhere", "unexplained") else 0)
        arrived = fleet.anchor - timedelta(seconds=float(chunk.seconds[i]))
        yield (
            int(fleet.server_ids[chunk.server[i]]), f"req-{chunk.first + i:010d}", arrived,
            arrived + timedelta(seconds=30), int(fleet.template_ids[template]) if template >= 0 else None,
            int(fleet.version_ids[template, version]) if template >= 0 else None, chunk.tenant[i], cause, "",
            reused if cause == "prompt_changed" else None, False, prompt,
            prompt - (lost if cause == "cold" else 0), anywhere,
            reused + (lost if cause == "unexplained" else 0), reused, *lost_by.values(),
            Jsonb([_loss(fleet, chunk, i, cause, arrived)] if cause else []),
        )  # fmt: skip


def _loss(fleet: Fleet, chunk: Chunk, i: int, cause: str, arrived: datetime) -> dict[str, object]:
    """The diagnosis' one loss as the product stores it (diagnosis._loss_json): a routed-elsewhere
    loss names the next server, which held the prompt's cached and lost tokens; an eviction names
    the record's own server and when the blocks were stored and removed there."""
    reused = int(chunk.cached[i])
    lost = (int(chunk.prompt[i]) // BLOCK) * BLOCK - reused
    found: dict[str, object] = {"cause": cause, "first_token": reused, "tokens": lost}
    if cause == "routed_elsewhere":
        other = (int(chunk.server[i]) + 1) % len(fleet.server_ids)
        found |= {"server_id": int(fleet.server_ids[other]), "server_tokens": reused + lost}
    elif cause == "evicted":
        found |= {"server_id": int(fleet.server_ids[chunk.server[i]]),
                  "stored_at": (arrived - timedelta(minutes=20)).isoformat(),
                  "removed_at": (arrived - timedelta(minutes=2)).isoformat()}  # fmt: skip
    return found


def set_aside(table: str) -> None:
    """Drop the table's keys, indexes and foreign keys for its load (COPY then only appends; kept
    up row by row, a random B-tree like kv_event_server_hash made the KV events' COPY I/O-bound at
    ~40,000 rows/s), their statements kept in bench_pages_set_aside, so a load stopped mid-way still
    finds them; `restore` makes them again, each built once by a sort."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_SET_ASIDE_SQL)
        cursor.execute(_DEFINITIONS_SQL, {"table": table})
        found = cursor.fetchall()
        for name, position, restore_sql, drop_sql in found:
            cursor.execute(
                "INSERT INTO bench_pages_set_aside VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING",
                [name, table, position, restore_sql, drop_sql],
            )
        for _name, _position, _restore, drop_sql in sorted(found, key=lambda row: -row[1]):
            cursor.execute(drop_sql)


def restore(table: str) -> float:
    """Make the set-aside keys, indexes and foreign keys of the table again (each in its own
    transaction, a stopped restore resumes); seconds it took."""
    started = time.perf_counter()
    with connection.cursor() as cursor:
        cursor.execute(_SET_ASIDE_SQL)
        cursor.execute(
            "SELECT name, restore FROM bench_pages_set_aside WHERE tbl = %s ORDER BY position, name", [table]
        )
        found = cursor.fetchall()
    for name, restore_sql in found:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET LOCAL maintenance_work_mem = '1GB'")
            cursor.execute(restore_sql)
            cursor.execute("DELETE FROM bench_pages_set_aside WHERE name = %s", [name])
        print(f"  {table}: {name} made again, {time.perf_counter() - started:,.0f} s", flush=True)
    return time.perf_counter() - started


def _copy_chunks(phase: str, table: str, total_rows: int, chunk_rows: int, anchor: datetime,
                 copy_one: Callable[[int], None]) -> float:  # fmt: skip
    """COPY the chunks not yet recorded, each committed with its marker, the table's indexes set
    aside meanwhile; rows per second (the indexes' build included)."""
    chunks = -(-total_rows // chunk_rows)
    found = marker(phase)
    if found is not None and found[3]:
        restore(table)  # a load stopped while they were being made
        return float("nan")
    start = found[0] if found is not None else 0
    set_aside(table)
    started, copied = time.perf_counter(), 0
    for number in range(start, chunks):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit = off")
            copy_one(number)
            _mark(phase, number + 1, chunks, anchor, finished=number + 1 == chunks)
        copied += min(chunk_rows, total_rows - number * chunk_rows)
        if number % 10 == 9 or number + 1 == chunks:
            rate = copied / (time.perf_counter() - started)
            print(f"  {phase}: chunk {number + 1}/{chunks}, {rate:,.0f} rows/s", flush=True)
    _mark(phase, chunks, chunks, anchor, finished=True)
    restore(table)
    return copied / max(time.perf_counter() - started, 1e-9)


def ensure_partitions(fleet: Fleet) -> None:
    """The daily partitions the rows fall in, made as the product makes late history's."""
    days = [day_of(fleet.anchor - timedelta(days=d)) for d in range(fleet.days + 1)]
    for model in (RequestRecord, RequestDiagnosis):
        create_day_partitions(model, days)
    create_day_partitions(KVEvent, days[: KV_DAYS + 1])


def load_records(fleet: Fleet, total: int) -> float:
    columns = ", ".join(RecordRow._fields)

    def copy_one(number: int) -> None:
        chunk = record_chunk(fleet, number, total)
        with (
            connection.cursor() as cursor,
            cursor.cursor.copy(f"COPY traffic_requestrecord ({columns}) FROM STDIN (FORMAT BINARY)") as copy,
        ):
            write_rows(copy, record_rows(fleet, chunk), columns=RecordRow._fields, types=TABLE_TYPES)

    return _copy_chunks("records", "traffic_requestrecord", total, RECORD_CHUNK, fleet.anchor, copy_one)


def load_diagnoses(fleet: Fleet, total: int) -> float:
    columns = ", ".join(_DIAGNOSIS_COLUMNS)

    def copy_one(number: int) -> None:
        chunk = record_chunk(fleet, number, total)
        with (
            connection.cursor() as cursor,
            cursor.cursor.copy(
                f"COPY traffic_requestdiagnosis ({columns}) FROM STDIN (FORMAT BINARY)"
            ) as copy,
        ):
            write_rows(copy, diagnosis_rows(fleet, chunk), columns=_DIAGNOSIS_COLUMNS, types=_DIAGNOSIS_TYPES)

    return _copy_chunks("diagnoses", "traffic_requestdiagnosis", total, RECORD_CHUNK, fleet.anchor, copy_one)


_KV_COLUMNS = ("server_id", "dp_rank", "epoch", "seq", "event_index", "block_index", "emitted_at",
               "received_at", "kind", "block_hash", "parent_hash", "token_count", "medium", "lora_name",
               "group_idx")  # fmt: skip
_PG_EPOCH = datetime(2000, 1, 1, tzinfo=UTC)
# A binary COPY row of fixed width: the field count, then each field's length and big-endian value;
# medium and lora_name empty (length 0), group_idx NULL (length -1, no value).
_KV_ROW = np.dtype(
    [("fields", ">i2"), ("l_server", ">i4"), ("server", ">i8"), ("l_rank", ">i4"), ("rank", ">i2"),
     ("l_epoch", ">i4"), ("epoch", ">i4"), ("l_seq", ">i4"), ("seq", ">i8"), ("l_event", ">i4"),
     ("event", ">i2"),
     ("l_block", ">i4"), ("block", ">i4"), ("l_emitted", ">i4"), ("emitted", ">i8"), ("l_received", ">i4"),
     ("received", ">i8"), ("l_kind", ">i4"), ("kind", ">i2"), ("l_hash", ">i4"), ("hash", ">i8"),
     ("l_parent", ">i4"), ("parent", ">i8"), ("l_tokens", ">i4"), ("tokens", ">i2"), ("l_medium", ">i4"),
     ("l_lora", ">i4"), ("l_group", ">i4")]
)  # fmt: skip
_SIZES = {"server": 8, "rank": 2, "epoch": 4, "seq": 8, "event": 2, "block": 4, "emitted": 8, "received": 8,
          "kind": 2, "hash": 8, "parent": 8, "tokens": 2, "medium": 0, "lora": 0, "group": -1}  # fmt: skip
_BATCH_EVENTS = 16  # blocks per event batch (one seq)


def kv_stream(fleet: Fleet, number: int, total: int) -> bytes:
    """Chunk `number` of the KV events as a binary COPY stream (header, rows, trailer): each server's
    batches of 16 blocks, its sequence rising with time; two in three stored, one removed."""
    rng = np.random.default_rng(5_000_000 + number)
    first = number * KV_CHUNK
    n = min(KV_CHUNK, total - first)
    index = np.arange(first, first + n)
    servers = len(fleet.server_ids)
    batch = index // _BATCH_EVENTS
    span = KV_DAYS * 86400.0 - 120
    seconds = span - batch * span * _BATCH_EVENTS / total  # before the anchor
    rows = np.zeros(n, _KV_ROW)
    rows["fields"] = len(_KV_COLUMNS)
    for name, size in _SIZES.items():
        rows[f"l_{name}"] = size
    rows["server"] = fleet.server_ids[batch % servers]
    rows["seq"] = batch // servers
    rows["event"] = index % _BATCH_EVENTS
    micros = ((fleet.anchor - _PG_EPOCH).total_seconds() - seconds) * 1e6
    rows["emitted"] = micros.astype(np.int64)
    rows["received"] = rows["emitted"] + 2_000
    rows["kind"] = np.where(rng.random(n) < 2 / 3, KVEvent.Kind.STORED, KVEvent.Kind.REMOVED)
    rows["hash"] = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    rows["parent"] = rng.integers(-(2**63), 2**63 - 1, n, dtype=np.int64)
    rows["tokens"] = BLOCK
    return b"PGCOPY\n\xff\r\n\0" + b"\0" * 8 + rows.tobytes() + b"\xff\xff"


def load_kv_events(fleet: Fleet, total: int) -> float:
    columns = ", ".join(_KV_COLUMNS)

    def copy_one(number: int) -> None:
        stream = kv_stream(fleet, number, total)
        sql = f"COPY traffic_kvevent ({columns}) FROM STDIN (FORMAT BINARY)"
        with connection.cursor() as cursor, cursor.cursor.copy(sql) as copy:
            copy.write(stream)

    return _copy_chunks("kv_events", "traffic_kvevent", total, KV_CHUNK, fleet.anchor, copy_one)


# A server's own readings per minute, from its request rollups (there are no scrapes to pull them
# from): engine counters that match what its records say, and KV usage. Its evictions are the
# product's count of its KV events (refresh_server_minutes, run before), zero before them.
_SCRAPED = ("scrapes", "failed_scrapes", "prefix_queries", "prefix_hits", "preemptions", "finished_requests",
            "kv_usage_sum", "kv_usage_samples", "kv_usage_max", "ttft_count", "ttft_sum_seconds")  # fmt: skip
_SERVER_MINUTES_SQL = f"""
INSERT INTO traffic_serverminute (server_id, minute, {", ".join(_SCRAPED)}, ttft_buckets, evictions)
SELECT server_id, minute, 4, 0, sum(prompt_tokens), sum(cached_tokens), 0, sum(requests), 2.4, 4, 0.7,
       sum(server_ttft_count), sum(server_ttft_sum_seconds), '{{}}', 0
FROM traffic_minuterollup GROUP BY server_id, minute
ON CONFLICT (server_id, minute) DO UPDATE SET
    {", ".join(f"{c} = EXCLUDED.{c}" for c in _SCRAPED)}
"""


def compute_rollups(fleet: Fleet) -> float:
    """The request and loss rollups by the product's services, an hour at a time, oldest first; the
    server minutes from the request rollups, their hours by the product's service. Seconds it took.

    An hour at a time, not a day: the product refreshes the last minutes as they pass, so a minute's
    rows lie together on disk. Summed a day at a time, each minute's rows were spread over the day's
    pages (in group order), and a 1-hour read of the minute rollups read a page per row (30,000)."""
    found = marker("rollups")
    if found is not None and found[3]:
        return float("nan")
    started = time.perf_counter()
    for hour in range((fleet.days + 1) * 24, 0, -1):
        since = fleet.anchor - timedelta(hours=hour)
        refresh_minute_rollups(since=since, until=since + timedelta(hours=1))
        refresh_loss_minutes(since=since, until=since + timedelta(hours=1))
    week = {
        "since": fleet.anchor - timedelta(days=fleet.days + 1),
        "until": fleet.anchor + timedelta(hours=1),
    }
    refresh_server_minutes(**week)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_SERVER_MINUTES_SQL)
        resum(rollup_of(ServerHour), cursor, since=week["since"], until=week["until"])  # as the service sums
    _mark("rollups", 1, 1, fleet.anchor, finished=True)
    return time.perf_counter() - started


def load_rollup_fleet(*, servers: int, days: int, records: int) -> Fleet:
    """A fleet whose rollups the page benches read (bench_series, bench_fleet_page): `records` request
    records over `days` with their diagnoses, the rollups computed from them by the product's
    services, the tables analysed. No KV events."""
    fleet = make_fleet(servers=servers, days=days)
    ensure_partitions(fleet)
    load_records(fleet, records)
    load_diagnoses(fleet, records)
    compute_rollups(fleet)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return fleet
