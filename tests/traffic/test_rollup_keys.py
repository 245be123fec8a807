"""The request and loss rollups number their rows from a sequence of their own, under a primary key that
holds the server (tests/core/test_shardable_schema.py checks the keys themselves): the sequences the
initial migration makes (app/traffic/migrations/0001_initial.py, SEQUENCED)."""

from datetime import UTC, datetime

import pytest
from django.db import connection

from app.fleet.models import Server
from app.traffic.models import HourRollup, LossHour, LossMinute, MinuteRollup

pytestmark = pytest.mark.django_db

MINUTE = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)


def test_new_rows_are_keyed_by_server_and_an_id_from_their_tables_sequence() -> None:
    server = Server.objects.create(name="vllm-a", base_url="http://vllm-a:8000", block_size=16)
    first = MinuteRollup.objects.create(
        server=server, minute=MINUTE, requests=1, prompt_tokens=10, cached_tokens=0
    )
    second = MinuteRollup.objects.create(
        server=server, minute=MINUTE.replace(minute=31), requests=1, prompt_tokens=10, cached_tokens=0
    )
    assert first.pk == (server.pk, first.id) and second.id > first.id
    hour = HourRollup.objects.create(
        server=server, hour=MINUTE, requests=1, prompt_tokens=10, cached_tokens=0
    )
    loss_minute = LossMinute.objects.create(server=server, minute=MINUTE, requests=1, diagnosed=1)
    loss_hour = LossHour.objects.create(server=server, hour=MINUTE, requests=1, diagnosed=1)
    assert [hour.pk, loss_minute.pk, loss_hour.pk] == [
        (server.pk, hour.id), (server.pk, loss_minute.id), (server.pk, loss_hour.id)
    ]  # fmt: skip
    with connection.cursor() as cursor:
        for model in (MinuteRollup, HourRollup, LossMinute, LossHour):
            table = model._meta.db_table
            cursor.execute("SELECT pg_get_serial_sequence(%s, 'id')", [table])
            assert cursor.fetchone() == (f"public.{table}_id_seq",)
