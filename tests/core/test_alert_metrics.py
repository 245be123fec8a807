"""What Prefixscope's /metrics gives the alert rules so that they wake the right owner and stay quiet on
a cold start: owners, server sizes, counters at zero before their first event, baselines from rollups."""

from datetime import datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.prompts.models import Template, TemplateRepository
from app.regressions.models import Regression
from app.traffic.models import KVGap, LossHour
from tests.core.test_own_metrics import samples
from tests.support.factories import a_server

pytestmark = pytest.mark.django_db


def test_kv_gap_counters_start_at_zero_for_every_server_with_a_kv_stream(client: Client) -> None:
    streamed = a_server(name="s-0", kv_events_endpoint="tcp://a:5557")
    a_server(name="s-1")  # no KV events: no stream to gap
    before = samples(client)
    for family in ("gaps", "batches_replayed", "batches_lost"):
        assert before[(f"prefixscope_kv_event_{family}_total", (("server", "s-0"),))] == 0.0
        assert (f"prefixscope_kv_event_{family}_total", (("server", "s-1"),)) not in before

    now = timezone.now()
    KVGap.objects.create(
        server=streamed, epoch=0, first_seq=5, last_seq=9, recovered=3, lost=2, detected_at=now
    )
    after = samples(client)
    assert after[("prefixscope_kv_event_gaps_total", (("server", "s-0"),))] == 1.0
    assert after[("prefixscope_kv_event_batches_lost_total", (("server", "s-0"),))] == 2.0


def test_servers_say_their_owner_group_and_kv_blocks(client: Client) -> None:
    Server.objects.create(
        name="s-0", base_url="http://a:8000", model="tiny", group="gpu-east", num_gpu_blocks=256
    )
    a_server(name="s-1")
    values = samples(client)
    info = "prefixscope_server_owner_info"
    assert values[
        (info, (("model", "tiny"), ("owner", "gpu-east"), ("owner_kind", "platform"), ("server", "s-0")))
    ]
    assert values[
        (info, (("model", "tiny"), ("owner", "platform"), ("owner_kind", "platform"), ("server", "s-1")))
    ]
    assert values[("prefixscope_server_kv_blocks", (("model", "tiny"), ("server", "s-0")))] == 256
    assert ("prefixscope_server_kv_blocks", (("model", "tiny"), ("server", "s-1"))) not in values


def _regression(kind: str, scope: str, **where: Any) -> Regression:
    now = timezone.now()
    return Regression.objects.create(
        scope=scope,
        kind=kind,
        changed_at=now,
        detected_at=now,
        updated_at=now,
        rate_before=0.9,
        rate_after=0.1,
        rate_now=0.1,
        requests_before=100,
        requests_after=100,
        confidence=0.999,
        **where,
    )


def test_a_regression_is_owned_by_whoever_can_fix_its_cause(client: Client) -> None:
    repository = TemplateRepository.objects.create(
        name="acme/prompts", location="/srv/prompts", globs=["*.j2"]
    )
    support = Template.objects.create(name="support", repository=repository)
    loose = Template.objects.create(name="loose")
    server = a_server(name="s-3", group="gpu-east")
    _regression("template_commit", scope="template", template=support)
    _regression("unknown", scope="template", template=loose)
    _regression("capacity", scope="template_server", template=support, server=server)
    _regression("capacity", scope="fleet")
    owners = {
        (labels["name"], labels["kind"]): (labels["owner_kind"], labels["owner"])
        for (name, key), value in samples(client).items()
        if name == "prefixscope_regression_active"
        for labels in [dict(key)]
    }
    assert owners == {
        ("support", "template_commit"): ("template", "acme/prompts"),
        ("loose", "unknown"): ("template", "unowned"),
        ("support on s-3", "capacity"): ("platform", "gpu-east"),
        ("fleet", "capacity"): ("platform", "platform"),
    }


def test_baselines_come_from_the_hour_rollups_before_the_last_half_hour(client: Client) -> None:
    server = a_server(name="s-0")
    support = Template.objects.create(name="support")
    recent = (timezone.now() - timedelta(minutes=30)).replace(minute=0, second=0, microsecond=0)

    def hour(at: datetime, reused: int, prompt: int = 1000) -> None:
        LossHour.objects.create(
            server=server,
            template=support,
            tenant="acme",
            hour=at,
            requests=10,
            diagnosed=10,
            prompt_tokens=prompt,
            diagnosed_prompt_tokens=prompt,
            reused_tokens=reused,
        )

    hour(recent, reused=0)  # the hour of the last half hour's start: not in the baseline
    hour(recent - timedelta(hours=1), reused=900)
    hour(recent - timedelta(hours=6), reused=700)
    hour(recent - timedelta(hours=7), reused=0)  # older than six hours
    values = samples(client)
    assert values[("prefixscope_template_baseline_hit_ratio", (("template", "support"),))] == 0.8
    assert values[("prefixscope_template_baseline_prompt_tokens", (("template", "support"),))] == 2000
    assert values[("prefixscope_tenant_baseline_hit_ratio", (("tenant", "acme"),))] == 0.8


def test_no_history_gives_no_baseline(client: Client) -> None:
    server = a_server(name="s-0")
    support = Template.objects.create(name="support")
    LossHour.objects.create(
        server=server,
        template=support,
        tenant="acme",
        hour=timezone.now(),
        requests=1,
        diagnosed=1,
        prompt_tokens=100,
        diagnosed_prompt_tokens=100,
        reused_tokens=90,
    )
    values = samples(client)
    assert not any(name.endswith("_baseline_hit_ratio") for name, _ in values)
