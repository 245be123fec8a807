"""A person accepts a proposed server, or merges it into the registered server it stands for."""

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from app.fleet.models import Server
from app.fleet.services import ServerStateError, accept_server
from app.rollups.merge import merge_server
from app.traffic.models import MinuteRollup, RejectedInput, RequestRecord
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db


def proposed(name: str = "vllm-0-typo") -> Server:
    return Server.objects.create(name=name, base_url="", state=Server.State.PROPOSED)


def registered(name: str = "vllm-0") -> Server:
    return a_server(name=name, block_size=32)


def record(
    server: Server, request_id: str, at: datetime, source: str = "otlp", **fields: object
) -> RequestRecord:
    created: RequestRecord = RequestRecord.objects.create(
        server=server, request_id=request_id, arrived_at=at, source=source, **fields
    )
    return created


def test_an_accepted_server_is_active_at_its_base_url_and_pulled() -> None:
    server = proposed()
    accepted = accept_server(server_id=server.pk, base_url="http://vllm-9:8000")
    server.refresh_from_db()
    assert (server.state, server.base_url) == (Server.State.ACTIVE, "http://vllm-9:8000")
    assert accepted == server


@pytest.mark.parametrize("state", [Server.State.ACTIVE, Server.State.DOWN, Server.State.DISABLED])
def test_only_a_proposed_server_can_be_accepted(state: Server.State) -> None:
    server = a_server(name="vllm-0", base_url="http://a:8000", state=state)
    with pytest.raises(ServerStateError):
        accept_server(server_id=server.pk, base_url="http://b:8000")
    server.refresh_from_db()
    assert (server.state, server.base_url) == (state, "http://a:8000")


def test_a_merge_moves_the_records_and_deletes_the_proposed_server() -> None:
    into, typo = registered(), proposed()
    now = timezone.now().replace(second=0, microsecond=0)
    record(into, "req-a", now - timedelta(minutes=30), prompt_tokens=100)
    record(typo, "req-b", now - timedelta(minutes=5), prompt_tokens=200, cached_tokens=64)
    record(typo, "req-c", now - timedelta(minutes=4), prompt_tokens=300, cached_tokens=0)

    merged = merge_server(server_id=typo.pk, into_id=into.pk)

    assert (merged.moved, merged.joined) == (2, 0)
    assert not Server.objects.filter(pk=typo.pk).exists()
    assert sorted(RequestRecord.objects.filter(server=into).values_list("request_id", flat=True)) == [
        "req-a", "req-b", "req-c",
    ]  # fmt: skip
    rollups = MinuteRollup.objects.filter(server=into, minute__gte=now - timedelta(minutes=10))
    assert sorted(rollups.values_list("requests", "prompt_tokens", "cached_tokens")) == [
        (1, 200, 64), (1, 300, 0),
    ]  # fmt: skip


def test_a_request_the_registered_server_recorded_too_fills_its_gaps_once() -> None:
    into, typo = registered(), proposed()
    at = timezone.now() - timedelta(minutes=5)
    # The gateway's record under the real name; the span of the same request, seconds later, under
    # the typo. They are one request: merged into one row, whose known values stay.
    record(into, "req-1", at, source="gateway", prompt_tokens=120, cached_tokens=96, tenant="acme")
    record(
        typo,
        "req-1",
        at + timedelta(seconds=2),
        prompt_tokens=999,
        tenant="",
        queue_seconds=0.25,
        trace_id="ab" * 16,
        block_hashes=[1, 2, 3],
    )
    record(typo, "req-1", at + timedelta(hours=2))  # the same id much later: another request

    merged = merge_server(server_id=typo.pk, into_id=into.pk)

    assert (merged.moved, merged.joined) == (1, 1)
    joined = RequestRecord.objects.get(server=into, request_id="req-1", arrived_at=at)
    assert (joined.source, joined.prompt_tokens, joined.cached_tokens, joined.tenant) == (
        "gateway",
        120,
        96,
        "acme",
    )
    assert (joined.queue_seconds, joined.trace_id, joined.block_hashes) == (0.25, "ab" * 16, [1, 2, 3])
    assert RequestRecord.objects.filter(server=into, request_id="req-1").count() == 2


def test_a_merge_adds_the_refused_input_to_the_registered_servers_tallies() -> None:
    into, typo = registered(), proposed()
    early, late = timezone.now() - timedelta(days=1), timezone.now()
    for server, count, seen in ((into, 3, late), (typo, 4, early)):
        RejectedInput.objects.create(
            server=server,
            source="otlp",
            reason="cached_tokens: above prompt_tokens",
            count=count,
            first_seen_at=seen,
            last_seen_at=seen,
        )
    RejectedInput.objects.create(
        server=typo, source="rest", reason="model: too long", count=1, first_seen_at=late, last_seen_at=late
    )

    merge_server(server_id=typo.pk, into_id=into.pk)

    tallies = {(r.source, r.count, r.first_seen_at, r.last_seen_at) for r in RejectedInput.objects.all()}
    assert tallies == {("otlp", 7, early, late), ("rest", 1, late, late)}


@pytest.mark.parametrize("case", ["into itself", "into a proposed server", "a registered server"])
def test_a_merge_needs_a_proposed_server_and_a_registered_one(case: str) -> None:
    typo, other, real = proposed(), proposed("vllm-1-typo"), registered()
    record(typo, "req-1", timezone.now())
    server_id, into_id = {
        "into itself": (typo.pk, typo.pk),
        "into a proposed server": (typo.pk, other.pk),
        "a registered server": (real.pk, typo.pk),
    }[case]
    with pytest.raises(ServerStateError):
        merge_server(server_id=server_id, into_id=into_id)
    assert Server.objects.count() == 3
    assert RequestRecord.objects.get().server_id == typo.pk


def test_a_server_merged_meanwhile_is_a_state_error() -> None:
    typo, real = proposed(), registered()
    merge_server(server_id=typo.pk, into_id=real.pk)
    with pytest.raises(ServerStateError):
        merge_server(server_id=typo.pk, into_id=real.pk)
    with pytest.raises(ServerStateError):
        accept_server(server_id=typo.pk, base_url="http://a:8000")


def test_a_merged_source_stays_merged_its_later_spans_land_on_the_registered_server() -> None:
    into = registered()
    now = timezone.now().replace(microsecond=0)

    def spans(*request_ids: str, at: datetime) -> None:
        # vLLM's spans without a prefixscope.server attribute: named after the ingest token (otlp.py)
        facts = [RequestFacts(request_id=r, arrived_at=at, server_ttft_seconds=0.05) for r in request_ids]
        ingest_request_records(facts, source="otlp", now=now, default_server="demo-fleet")

    spans("req-a", at=now - timedelta(minutes=2))
    token_server = Server.objects.get(name="demo-fleet", state=Server.State.PROPOSED)
    merge_server(server_id=token_server.pk, into_id=into.pk)

    spans("req-b", at=now - timedelta(minutes=1))

    assert not Server.objects.filter(name="demo-fleet").exists()
    assert set(RequestRecord.objects.values_list("server__name", "request_id")) == {
        ("vllm-0", "req-a"),
        ("vllm-0", "req-b"),
    }
