"""A request under a LoRA adapter gets the chain vLLM computed for it: the adapter's name and path
(learnt from the server's /v1/models) in every block's extra keys."""

from datetime import UTC, datetime

import pytest

from app.domain.blockhash import LoraKey, block_hash_chain, signed_to_wire
from app.fleet.models import Server
from app.fleet.selectors import UNKNOWN_MODEL_REASON
from app.traffic.models import RejectedInput, RequestRecord
from tests.support.factories import a_server, facts, ingested

pytestmark = pytest.mark.django_db

PROMPT = list(range(1000, 1100))  # three full blocks of 32


@pytest.fixture
def server() -> Server:
    return a_server(
        name="vllm-lora",
        block_size=32,
        base_models=["tiny"],
        lora_adapters={"support-lora": "lora-adapter"},
        models_read_at=datetime(2026, 12, 1, tzinfo=UTC),
    )


def stored(server: Server, model: str) -> RequestRecord:
    (record,) = ingested(facts(server=server.name, model=model, prompt_token_ids=PROMPT))
    return record


def wire(record: RequestRecord) -> list[int]:
    return [signed_to_wire(h) for h in record.block_hashes]


def test_an_adapters_request_is_hashed_with_its_name_and_path(server: Server) -> None:
    adapter = wire(stored(server, "support-lora"))
    assert adapter == [
        h.wire for h in block_hash_chain(PROMPT, 32, lora=LoraKey("support-lora", "lora-adapter"))
    ]
    assert adapter != wire(stored(server, "tiny")) == [h.wire for h in block_hash_chain(PROMPT, 32)]


def test_a_model_the_server_does_not_serve_is_stored_without_a_chain_and_counted(server: Server) -> None:
    record = stored(server, "typo-lora")
    assert record.block_hashes == [] and record.token_ids == PROMPT  # the rest of the record is kept
    assert RejectedInput.objects.get(server=server, source="rest").detail == UNKNOWN_MODEL_REASON
