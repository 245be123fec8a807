"""The ingest hashes a batch's prompts on a thread of its own, ahead of the COPY that stores them
(app/traffic/services/requests.py `_hashed_ahead`): each row still gets its own prompt's chains, in
the batch's order, and a record whose hashing fails fails its batch as a bad value does in the COPY,
so that a writer storing the batch again record by record rejects that record alone."""

from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import DataError
from django.utils import timezone

from app.domain.blockhash import block_hash_chain, wire_to_signed
from app.fleet.models import Server
from app.fleet.selectors import UNKNOWN_MODEL_REASON
from app.traffic.collection.gateway_writer import GatewayWriter
from app.traffic.models import RejectedInput, RequestRecord
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts

RECORDS = 50  # several of the hashing thread's tasks (16 records each)
BAD = 37  # in a task after the first: the COPY has taken rows by then


@pytest.fixture
def server() -> Server:
    return Server.objects.create(
        name="vllm-0",
        base_url="http://vllm-0:8000",
        block_size=32,
        model="tiny",
        base_models=["tiny"],
        models_read_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


def prompt(n: int) -> list[int]:
    return [(n * 7919 + i * 104_729) % 151_936 for i in range(64 + n)]  # 2 or more full blocks


def facts(n: int, **fields: object) -> RequestFacts:
    """Record n: its own prompt, every third salted, every seventh under a model the server does not
    serve (stored without chains), every eleventh without token ids."""
    options: dict[str, object] = {
        "prompt_token_ids": None if n % 11 == 10 else prompt(n), "model": "typo" if n % 7 == 6 else "tiny",
        "cache_salt": "tenant-a" if n % 3 == 0 else None,
    }  # fmt: skip
    return RequestFacts(request_id=f"r-{n}", arrived_at=timezone.now(), server="vllm-0", **(options | fields))  # type: ignore[arg-type]


def chain(ids: list[int], salt: str | None = None) -> list[int]:
    return [wire_to_signed(h.wire) for h in block_hash_chain(ids, 32, cache_salt=salt)]


@pytest.mark.django_db
def test_each_record_of_a_batch_is_stored_with_its_own_prompts_chains(server: Server) -> None:
    batch = [facts(n) for n in range(RECORDS)]
    outcome = ingest_request_records(batch, source="gateway", now=timezone.now())

    assert outcome.stored == RECORDS and not outcome.rejected
    stored = {r.request_id: r for r in RequestRecord.objects.all()}
    for item in batch:
        record, ids = stored[item.request_id], item.prompt_token_ids
        hashed = ids is not None and item.model == "tiny"
        assert record.token_ids == ids
        assert record.block_hashes == (chain(list(ids), item.cache_salt) if hashed else [])  # type: ignore[arg-type]
        assert record.neutral_hashes == (chain(list(ids)) if hashed and item.cache_salt else [])  # type: ignore[arg-type]
    unhashed = sum(1 for item in batch if item.prompt_token_ids is not None and item.model == "typo")
    assert (
        RejectedInput.objects.get(server=server, reason="unknown_model", detail=UNKNOWN_MODEL_REASON).count
        == unhashed
    )


@pytest.mark.django_db
def test_a_token_id_beyond_int64_fails_the_batch_as_one_beyond_int4_does(server: Server) -> None:
    batch = [facts(n) for n in range(RECORDS)]
    batch[BAD] = facts(BAD, prompt_token_ids=[1, 2**64, *range(62)])

    with pytest.raises(DataError, match=r"^token_ids: a value is out of range"):
        ingest_request_records(batch, source="gateway", now=timezone.now())
    assert not RequestRecord.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_the_gateway_writer_rejects_alone_a_record_whose_hashing_fails(
    server: Server, tmp_path: Path
) -> None:
    batch = [facts(n) for n in range(RECORDS)]
    batch[BAD] = facts(BAD, prompt_token_ids=[1, 2**64, *range(62)])
    writer = GatewayWriter(server="vllm-0", spill_path=tmp_path / "spill.jsonl", batch_size=RECORDS)
    for item in batch:
        writer.record(item)
    writer.start()
    writer.stop()

    assert writer.stored == RECORDS - 1 and not writer.spilled
    stored = set(RequestRecord.objects.values_list("request_id", flat=True))
    assert stored == {item.request_id for item in batch} - {f"r-{BAD}"}
    assert (
        RejectedInput.objects.get(
            server=server, reason="not_storable", detail="not storable: DataError"
        ).count
        == 1
    )
