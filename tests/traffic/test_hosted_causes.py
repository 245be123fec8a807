"""Hosted-API causes against what the simulator injected (simulator/hosted.py): its records sent
through the real REST ingest (Anthropic and Bedrock shapes) and OTLP GenAI spans (OpenAI), then
diagnosed; the confusion table (requests by injected and found cause) is printed, and must be
diagonal: each injected request is found with its cause, and no other cause is found. The sessions
lasting more than an hour are in it (a 1-hour TTL lapsed), and the 1-hour writes read or missed within
their hour (found lapsed if their TTL were taken as the default 5 minutes)."""

import json
from collections import Counter
from datetime import timedelta

import pytest
from django.db.models import Sum
from django.test import Client, override_settings
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from app.api.services import create_ingest_token
from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.traffic.models import LossMinute, RequestDiagnosis, RequestRecord
from simulator.hosted import HIT, HostedRequest, hosted_traffic
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
    now = timezone.now()
    requests = hosted_traffic(start=now - timedelta(hours=1), sessions=1)
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
