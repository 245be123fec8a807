"""No label of /metrics carries free text: each takes its values from a bounded set (enum members,
registered servers and templates, top-N tenants...). A label of free text makes a series per message,
and Prometheus keeps every one of them."""

from collections.abc import Callable

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from app.dashboard.metrics.hit_blocks import STATES as HIT_COUNTER_STATES
from app.dashboard.metrics.tiers import UNITS
from app.domain.histogram import TTFT_BUCKETS_SECONDS
from app.fleet.models import Server
from app.prompts.models import CacheKiller, Template, TemplateRepository, TemplateVersion
from app.regressions.models import Regression
from app.regressions.owners import DEFAULT_GROUP, PLATFORM, TEMPLATE, UNOWNED
from app.traffic.models import CollectorProcess, LossHour, RejectedInput, RequestDiagnosis, RequestRecord
from collectors.errors import RejectReason
from collectors.metrics.names import TIERS
from simulator.server import ServerConfig
from tests.support.live_stack import store_every_family

pytestmark = pytest.mark.django_db

SUMMED = {"other", "none", ""}  # past the top N, without a value, or not known


def servers() -> set[str]:
    return set(Server.objects.values_list("name", flat=True)) | SUMMED


def models() -> set[str]:
    return set(Server.objects.values_list("model", flat=True)) | SUMMED


def templates() -> set[str]:
    return set(Template.objects.values_list("name", flat=True)) | SUMMED


def digits(value: str) -> bool:
    return value.isdigit() and len(value) <= 6


def choices(*enums: type) -> Callable[[], set[str]]:
    return lambda: {str(member.value) for enum in enums for member in enum}  # type: ignore[attr-defined]


def names() -> set[str]:
    """A regression's scope label, a collector process's server or host."""
    scopes = {r.scope_label for r in Regression.objects.select_related("template", "server")}
    return (
        servers()
        | templates()
        | scopes
        | {"fleet"}
        | set(CollectorProcess.objects.values_list("name", flat=True))
    )


def tenants() -> set[str]:
    return set(LossHour.objects.values_list("tenant", flat=True)) | SUMMED


def owners() -> set[str]:
    groups = set(Server.objects.values_list("group", flat=True))
    return groups | set(TemplateRepository.objects.values_list("name", flat=True)) | {UNOWNED, DEFAULT_GROUP}


BUCKET_BOUNDS = {str(float(b)) for b in TTFT_BUCKETS_SECONDS} | {"+Inf"}

# Each label Prefixscope exports and the bounded set its values come from. A new label must be added
# here with its set: that is the point.
BOUNDS: dict[str, Callable[[], set[str]] | Callable[[str], bool]] = {
    "server": servers,
    "model": models,
    "template": templates,
    "tenant": tenants,
    "version": lambda: (
        {sha[:12] for sha in TemplateVersion.objects.values_list("commit_sha", flat=True)} | SUMMED
    ),
    "name": names,
    "process": lambda: set(CollectorProcess.objects.values_list("process", flat=True)),
    "reason": choices(RejectReason),
    "source": lambda: {*choices(RequestRecord.Source)(), "kv_events", "metrics"},
    "cause": choices(RequestDiagnosis.Cause),
    "kind": choices(CollectorProcess.Kind, CacheKiller.Kind, Regression.Kind),
    "scope": choices(Regression.Scope),
    "metric": choices(Regression.Metric),
    "state": lambda: {*choices(Regression.State)(), *HIT_COUNTER_STATES},
    "expected": lambda: {"true", "false"},
    "event": lambda: {"taken", "lost", "released"},
    "rollup": lambda: {"requests", "diagnoses"},
    "owner_kind": lambda: {TEMPLATE, PLATFORM},
    "owner": owners,
    "hash_algo": lambda: set(Server.objects.values_list("hash_algo", flat=True)),
    "block_size": digits,
    "block": digits,
    "dp_rank": digits,
    "le": lambda: BUCKET_BOUNDS,
    "tier": lambda: set(TIERS),
    "unit": lambda: set(UNITS.values()),
}


def test_every_label_value_of_metrics_comes_from_a_bounded_set(client: Client) -> None:
    now = timezone.now()
    store_every_family(ServerConfig(), now)
    server = Server.objects.get()
    for code in (RejectReason.FIELD_INVALID, RejectReason.BUSY):
        RejectedInput.objects.create(
            server=server, source="rest", reason=code, detail=f"{code}: a message that varies {now}",
            count=1, first_seen_at=now, last_seen_at=now,
        )  # fmt: skip

    text = client.get("/metrics").content.decode()
    labels: dict[str, set[tuple[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, value in sample.labels.items():
                labels.setdefault(name, set()).add((family.name, value))
    assert "a message that varies" not in text
    for name, seen in labels.items():
        assert name in BOUNDS, f"label {name!r} ({sorted(seen)[:3]}) has no bounded set in BOUNDS"
        bound = BOUNDS[name]
        for exported, value in seen:
            allowed = bound(value) if bound.__code__.co_argcount else value in bound()  # type: ignore[call-arg, operator]
            assert allowed, f"{exported}{{{name}={value!r}}} is outside its bounded set"
