"""Hosted-API causes against what the simulator injected (simulator/hosted.py): its records sent
through the real REST ingest (Anthropic and Bedrock shapes) and OTLP GenAI spans (OpenAI), then
diagnosed; the confusion table (requests by injected and found cause) is printed, and must be
diagonal: each injected request is found with its cause, and no other cause is found. The sessions
lasting more than an hour are in it (a 1-hour TTL lapsed), and the 1-hour writes read or missed within
their hour (found lapsed if their TTL were taken as the default 5 minutes). So is the part-change
scenario, its records carrying the request body they sent (REST) or its content (spans), with or
without their content blocks' digests: each part changed is found as that part, and Anthropic's
cache_miss_reason says it."""

import json
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.db.models import Sum
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from app.api.services import create_ingest_token
from app.dashboard.metrics.traffic import start_of_day
from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.domain.hostedshapes import Outcome, anthropic_shape
from app.domain.misses import Cause, RequestPart
from app.traffic.models import LossMinute, RequestDiagnosis, RequestRecord
from simulator.hosted import HIT, HostedRequest, hosted_traffic, part_change_traffic
from simulator.hosted_report import otlp_export

pytestmark = pytest.mark.django_db


def send(client: Client, token: str, requests: list[HostedRequest]) -> None:
    auth = {"Authorization": f"Bearer {token}"}
    rest = [request.record for request in requests if not request.over_otlp]
    answer = client.post("/api/v1/requests", json.dumps(rest), content_type="application/json", headers=auth)
    assert answer.status_code == 200, answer.content
    spans = otlp_export([request for request in requests if request.over_otlp])
    answer = client.post("/v1/traces", spans, content_type="application/x-protobuf", headers=auth)
    assert answer.status_code == 200, answer.content


def found_cause(diagnosis: RequestDiagnosis) -> str:
    if diagnosis.unknown:
        return diagnosis.unknown
    return HIT if diagnosis.cause in ("", "new_content") else diagnosis.cause


def confusion(rows: Counter[tuple[str, str]]) -> str:
    found = sorted({f for _, f in rows})
    lines = ["injected \\ found".ljust(20) + "".join(name[:16].rjust(17) for name in found)]
    for injected in sorted({i for i, _ in rows}):
        lines.append(injected.ljust(20) + "".join(str(rows[injected, f]).rjust(17) for f in found))
    return "\n".join(lines)


def test_each_injected_hosted_cause_is_found(client: Client) -> None:
    now = timezone.now()
    requests = hosted_traffic(start=now - timedelta(hours=3), sessions=4, hour_long=True)
    send(client, create_ingest_token(name="hosted-apps"), requests)
    assert RequestRecord.objects.count() == len(requests)
    written_for_an_hour = RequestRecord.objects.filter(cache_ttl_seconds=3600).count()
    assert written_for_an_hour == 4 * 3  # the ttl_1h sessions' first write, both of ttl_1h_lapsed's
    forget_kept_replay()
    with override_settings(PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS=0, PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES=240):
        diagnose_requests(now=now)
    injected = {request.record["request_id"]: request.injected for request in requests}
    rows = Counter(
        (injected[d.request_id.removeprefix("chatcmpl-")], found_cause(d))
        for d in RequestDiagnosis.objects.all()
    )
    print("\n" + confusion(rows))  # noqa: T201
    assert sum(rows.values()) == len(requests)
    assert {pair: n for pair, n in rows.items() if pair[0] != pair[1]} == {}


def test_semantic_cache_answers_are_counted_apart_never_as_reuse(client: Client) -> None:
    # /metrics counts since midnight UTC: the traffic starts after it (run just past midnight, the
    # requests that would arrive after now are not sent).
    now = timezone.now()
    start = max(now - timedelta(hours=1), start_of_day(now))
    sent = hosted_traffic(start=start, sessions=1)
    requests = [r for r in sent if datetime.fromisoformat(r.record["arrived_at"]) <= now]
    send(client, create_ingest_token(name="hosted-apps"), requests)
    forget_kept_replay()
    with override_settings(PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS=0, PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES=180):
        diagnose_requests(now=now)
    answered = sum(request.injected == "gateway_cache" for request in requests)
    assert LossMinute.objects.aggregate(n=Sum("gateway_cache_hits"))["n"] == answered
    gateway = RequestDiagnosis.objects.filter(unknown="gateway_cache")
    assert gateway.count() == answered and not gateway.filter(reused_tokens__gt=0).exists()
    families = text_string_to_metric_families(client.get("/metrics").content.decode())
    served = {s.labels["server"]: s.value for f in families for s in f.samples
              if s.name == "prefixscope_server_gateway_cache_answers_total"}  # fmt: skip
    assert served.get("openai-api") == answered


def found_part(diagnosis: RequestDiagnosis) -> str:
    """The part found for a prompt change, else the cause (a hit: HIT)."""
    if diagnosis.cause == "prompt_changed" and diagnosis.changed_part:
        return diagnosis.changed_part
    return found_cause(diagnosis)


@pytest.mark.parametrize("body_only", [False, True], ids=["with block digests", "body only"])
def test_each_part_changed_in_rest_and_span_traffic_is_found_as_that_part(
    client: Client, body_only: bool
) -> None:
    """Also from records that send only their body (or span content): their content blocks, and
    Claude's markers, come from it."""
    now = timezone.now()
    requests = part_change_traffic(start=now - timedelta(hours=1), body_only=body_only)
    send(client, create_ingest_token(name="hosted-apps"), requests)
    assert RequestRecord.objects.exclude(part_digests=None).count() == len(requests)
    stored = str(list(RequestRecord.objects.values_list("part_digests", flat=True)))
    assert "support desk" not in stored and "parcel" not in stored  # digests, never the text
    forget_kept_replay()
    with override_settings(PREFIXSCOPE_DIAGNOSIS_DELAY_SECONDS=0, PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES=120):
        diagnose_requests(now=now)
    by_id = {r.record["request_id"]: r for r in requests}
    rows: Counter[tuple[str, str]] = Counter()
    for d in RequestDiagnosis.objects.all():
        sent = by_id[d.request_id.removeprefix("chatcmpl-")]
        rows[("otlp " if sent.over_otlp else "rest ") + (sent.injected or "cold"), found_part(d)] += 1
    print("\n" + confusion(rows))  # noqa: T201
    expected = {"cold": "cold", "messages": HIT}
    assert sum(rows.values()) == len(requests)
    assert {pair: n for pair, n in rows.items() if expected.get(pair[0][5:], pair[0][5:]) != pair[1]} == {}
    tools = RequestDiagnosis.objects.filter(changed_part="tools").order_by("part_detail")
    assert list(tools.values_list("part_detail", flat=True)) == ["added", "added", "reordered", "reordered"]
    shapes = {d.changed_part: anthropic_shape(Outcome(True, Cause(d.cause), RequestPart(d.changed_part), 1))
              for d in RequestDiagnosis.objects.exclude(changed_part="")}  # fmt: skip
    reasons = {part: shape.cache_miss_reason for part, shape in shapes.items()}
    assert reasons == {"system": "system_changed", "tools": "tools_changed", "history": "messages_changed"}
