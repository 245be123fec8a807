"""Rejected input is counted under fixed codes; the tallies kept as free text are mapped to them."""

import importlib
from datetime import UTC, datetime, timedelta

import pytest
from django.apps import apps

from app.fleet.models import Server
from app.traffic.models import RejectedInput
from collectors.errors import RejectReason

migration = importlib.import_module("app.traffic.migrations.0003_rejection_reason_codes")

# What the releases before the codes wrote as the reason, each with the code it now has.
OLD_REASONS = [
    ("refused (429): the process was ingesting as many batches as it may", "busy"),
    ("refused (429): the database did not take the batch in time", "database_busy"),
    ("refused by the database: IntegrityError", "not_storable"),
    ("not storable: DataError", "not_storable"),
    ("queue full: record dropped", "queue_full"),
    ("spill file: unreadable line", "spill_unreadable"),
    ("SUB message: expected 3 frames [topic, seq, payload], got 2", "kv_frames"),
    ("seq: expected 8 bytes, got 4", "kv_frames"),
    ("batch: not a msgpack value (truncated)", "kv_not_msgpack"),
    ("batch: expected [ts, [events], dp_rank] (Expected `array`)", "kv_batch_shape"),
    ("event: unknown type 'BlockMoved'", "kv_unknown_type"),
    ("event: empty array", "kv_event_shape"),
    ("BlockStored.token_ids: missing", "kv_field_missing"),
    ("BlockStored.block_size: expected a positive int up to 32767", "kv_field_invalid"),
    ("arrived_at: no time zone", "no_time_zone"),
    ("arrived_at: older than the request records' retention (30 days)", "too_old"),
    ("arrived_at: further ahead than the request records' partitions", "too_far_ahead"),
    ("cached_tokens: more than prompt_tokens", "cached_over_prompt"),
    ("model: the server serves no base model or LoRA adapter of that name; no block hashes", "unknown_model"),
    ("tenant: longer than 100 characters", "text_too_long"),
    ("model: not valid Unicode (a lone surrogate)", "text_invalid"),
    ("record: not JSON (or not UTF-8)", "body_invalid"),
    ("answer: not a JSON object", "body_invalid"),
    ("gen_ai.latency.time_to_first_token: expected a duration in seconds", "usage_invalid"),
    ("usage.prompt_tokens_details: expected an object or null", "usage_invalid"),
    ("prompt_token_ids[]: Expected `int`, got `str`", "field_invalid"),
    ("request_id: empty", "field_invalid"),
    ("something no release wrote", "other"),
]


@pytest.mark.parametrize(("old", "code"), OLD_REASONS)
def test_every_reason_an_older_release_wrote_maps_to_its_code(old: str, code: str) -> None:
    assert migration.code_of(old) == code
    assert RejectReason(code)


@pytest.mark.django_db
def test_tallies_of_one_code_merge_and_keep_the_latest_message_as_detail() -> None:
    server = Server.objects.create(name="vllm-a", base_url="http://a:8000")
    t0 = datetime(2026, 12, 1, tzinfo=UTC)

    def old(reason: str, count: int, minutes: int) -> None:
        at = t0 + timedelta(minutes=minutes)
        RejectedInput.objects.create(
            server=server, source="kv_events", reason=reason, count=count, first_seen_at=at, last_seen_at=at
        )

    old("refused by the database: IntegrityError", 5, 10)  # fits the new column: the test's shortcut
    old("not storable: DataError", 2, 0)
    old("queue full: record dropped", 1, 3)
    migration.to_codes(apps, None)
    rows = RejectedInput.objects.order_by("reason").values_list("reason", "detail", "count", "first_seen_at")
    assert list(rows) == [
        ("not_storable", "refused by the database: IntegrityError", 7, t0),
        ("queue_full", "queue full: record dropped", 1, t0 + timedelta(minutes=3)),
    ]
