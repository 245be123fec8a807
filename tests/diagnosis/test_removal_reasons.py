"""The scheduled diagnosis reads a removal's reason as the collector stored it: SGLang's BlockRemoved
(issue #39604: block_hashes, medium) with the reason PR #39620 (open) adds, decoded and stored as
the KV collector does. Demoted blocks are `demoted` with no lower tier's BlockStored seen; blocks a
finished request freed (its own copies) leave the cached ones resident."""

from datetime import timedelta

import msgspec
import pytest
from django.conf import settings
from django.utils import timezone

from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.domain.blockhash import signed_block_hashes, signed_to_wire
from app.fleet.models import Server
from app.traffic.collection.kv_collector import event_rows
from app.traffic.models import RequestDiagnosis
from app.traffic.services.kv_events import StreamPosition, store_kv_events
from app.traffic.services.requests import ingest_request_records
from collectors.kv_events.parse import decode_sub_message
from collectors.records import RequestFacts

pytestmark = pytest.mark.django_db

SIZE = 16
TOKENS = [(7 * i + 3) % 50_000 for i in range(200)]  # 12 reusable blocks


def test_a_demoted_removal_is_demoted_and_a_released_one_leaves_the_cached_blocks_resident() -> None:
    forget_kept_replay()
    server = Server.objects.create(name="sglang", base_url="http://sglang:30000", block_size=SIZE, model="m")
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    wire = [signed_to_wire(h) for h in signed_block_hashes(TOKENS, SIZE)[:12]]
    stored = {"type": "BlockStored", "block_hashes": wire, "parent_block_hash": None,
              "token_ids": TOKENS[: 12 * SIZE], "block_size": SIZE, "lora_id": None,
              "medium": "GPU"}  # fmt: skip
    released = {"type": "BlockRemoved", "block_hashes": wire, "medium": "GPU", "reason": "released"}
    demoted = {"type": "BlockRemoved", "block_hashes": wire[6:], "medium": "GPU", "reason": "demoted"}
    for seq, events in enumerate([[stored], [released], [demoted]]):
        at = start + timedelta(seconds=seq + 1)
        payload = msgspec.msgpack.encode([at.timestamp(), events, 0])
        batch = decode_sub_message([b"kv", seq.to_bytes(8, "big"), payload]).batch
        rows = event_rows(batch, server_id=server.pk, epoch=0, seq=seq, received_at=at)
        store_kv_events(rows=rows, positions=[StreamPosition(server.pk, 0, 0, seq, at)])
    arrived = start + timedelta(seconds=10)
    facts = RequestFacts(request_id="r", arrived_at=arrived, server=server.name, prompt_tokens=len(TOKENS),
                         cached_tokens=6 * SIZE, prompt_token_ids=TOKENS)  # fmt: skip
    ingest_request_records([facts], source="rest", now=timezone.now())

    later = arrived + timedelta(seconds=settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS + 5)
    assert diagnose_requests(now=later) == 1
    found = RequestDiagnosis.objects.get(server=server, request_id="r")
    assert found.cause == "demoted" and found.demoted_tokens == 6 * SIZE and found.evicted_tokens == 0
    assert found.resident_here_tokens == 6 * SIZE and not found.unexpected_hit  # released: still cached
