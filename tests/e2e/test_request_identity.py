"""One request is one record, whichever sources saw it: the real vLLM server's spans and the gateway's
records of the same requests join under the canonical request id, and keep both TTFTs.

Completions and chats, streamed and not, with and without the client's X-Request-Id (ids ending in
`-<digits>`, as `h2-0002`, once became `chatcmpl-h2` and merged into one another), and a completion
with n = 2 (vLLM sends one span per sample, all with the same id). Every request carries this run's
own cache salt, so none meets the blocks another test left.
"""

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.traffic.models import RequestRecord
from app.traffic.services.requests import ingest_request_records
from collectors.records import canonical_engine_request_id
from tests.support.captures import load_json
from tests.support.otlp_receiver import OTLPReceiver, attributes
from tests.support.running_gateway import KeptRecords, call, running_gateway, wait_for
from tests.support.vllm_cpu import VLLMServer

pytestmark = [pytest.mark.vllm, pytest.mark.django_db, pytest.mark.timeout(1800)]
PROMPT = load_json("completion-salt-a-1.json")["request"]["prompt"]
SALT = f"identity-{uuid.uuid4().hex}"
RUN = uuid.uuid4().hex[:6]


def sent(
    *, chat: bool, stream: bool, request_id: str | None, **fields: Any
) -> tuple[str, dict[str, Any], dict[str, str]]:
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 3, "temperature": 0, "cache_salt": SALT, **fields}
    if chat:
        body["messages"] = [{"role": "system", "content": PROMPT[:500]}, {"role": "user", "content": "Hi"}]
    else:
        body.setdefault("prompt", PROMPT)
    if stream:
        body |= {"stream": True, "stream_options": {"include_usage": True}}
    headers = {"Content-Type": "application/json"} | ({"X-Request-Id": request_id} if request_id else {})
    return ("/v1/chat/completions" if chat else "/v1/completions"), body, headers


TRAFFIC = [
    sent(chat=True, stream=False, request_id=f"h2-{RUN}-0002"),
    sent(chat=True, stream=True, request_id=f"h2-{RUN}-0003"),
    sent(chat=True, stream=False, request_id=None),
    sent(chat=False, stream=False, request_id=f"ho-{RUN}-0000"),
    sent(chat=False, stream=True, request_id=f"ho-{RUN}-0001"),
    sent(chat=False, stream=False, request_id=None),
    sent(chat=False, stream=False, request_id=f"n2-{RUN}-0000", n=2, seed=1, temperature=1),
    sent(chat=False, stream=False, request_id=f"mp-{RUN}-0000", prompt=[PROMPT, PROMPT[:300]]),
]
REQUESTS = len(TRAFFIC) + 1  # the call with two prompts is two requests to vLLM
SPANS = REQUESTS + 1  # and the n = 2 request has a span per sample


def export_of(spans: list[Any]) -> bytes:
    export = ExportTraceServiceRequest()
    export.resource_spans.add().scope_spans.add().spans.extend(spans)
    return bytes(export.SerializeToString())


def test_gateway_records_and_vllm_spans_of_one_request_are_one_record_with_both_ttfts(
    real_vllm: VLLMServer, otlp_receiver: OTLPReceiver, client: Client
) -> None:
    server = Server.objects.create(name="vllm-cpu", base_url=real_vllm.base_url, block_size=32)
    token = create_ingest_token(name="vllm-cpu")
    recorder = KeptRecords()
    with running_gateway(real_vllm.base_url, recorder) as gateway:
        for path, body, headers in TRAFFIC:
            assert call("POST", gateway + path, body, headers).status == 200
        wait_for(lambda: len(recorder.records) == REQUESTS)
    ids = {facts.request_id for facts in recorder.records}
    assert len(ids) == REQUESTS
    assert {f"h2-{RUN}-0002", f"h2-{RUN}-0003", f"ho-{RUN}-0000", f"n2-{RUN}-0000"} <= ids  # the client's
    assert {f"mp-{RUN}-0000", f"mp-{RUN}-0000#1"} <= ids  # prompt 0 and prompt 1 of one call

    def ours(spans: list[Any]) -> list[Any]:
        return [
            span for span in spans if span.name == "llm_request"
            and canonical_engine_request_id(str(attributes(span)["gen_ai.request.id"])) in ids
        ]  # fmt: skip

    spans = ours(otlp_receiver.wait_for(lambda spans: len(ours(spans)) >= SPANS, timeout=60))
    assert len(spans) == SPANS
    ingest_request_records(
        recorder.records[:3], source="gateway", now=timezone.now(), default_server="vllm-cpu"
    )
    response = client.post(
        "/v1/traces",
        export_of(spans),
        content_type="application/x-protobuf",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 200
    # Half the gateway's records after the spans, as a slower source's would be.
    ingest_request_records(
        recorder.records[3:], source="gateway", now=timezone.now(), default_server="vllm-cpu"
    )

    records = {r.request_id: r for r in RequestRecord.objects.filter(server=server)}
    assert sorted(records) == sorted(ids)  # one record per request, nothing else
    for facts in recorder.records:
        record = records[facts.request_id]
        assert record.cached_tokens == facts.cached_tokens and record.prompt_tokens == facts.prompt_tokens
        # Prompts of one call: the answer's usage is their sum, so their cached tokens are unknown.
        assert (facts.cached_tokens is None) == facts.request_id.startswith("mp-")
        assert record.client_ttft_seconds == facts.client_ttft_seconds
        assert record.server_ttft_seconds is not None and record.server_ttft_seconds > 0
        assert abs(record.arrived_at - facts.arrived_at) < timedelta(seconds=5)
        assert len(record.block_hashes) == (facts.prompt_tokens or 0) // 32
