"""A hybrid server whose attention group is not group 0, diagnosed by the scheduled run: its events
as the simulator's hybrid engine publishes them (Mamba group 0, attention group 1, in vLLM's wire
encoding), decoded and stored as the KV collector stores them, its records ingested, and the kinds
the events named stored as the collector stores them (Server.kv_cache_groups). The truth is what
the engine reused and evicted."""

from datetime import datetime, timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.domain.blockhash import block_hash_chain
from app.fleet.models import Server
from app.fleet.services import KVCacheGroups, record_kv_cache_groups
from app.traffic.collection.kv_collector import event_rows
from app.traffic.models import KVStream, RequestDiagnosis
from app.traffic.services.kv_events import StreamPosition, store_kv_events
from app.traffic.services.requests import ingest_request_records
from collectors.kv_events.parse import BlockStored, decode_sub_message
from collectors.records import RequestFacts
from simulator.cache import PrefixCache
from simulator.kv_events import encode_batch, seq_frame

pytestmark = pytest.mark.django_db

SIZE, HIT_BLOCK = 16, 64


def prompt(seed: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 50_000 for i in range(8 * HIT_BLOCK + 1)]


class Engine:
    """The simulated hybrid engine behind one registered server, stored as the collector stores it."""

    def __init__(self, server: Server, start: datetime) -> None:
        self.server, self.start = server, start
        self.cache = PrefixCache(SIZE, 40, hit_block=HIT_BLOCK)  # one prompt of 32 blocks at a time
        self.seq, self.clock = -1, 0
        self.groups: KVCacheGroups = {}  # as the collector notes them

    def publish(self) -> None:
        events = self.cache.take_events()
        if not events:
            return
        self.seq += 1
        at = self.start + timedelta(seconds=self.clock)
        message = decode_sub_message([b"kv", seq_frame(self.seq), encode_batch(at.timestamp(), events, 0)])
        for event in message.batch.events:
            if isinstance(event, BlockStored):
                self.groups[str(event.group_idx)] = {
                    "kind": event.kv_cache_spec_kind or "",
                    "block_size": event.block_size,
                }
        record_kv_cache_groups(server_id=self.server.pk, groups=dict(self.groups))
        self.server.refresh_from_db()
        rows = event_rows(message.batch, server_id=self.server.pk, epoch=0, seq=self.seq, received_at=at)
        store_kv_events(rows=rows, positions=[StreamPosition(self.server.pk, 0, 0, self.seq, at)],
                        attention={self.server.pk: self.server.attention_group})  # fmt: skip

    def serve(self, name: str, tokens: list[int]) -> int:
        self.clock += 1
        self.publish()
        cached = self.cache.admit(name, tokens).cached_tokens
        self.cache.finish(name)
        facts = RequestFacts(request_id=name, arrived_at=self.start + timedelta(seconds=self.clock),
                             server=self.server.name, prompt_tokens=len(tokens), cached_tokens=cached,
                             prompt_token_ids=tokens, template="")  # fmt: skip
        ingest_request_records([facts], source="rest", now=timezone.now())
        self.clock += 1
        self.publish()
        return cached


def test_the_run_diagnoses_a_hybrid_server_by_its_attention_group_learned_from_its_events() -> None:
    forget_kept_replay()
    server = Server.objects.create(
        name="hybrid", base_url="http://hybrid:8000", block_size=SIZE, model="tiny"
    )
    start = timezone.now().replace(microsecond=0) - timedelta(minutes=5)
    engine = Engine(server, start)
    first, second = prompt(1), prompt(2)
    truth = {name: engine.serve(name, tokens) for name, tokens in
             [("a", first), ("a2", first), ("b", second), ("a3", first)]}  # fmt: skip
    server.refresh_from_db()
    assert server.attention_group == 1 and server.kv_cache_groups["0"]["kind"] == "mamba"
    assert server.hit_block is not None and server.hit_block.effective == HIT_BLOCK
    # The block index follows group 1: the attention blocks the engine holds (the Mamba group's are 1 in 4).
    held = sum(
        engine.cache._pool.resident([key]) for t in (first, second) for key in block_hash_chain(t, SIZE)
    )
    assert KVStream.objects.get(server=server).resident_blocks == held > 32
    after = start + timedelta(seconds=engine.clock + settings.PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS + 5)
    assert diagnose_requests(now=after) == 4
    found = {d.request_id: d for d in RequestDiagnosis.objects.filter(server=server)}
    assert (
        truth["a2"] == 8 * HIT_BLOCK and found["a2"].cause == "" and found["a2"].resident_here_tokens == 512
    )
    assert 0 < truth["a3"] < 8 * HIT_BLOCK  # the engine evicted some of it ...
    assert found["a3"].cause == "evicted" and found["a3"].reused_tokens == truth["a3"]  # ... and so it reads
    assert not found["a3"].unexpected_hit and found["a3"].evicted_tokens > 0
