"""Which request part changed, on the real vLLM CPU server: the part-change scenario
(simulator/part_changes.py: tools reordered, a chat-template argument, the system edited, a tool added,
the history compacted, thinking turned off, a LoRA adapter swapped in) through the gateway, stored,
diagnosed, and read back in the API's own fields and in OpenAI's and Anthropic's shapes; and where
the gateway learned, from the real /tokenize, that each part starts.

The server is the recipe's (tests/support/vllm_cpu.py) with the LoRA adapter of test_lora_vllm.py and
`--chat-template` of gpt2.PARTS_CHAT_TEMPLATE, which renders the tools and the reasoning effort at the
top as real models' templates do, and thinking turned off after the latest message as Qwen3's does
(the tiny model's own ChatML template renders messages only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.domain.gpt2 import PARTS_CHAT_TEMPLATE
from app.fleet.services import register_server
from app.traffic.collection.gateway_writer import GatewayWriter
from app.traffic.models import RequestDiagnosis, RequestRecord
from app.traffic.tasks import scrape_server
from simulator.part_changes import part_change_steps
from tests.support.running_gateway import call, running_gateway
from tests.support.users import fleet_viewer
from tests.support.vllm_cpu import (
    DATA_DIR,
    LORA_DIR,
    SERVED_MODEL_NAME,
    VLLMServer,
    VLLMUnavailable,
    build_lora_adapter,
    build_model,
    install,
    serve,
)
from tests.traffic.test_part_changes import (
    assert_starts_where_their_parts_render,
    confusion,
    expected,
    found_part,
)

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True), pytest.mark.timeout(1800)]

ADAPTER = "support-lora"
TEMPLATE_FILE = DATA_DIR / "parts-chat-template.jinja"
FLAGS = ("--enable-lora", "--lora-modules", f"{ADAPTER}={LORA_DIR.relative_to(DATA_DIR)}", "--max-lora-rank",
         "8", "--max-loras", "1", "--chat-template", str(TEMPLATE_FILE))  # fmt: skip
# What each part maps to in the hosted shapes (app/domain/hostedshapes.py).
SHAPES = {
    "tools": ("tools_changed", "tools_changed"),
    "reasoning_effort": ("reasoning_effort_changed", "messages_changed"),
    "system": ("input_changed", "system_changed"),
    "history": ("context_compacted", "messages_changed"),
    "adapter": ("model_changed", "model_changed"),
}


@pytest.fixture(scope="module")
def parts_vllm() -> Iterator[VLLMServer]:
    stack = contextlib.ExitStack()
    try:
        install()
        build_model()
        build_lora_adapter()
        TEMPLATE_FILE.write_text(PARTS_CHAT_TEMPLATE)
        server = stack.enter_context(serve(extra_flags=FLAGS, log_path=DATA_DIR / "server-parts.log"))
    except VLLMUnavailable as exc:
        pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")
    with stack:
        yield server


def test_each_part_change_is_diagnosed_with_its_part_and_its_hosted_reasons(
    parts_vllm: VLLMServer, tmp_path: Path, client: Client
) -> None:
    server = register_server(
        name="vllm-parts", base_url=parts_vllm.base_url, metrics_url=parts_vllm.metrics_url
    )
    scrape_server(server.pk)  # block size, model and the adapter
    steps = part_change_steps(per_phase=2, model=SERVED_MODEL_NAME, adapter=ADAPTER)
    writer = GatewayWriter(server="vllm-parts", spill_path=tmp_path / "spill.jsonl", flush_seconds=0.05)
    writer.start()
    with running_gateway(parts_vllm.base_url, writer) as gateway:
        for step in steps:
            headers = {"Content-Type": "application/json", "X-Prefixscope-Template": "support"}
            answer = call("POST", gateway + "/v1/chat/completions", step.body, headers)
            assert answer.status == 200, answer.body
    writer.stop()
    diagnose_requests(now=timezone.now() + timedelta(minutes=5))
    records = list(RequestRecord.objects.order_by("arrived_at").values_list("request_id", flat=True))
    diagnoses = {d.request_id: d for d in RequestDiagnosis.objects.all()}
    pairs = [(step.injected, found_part(diagnoses[r])) for step, r in zip(steps, records, strict=True)]
    print("\n" + confusion(pairs))  # noqa: T201
    assert [(n, pair) for n, pair in enumerate(pairs) if pair[1] != expected(pair[0])] == []
    # The part starts the gateway learned from the real /tokenize, where the template renders each part.
    stored = RequestRecord.objects.order_by("arrived_at")
    for step, record in zip(steps, stored, strict=True):
        assert_starts_where_their_parts_render(step.body, record.part_digests["starts"], record.token_ids)

    client.force_login(fleet_viewer("engineer"))
    for (injected, as_read), request_id in zip(pairs[1:], records[1:], strict=True):
        found = client.get(f"/api/v1/requests/vllm-parts/{request_id}/diagnosis").json()
        openai, anthropic = found["prompt_cache_diagnostics"], found["anthropic_diagnostics"]
        if as_read == "new_content":  # its own new question: a hit of all it could reuse
            assert (openai["type"], anthropic["cache_miss_reason"]) == ("cache_hit", None), request_id
            continue
        assert (found["changed_part"], openai["reason"], anthropic["cache_miss_reason"]) == (
            injected, *SHAPES[injected],
        ), request_id  # fmt: skip
        assert openai["type"] == "cache_miss" and openai["cache_missed_tokens"] > 0
        assert openai["comparison_request_id"] in records
