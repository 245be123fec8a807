from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.traffic.models import KVGap, KVStream, RejectedInput
from app.traffic.services.rejections import Sample, keep_undecodable_samples
from collectors.errors import RejectReason
from tests.support.factories import a_server
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db


def test_the_collection_page_shows_lost_batches_and_refused_input_per_server(client: Client) -> None:
    client.force_login(fleet_viewer("engineer"))
    now = timezone.now()
    heard = a_server(name="vllm-heard", last_scraped_at=now)
    lossy = a_server(name="vllm-lossy", state=Server.State.DOWN)
    KVStream.objects.create(server=heard, last_seq=41, last_event_at=now - timedelta(seconds=5))
    KVGap.objects.create(server=lossy, epoch=1, first_seq=7, last_seq=9, recovered=1, lost=2, detected_at=now)
    RejectedInput.objects.create(
        server=lossy,
        source="kv_events",
        reason="kv_field_invalid",
        detail="BlockStored.block_hashes: expected a list of uint64",
        count=4,
        first_seen_at=now,
        last_seen_at=now,
    )

    html = client.get("/collection/").content.decode()

    lossy_row = html[html.index("vllm-lossy") : html.index("</tr>", html.index("vllm-lossy"))]
    assert '<td class="num bad">2</td>' in lossy_row and '<td class="num bad">4</td>' in lossy_row
    heard_row = html[html.index("vllm-heard") : html.index("</tr>", html.index("vllm-heard"))]
    assert "ago" in heard_row and '<td class="num">0</td>' in heard_row
    assert "BlockStored.block_hashes: expected a list of uint64" in html
    assert "7\u20139" in html  # an en dash between the first and last missing sequence numbers


def test_the_server_page_shows_its_rejections_and_undecodable_samples_to_staff_only(client: Client) -> None:
    now = timezone.now()
    server = a_server(name="vllm-bad")
    RejectedInput.objects.create(
        server=server, source="kv_events", reason="kv_unknown_type",
        detail="event: unknown type 'BlockMoved'", count=3, first_seen_at=now, last_seen_at=now,
    )  # fmt: skip
    heads = [bytes([0x82, 0xA4, n]) for n in range(5)]
    keep_undecodable_samples(
        [
            Sample(server.pk, RejectReason.KV_UNKNOWN_TYPE, h, now + timedelta(seconds=i))
            for i, h in enumerate(heads)
        ],
        now=now,
    )

    client.force_login(fleet_viewer("engineer"))
    html = client.get("/servers/vllm-bad/").content.decode()
    section = html[html.index('id="collection-health"') :]
    assert (
        "<code>kv_unknown_type</code>" in section and "event: unknown type &#x27;BlockMoved&#x27;" in section
    )
    assert "undecodable-samples" not in section  # raw bytes can hold token ids: not for every viewer

    client.force_login(fleet_viewer("staff", is_staff=True))
    section = client.get("/servers/vllm-bad/").content.decode().split('id="collection-health"')[1]
    assert [f"82 a4 0{n}" in section for n in range(5)] == [False, False, True, True, True]  # the newest 3
