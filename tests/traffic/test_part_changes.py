"""Which request part changed, against what the part-change scenario injected (simulator/part_changes.py):
its chat requests through the gateway to a simulated vLLM serving a LoRA adapter, stored and diagnosed.
The confusion table (requests by injected part and found part or cause) is printed and must be exact:
every request found as injected."""

from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.domain.blockhash import LoraKey
from app.fleet.services import register_server
from app.traffic.collection.gateway_writer import GatewayWriter
from app.traffic.models import RequestDiagnosis, RequestRecord
from app.traffic.tasks import scrape_server
from simulator.fleet import describe
from simulator.part_changes import part_change_steps
from tests.support.running_gateway import call, running_gateway
from tests.support.simulated_fleet import local_config, running_fleet

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


def test_each_injected_part_change_is_found_as_its_part(tmp_path: Path) -> None:
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
