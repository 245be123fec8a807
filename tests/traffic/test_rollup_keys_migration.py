"""Migration 0018 gives the rollups a primary key that holds the server, keeping the rows a
database already has (tests/core/test_shardable_schema.py checks the keys themselves)."""

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from app.fleet.models import Server
from app.traffic.models import LossMinute, MinuteRollup, ServerMinute

pytestmark = pytest.mark.django_db(transaction=True)

MINUTE = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
BEFORE, AFTER = ("traffic", "0017_server_rollups"), ("traffic", "0018_rollup_keys_with_server")


def migrate(target: tuple[str, str]) -> None:
    executor = MigrationExecutor(connection)
    executor.migrate([target])


@pytest.fixture(autouse=True)
def latest_after() -> Iterator[None]:
    """The schema of the latest migrations again afterwards: the tests after this one (the same
    database) need the tables of the migrations after 0018."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def insert_old_rows(server_id: int) -> None:
    """Rows as the tables held them under 0017, ids from their identity columns."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO traffic_minuterollup (server_id, template_id, minute, requests, prompt_tokens,"
            " cached_tokens, cache_known_prompt_tokens, client_ttft_count, client_ttft_sum_seconds,"
            " client_ttft_buckets, server_ttft_count, server_ttft_sum_seconds, server_ttft_buckets,"
            " prefill_count, prefill_uncached_sum, prefill_ttft_sum, prefill_uncached_squares,"
            " prefill_cross_sum)"
            " VALUES (%s, NULL, %s, 3, 300, 100, 300, 0, 0, '{}', 0, 0, '{}', 0, 0, 0, 0, 0)",
            [server_id, MINUTE],
        )
        cursor.execute(
            "INSERT INTO traffic_serverminute (server_id, minute, scrapes, failed_scrapes, prefix_queries,"
            " prefix_hits, preemptions, finished_requests, kv_usage_sum, kv_usage_samples, ttft_count,"
            " ttft_sum_seconds, ttft_buckets, evictions)"
            " VALUES (%s, %s, 4, 0, 10, 5, 0, 2, 0, 0, 0, 0, '{}', 7)",
            [server_id, MINUTE],
        )


def test_the_rollups_keep_their_rows_and_number_new_ones_after_the_old() -> None:
    server = Server.objects.create(name="vllm-a", base_url="http://vllm-a:8000", block_size=16)
    migrate(BEFORE)
    try:
        insert_old_rows(server.pk)
    finally:
        migrate(AFTER)
        latest = MigrationExecutor(connection)  # the models' columns (later ones too) to read them by
        latest.migrate(latest.loader.graph.leaf_nodes())

    old = MinuteRollup.objects.get(server=server, minute=MINUTE)
    assert (old.requests, old.cached_tokens) == (3, 100)
    assert ServerMinute.objects.get(server=server, minute=MINUTE).evictions == 7
    new = MinuteRollup.objects.create(server=server, minute=MINUTE.replace(minute=31), requests=1,
                                      prompt_tokens=10, cached_tokens=0)  # fmt: skip
    assert new.pk == (server.pk, new.id) and new.id > old.id
    loss = LossMinute.objects.create(server=server, minute=MINUTE, requests=1, diagnosed=1)
    assert loss.pk == (server.pk, loss.id)
