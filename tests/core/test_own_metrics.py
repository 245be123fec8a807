"""Prefixscope's own /metrics reports, from the database's rollups, what it found (reuse and losses by
cause, TTFT, cache killers) and how its collectors fare, the same from any process."""

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from app.fleet.models import Server
from app.prompts.models import CacheKiller, Template
from app.traffic.collection.kv_leases import Leases
from app.traffic.collection.processes import (
    LeaseCounts,
    forget_collector_process,
    report_collector_process,
)
from app.traffic.models import (
    CollectorProcess,
    HourRollup,
    KVGap,
    KVStream,
    LossHour,
    MinuteRollup,
    RejectedInput,
)
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db


def samples(client: Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = client.get("/metrics").content.decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_own_metrics_count_what_was_collected_and_what_was_not(client: Client) -> None:
    now = timezone.now()
    up = a_server(name="vllm-up")
    down = Server.objects.create(
        name="vllm-down", base_url="http://b:8000", model="tiny", state=Server.State.DOWN
    )
    # Named by a hosted-API usage report, never registered: Prefixscope does not pull it.
    Server.objects.create(name="anthropic-api", base_url="", model="", state=Server.State.PROPOSED)
    RejectedInput.objects.create(
        server=up, source="kv_events", reason="kv_not_msgpack", count=3, first_seen_at=now, last_seen_at=now
    )
    KVGap.objects.create(server=down, epoch=0, first_seq=5, last_seq=9, recovered=3, lost=2, detected_at=now)
    KVGap.objects.create(
        server=down, epoch=0, first_seq=20, last_seq=20, recovered=0, lost=1, detected_at=now
    )

    values = samples(client)

    assert values[("prefixscope_server_up", (("model", "tiny"), ("server", "vllm-up")))] == 1.0
    assert values[("prefixscope_server_up", (("model", "tiny"), ("server", "vllm-down")))] == 0.0
    assert ("prefixscope_server_up", (("model", ""), ("server", "anthropic-api"))) not in values  # not pulled
    reason = (("reason", "kv_not_msgpack"), ("server", "vllm-up"), ("source", "kv_events"))
    assert values[("prefixscope_rejected_inputs_total", reason)] == 3.0
    assert values[("prefixscope_kv_event_batches_lost_total", (("server", "vllm-down"),))] == 3.0


NOW = timezone.now()
TODAY = NOW.replace(minute=0, second=0, microsecond=0)


def loss_hour(server: Server, template: Template | None, tenant: str, **tokens: int) -> LossHour:
    prompt = tokens.pop("prompt", 1000)
    return LossHour.objects.create(
        server=server,
        template=template,
        tenant=tenant,
        hour=TODAY,
        requests=10,
        diagnosed=10,
        prompt_tokens=prompt,
        diagnosed_prompt_tokens=prompt,
        **tokens,
    )


@pytest.fixture
def fleet() -> tuple[Server, Server]:
    return (
        a_server(name="vllm-0", model="llama"),
        a_server(name="vllm-1", model="llama"),
    )


def test_reused_and_lost_tokens_are_summed_per_template_server_and_tenant(
    client: Client, fleet: tuple[Server, Server]
) -> None:
    support = Template.objects.create(name="support")
    a, b = fleet
    loss_hour(a, support, "acme", reused_tokens=600, evicted_tokens=300, seen_before_tokens=900)
    loss_hour(b, support, "acme", reused_tokens=100, prompt_changed_tokens=800, seen_before_tokens=900)
    loss_hour(b, None, "", prompt=50, cold_tokens=50)
    # Yesterday's hours are not in today's counters.
    LossHour.objects.create(
        server=a,
        template=support,
        tenant="acme",
        hour=TODAY - timedelta(days=1),
        requests=5,
        diagnosed=5,
        diagnosed_prompt_tokens=10_000,
        reused_tokens=10_000,
    )

    values = samples(client)

    assert values[("prefixscope_template_prompt_tokens_total", (("template", "support"),))] == 2000
    assert values[("prefixscope_template_reused_tokens_total", (("template", "support"),))] == 700
    assert values[("prefixscope_template_shared_prefix_tokens_total", (("template", "support"),))] == 1800
    lost = "prefixscope_template_lost_tokens_total"
    assert values[(lost, (("cause", "evicted"), ("template", "support")))] == 300
    assert values[(lost, (("cause", "prompt_changed"), ("template", "support")))] == 800
    assert values[(lost, (("cause", "cold"), ("template", "none")))] == 50
    server = (("model", "llama"), ("server", "vllm-1"))
    assert values[("prefixscope_server_reused_tokens_total", server)] == 100
    assert values[("prefixscope_server_prompt_tokens_total", server)] == 1050
    assert values[("prefixscope_tenant_reused_tokens_total", (("tenant", "acme"),))] == 700
    assert values[("prefixscope_tenant_requests_total", (("tenant", "none"),))] == 10


def test_labels_past_the_top_n_by_traffic_are_summed_under_other(
    client: Client, fleet: tuple[Server, Server], settings: Any
) -> None:
    settings.PREFIXSCOPE_METRICS_TOP_N = 2
    for name, prompt in [("big", 5000), ("mid", 3000), ("small", 200), ("tiny", 100)]:
        loss_hour(fleet[0], Template.objects.create(name=name), "", prompt=prompt, reused_tokens=prompt // 2)

    values = samples(client)

    templates = {
        dict(labels)["template"]: value
        for (name, labels), value in values.items()
        if name == "prefixscope_template_prompt_tokens_total"
    }
    assert templates == {"big": 5000, "mid": 3000, "other": 300}
    assert values[("prefixscope_template_reused_tokens_total", (("template", "other"),))] == 150


def test_ttft_histograms_per_template_come_from_the_hour_rollups(
    client: Client, fleet: tuple[Server, Server]
) -> None:
    support = Template.objects.create(name="support")
    # Cumulative per bound of TTFT_BUCKETS_SECONDS, then the total: 2 under 0.1 s, 3 under 0.5 s, 4 in all.
    buckets = [0] * 7 + [2, 2, 3] + [3] * 12 + [4]
    for server in fleet:
        HourRollup.objects.create(
            server=server,
            template=support,
            hour=TODAY,
            requests=4,
            prompt_tokens=400,
            cached_tokens=0,
            client_ttft_count=4,
            client_ttft_sum_seconds=3.0,
            client_ttft_buckets=buckets,
            server_ttft_count=4,
            server_ttft_sum_seconds=1.0,
            server_ttft_buckets=buckets,
        )

    values = samples(client)

    family = "prefixscope_template_ttft_client_seconds"
    assert values[(family + "_bucket", (("le", "0.1"), ("template", "support")))] == 4
    assert values[(family + "_bucket", (("le", "0.5"), ("template", "support")))] == 6
    assert values[(family + "_bucket", (("le", "+Inf"), ("template", "support")))] == 8
    assert values[(family + "_count", (("template", "support"),))] == 8
    assert values[(family + "_sum", (("template", "support"),))] == 6.0
    assert values[("prefixscope_template_ttft_server_seconds_sum", (("template", "support"),))] == 2.0


def test_cache_killers_are_exported_per_template_kind_and_block(
    client: Client, fleet: tuple[Server, Server]
) -> None:
    support = Template.objects.create(name="support")
    for block, kind, lost in [(3, "timestamp", 9000), (7, "id", 400)]:
        CacheKiller.objects.create(
            template=support,
            block_size=16,
            computed_at=NOW,
            window_start=NOW - timedelta(hours=1),
            window_end=NOW,
            mode="tokens",
            position_token=block * 16,
            block_index=block,
            kind=kind,
            requests=100,
            requests_affected=90,
            continuations=100,
            tokens_lost=lost,
        )

    values = samples(client)

    killer = (("block", "3"), ("kind", "timestamp"), ("template", "support"))
    assert values[("prefixscope_cache_killer_lost_tokens", killer)] == 9000
    assert values[("prefixscope_cache_killers", (("kind", "id"), ("template", "support")))] == 1


def test_collector_health_reports_scrapes_streams_rollups_and_processes(
    client: Client, fleet: tuple[Server, Server]
) -> None:
    a, _ = fleet
    Server.objects.filter(pk=a.pk).update(last_scraped_at=NOW, scrape_interval_seconds=30)
    KVStream.objects.create(
        server=a,
        dp_rank=0,
        epoch=2,
        last_seq=40,
        last_event_at=NOW,
        blocks_stored=500,
        blocks_removed=200,
        blocks_thrashed=30,
    )
    KVGap.objects.create(server=a, epoch=2, first_seq=5, last_seq=9, recovered=5, lost=0, detected_at=NOW)
    MinuteRollup.objects.create(server=a, minute=TODAY, requests=1, prompt_tokens=1, cached_tokens=0)
    now = timezone.now()
    report_collector_process(
        kind="gateway", name="vllm-0", process="gw:7", queue_depth=12, spill_bytes=4096, now=now
    )
    report_collector_process(
        kind="kv_subscriber", name="collectors-1", process="c:8", queue_depth=300, now=now
    )

    values = samples(client)

    server = (("model", "llama"), ("server", "vllm-0"))
    assert values[("prefixscope_server_last_scrape_timestamp_seconds", server)] == NOW.timestamp()
    assert values[("prefixscope_server_scrape_interval_seconds", server)] == 30
    stream = (("dp_rank", "0"), ("server", "vllm-0"))
    assert values[("prefixscope_kv_stream_restarts_total", stream)] == 2
    assert values[("prefixscope_kv_blocks_thrashed_total", stream)] == 30
    assert values[("prefixscope_kv_blocks_removed_total", stream)] == 200
    assert values[("prefixscope_kv_event_gaps_total", (("server", "vllm-0"),))] == 1
    assert values[("prefixscope_kv_event_batches_replayed_total", (("server", "vllm-0"),))] == 5
    assert values[("prefixscope_rollup_newest_minute_timestamp_seconds", (("rollup", "requests"),))] == (
        TODAY.timestamp()
    )
    assert ("prefixscope_rollup_newest_minute_timestamp_seconds", (("rollup", "diagnoses"),)) not in values
    assert values[("prefixscope_gateway_spill_file_bytes", (("name", "vllm-0"), ("process", "gw:7")))] == 4096
    subscriber = (("kind", "kv_subscriber"), ("name", "collectors-1"), ("process", "c:8"))
    assert values[("prefixscope_collector_queue_depth", subscriber)] == 300
    assert values[("prefixscope_collector_last_report_timestamp_seconds", subscriber)] == now.timestamp()


def test_every_family_is_read_with_one_query_whatever_the_fleet_size(
    client: Client, fleet: tuple[Server, Server], django_assert_max_num_queries: Any
) -> None:
    templates = [Template.objects.create(name=f"t{i}") for i in range(30)]
    for template in templates:
        for server in fleet:
            loss_hour(server, template, f"tenant-{template.pk % 7}", reused_tokens=10)
    with django_assert_max_num_queries(22):  # one a family (or set of families from one table)
        client.get("/metrics")


def test_processes_on_one_host_are_reported_apart_with_their_leases(client: Client) -> None:
    now = timezone.now()
    for pid, held, taken, lost, released in ((101, 3, 5, 1, 2), (102, 4, 4, 0, 0)):
        report_collector_process(
            kind="kv_subscriber",
            name="host-a",
            process=f"host-a:{pid}",
            queue_depth=pid,
            now=now,
            leases=LeaseCounts(held=held, taken=taken, lost=lost, released=released),
        )

    values = samples(client)

    for pid, held, taken, lost, released in ((101, 3, 5, 1, 2), (102, 4, 4, 0, 0)):
        process = (("name", "host-a"), ("process", f"host-a:{pid}"))
        assert values[("prefixscope_collector_queue_depth", (("kind", "kv_subscriber"), *process))] == pid
        assert values[("prefixscope_kv_leases_held", process)] == held
        for event, count in (("taken", taken), ("lost", lost), ("released", released)):
            assert values[("prefixscope_kv_lease_events_total", (("event", event), *process))] == count


def test_a_silent_process_shows_as_silent_until_a_successor_starts(client: Client) -> None:
    now = timezone.now()
    killed = (("kind", "gateway"), ("name", "vllm-0"), ("process", "h:1"))
    report_collector_process(
        kind="gateway",
        name="vllm-0",
        process="h:1",
        queue_depth=8000,
        now=now - timedelta(minutes=10),
        started_at=now - timedelta(hours=1),
    )
    report_collector_process(  # another gateway of the same server, running since before the kill
        kind="gateway",
        name="vllm-0",
        process="h:2",
        queue_depth=5,
        now=now,
        started_at=now - timedelta(hours=2),
    )
    values = samples(client)
    # Its last report is there to alert on (CollectorSilent); what it held in memory is not (it is gone).
    assert (
        values[("prefixscope_collector_last_report_timestamp_seconds", killed)]
        == (now - timedelta(minutes=10)).timestamp()
    )
    assert ("prefixscope_collector_queue_depth", killed) not in values

    report_collector_process(
        kind="gateway", name="vllm-0", process="h:3", queue_depth=0, now=now
    )  # restarted
    values = samples(client)
    assert ("prefixscope_collector_last_report_timestamp_seconds", killed) not in values
    assert {
        labels for name, labels in values if name == "prefixscope_collector_last_report_timestamp_seconds"
    } == {
        (("kind", "gateway"), ("name", "vllm-0"), ("process", "h:2")),
        (("kind", "gateway"), ("name", "vllm-0"), ("process", "h:3")),
    }


def test_a_process_silent_for_a_day_is_forgotten_and_one_that_stops_withdraws_itself(client: Client) -> None:
    now = timezone.now()
    report_collector_process(
        kind="kv_subscriber", name="old", process="old:1", queue_depth=0, now=now - timedelta(days=2)
    )
    report_collector_process(kind="kv_subscriber", name="b", process="b:1", queue_depth=0, now=now)
    assert not CollectorProcess.objects.filter(name="old").exists()  # deleted by the next report
    forget_collector_process(kind="kv_subscriber", name="b", process="b:1")
    values = samples(client)
    assert not [key for key in values if key[0] == "prefixscope_collector_last_report_timestamp_seconds"]


def test_each_kv_stream_says_whether_a_subscriber_leases_it_and_each_server_its_cache_config(
    client: Client,
) -> None:
    leased = Server.objects.create(
        name="vllm-0",
        base_url="http://a:8000",
        model="llama",
        block_size=16,
        hash_algo="sha256_cbor",
        kv_events_endpoint="tcp://a:5557",
    )
    Server.objects.create(
        name="vllm-1", base_url="http://b:8000", model="llama", kv_events_endpoint="tcp://b:5557"
    )
    a_server(name="vllm-2", model="llama")  # no KV events
    leases = Leases(lease_seconds=10, name="prefixscope-kv-subscriber:test:1")
    leases.connect()
    try:
        assert leases.take([leased.pk], limit=1) == {leased.pk}
        values = samples(client)
    finally:
        leases.close()
    assert values[("prefixscope_kv_stream_leased", (("model", "llama"), ("server", "vllm-0")))] == 1
    assert values[("prefixscope_kv_stream_leased", (("model", "llama"), ("server", "vllm-1")))] == 0
    assert ("prefixscope_kv_stream_leased", (("model", "llama"), ("server", "vllm-2"))) not in values
    config = "prefixscope_server_cache_config_info"
    labels = (("block_size", "16"), ("hash_algo", "sha256_cbor"), ("model", "llama"), ("server", "vllm-0"))
    assert values[(config, labels)] == 1
    assert (
        values[(config, (("block_size", ""), ("hash_algo", ""), ("model", "llama"), ("server", "vllm-1")))]
        == 1
    )


def test_each_server_has_its_effective_block_and_one_hit_counter_state(
    client: Client, fleet: tuple[Server, Server]
) -> None:
    Server.objects.filter(pk=fleet[0].pk).update(block_size=16, stated_hit_block=3584)
    text = client.get("/metrics").content.decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    effective = {
        s.labels["server"]: s.value for s in families["prefixscope_server_effective_block_tokens"].samples
    }
    assert effective[fleet[0].name] == 3584
    states = [s for s in families["prefixscope_server_hit_counter_state"].samples if s.value == 1]
    assert sorted(s.labels["server"] for s in states) == sorted(s.name for s in fleet)
    assert {s.labels["state"] for s in states} == {"no_evidence"}  # no requests: nothing to say
