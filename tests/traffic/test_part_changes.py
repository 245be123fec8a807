"""Which request part changed, against what the part-change scenario injected (simulator/part_changes.py):
its chat requests through the gateway to a simulated vLLM serving a LoRA adapter, stored and diagnosed.
The confusion table (requests by injected part and found part or cause) is printed and must be exact:
every request found as injected. The part starts the gateway learned from /tokenize are checked
against what the scenario's template renders at each."""

from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from app.dashboard.pages.request import request_page_url
from app.diagnosis.run import diagnose_requests
from app.domain import gpt2
from app.domain.blockhash import LoraKey
from app.domain.misses import RequestPart
from app.domain.requestparts import PartChange, Parts, changed_part
from app.fleet.services import register_server
from app.traffic.collection.gateway_writer import GatewayWriter
from app.traffic.models import RequestDiagnosis, RequestRecord
from app.traffic.tasks import scrape_server
from simulator.fleet import describe
from simulator.part_changes import part_change_steps
from tests.support.running_gateway import call, running_gateway
from tests.support.simulated_fleet import local_config, running_fleet
from tests.support.users import fleet_viewer

pytestmark = pytest.mark.django_db(transaction=True)

ADAPTER = LoraKey("support-lora", "lora-adapter")


def found_part(diagnosis: RequestDiagnosis) -> str:
    """The part found for a prompt change, else the cause (or why there is none)."""
    if diagnosis.cause == "prompt_changed" and diagnosis.changed_part:
        return diagnosis.changed_part
    return diagnosis.cause or diagnosis.unknown or "reused"


def confusion(pairs: list[tuple[str, str]]) -> str:
    """Requests by injected (rows) and found (columns), as text."""
    counts = Counter(pairs)
    rows, columns = sorted({i for i, _ in pairs}), sorted({f for _, f in pairs})
    width = max(len(c) for c in [*rows, *columns, "injected"]) + 1
    lines = ["injected \\ found".ljust(width + 8) + "".join(c.rjust(width) for c in columns)]
    lines += [(r or "(first)").ljust(width + 8) + "".join(str(counts[r, c]).rjust(width) for c in columns)
              for r in rows]  # fmt: skip
    return "\n".join(lines)


def expected(injected: str) -> str:
    """What an injected change must be found as: its part; the first request cold; a new latest
    message (the next question, also after the history was compacted, when it starts above where the
    longer history taught the template's prompts part) the request's own new content, not a loss."""
    return {"": "cold", "messages": "new_content"}.get(injected, injected)


def test_each_injected_part_change_is_found_as_its_part(tmp_path: Path, client: Client) -> None:
    config = local_config(name="sim-parts", block_size=16, lora_adapters=(ADAPTER,))
    steps = part_change_steps(per_phase=3, model=config.model, adapter=ADAPTER.name)
    with running_fleet([config]):
        server = register_server(**{k: str(v) for k, v in describe(config).items()})
        scrape_server(server.pk)  # block size, model and adapters
        writer = GatewayWriter(server="sim-parts", spill_path=tmp_path / "spill.jsonl", flush_seconds=0.05)
        writer.start()
        sent = []
        with running_gateway(config.base_url, writer) as gateway:
            for step in steps:
                headers = {"Content-Type": "application/json", "X-Prefixscope-Template": "support"}
                answer = call("POST", gateway + "/v1/chat/completions", step.body, headers)
                assert answer.status == 200, answer.body
                sent.append(step)
        writer.stop()
    assert RequestRecord.objects.count() == len(steps)
    diagnose_requests(now=timezone.now() + timedelta(minutes=5))
    diagnoses = {d.request_id: d for d in RequestDiagnosis.objects.all()}
    records = RequestRecord.objects.order_by("arrived_at").values_list("request_id", flat=True)
    pairs = [(step.injected, found_part(diagnoses[r])) for step, r in zip(steps, records, strict=True)]
    print("\n" + confusion(pairs))  # noqa: T201
    assert [(n, pair) for n, pair in enumerate(pairs) if pair[1] != expected(pair[0])] == []
    tools = [diagnoses[r] for (i, _), r in zip(pairs, records, strict=True) if i == "tools"]
    assert [d.part_detail for d in tools] == ["reordered", "added"]
    stored = list(RequestRecord.objects.order_by("arrived_at"))
    for step, record in zip(steps, stored, strict=True):
        assert_starts_where_their_parts_render(step.body, record.part_digests["starts"], record.token_ids)
    # Thinking turned off renders after the new question: by the rule order alone its template
    # arguments would be named, by where the prompt departs its question (its own new content).
    off = next(n for n, step in enumerate(steps) if "enable_thinking" in step.body["chat_template_kwargs"])
    ours, theirs = (Parts.from_json(stored[n].part_digests, model="", adapter=False) for n in (off, off - 1))
    assert changed_part(ours, theirs) == PartChange(RequestPart.TEMPLATE_KWARGS, kwarg="enable_thinking")
    assert found_part(diagnoses[stored[off].request_id]) == "new_content"
    # The request page says in which part the departing token lies.
    client.force_login(fleet_viewer("engineer"))
    for (injected, _), record in zip(pairs, stored, strict=True):
        if injected in ("system", "reasoning_effort"):
            page = client.get(request_page_url("sim-parts", record.request_id)).content.decode()
            at = diagnoses[record.request_id].diverged_at
            assert f"at token {at}, in its {injected.replace('_', ' ')}" in page, injected


def assert_starts_where_their_parts_render(
    body: dict[str, Any], starts: dict[str, int], ids: list[int]
) -> None:
    """Each part's start is a token of what the template renders of it (gpt2.PARTS_CHAT_TEMPLATE): the
    reasoning effort and tools in the header, then the messages; its first token, or the first that
    its rendering does not share with what follows it without it (`<|im_start|>` is shared by all)."""
    messages = body["messages"]  # the system message, maybe a history, then the latest turn
    turns = [n for n, message in enumerate(messages) if message["role"] == "assistant"]
    latest = messages[turns[-1] + 1 if turns else 1]
    rendered = {
        "reasoning_effort": "Reasoning effort: ",
        "tools": "Tool: ",
        "system": "<|im_start|>system\n" + messages[0]["content"],
        "messages": "<|im_start|>user\n" + latest["content"],
    }
    if turns:
        rendered["history"] = "<|im_start|>user\n" + messages[1]["content"]
    if body["chat_template_kwargs"].get("enable_thinking") is False:
        rendered["template_kwargs"] = "<think>"
    assert sorted(starts) == sorted(rendered)
    prompt = gpt2.decode(ids)
    for part, text in rendered.items():
        at = len(gpt2.decode(ids[: starts[part]]))
        assert prompt.index(text) <= at < prompt.index(text) + len(text), part
