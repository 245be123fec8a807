"""The demo's support template rendered as the simulator renders it, its timestamp line moved to the top
from the 60th virtual second on (the ``volatile_top`` fault), served by a simulated vLLM server (which
also answers /detokenize) and reported with the usage it answered to the REST ingest, the way an
application reports its requests."""

import json
from collections.abc import Iterator, Sequence
from datetime import timedelta
from functools import cache

import httpx
import pytest
from django.test import Client
from django.utils import timezone

from app.fleet.models import Server
from app.fleet.services import register_server
from app.rollups.tasks import refresh_rollups
from app.traffic.tasks import scrape_server
from simulator.fleet import describe
from tests.support.rendered_prompts import BLOCK_SIZE, RenderedPrompt, planned_traffic, token_at
from tests.support.simulated_fleet import local_config, running_fleet

BATCH = 100


@cache
def volatile_top() -> tuple[RenderedPrompt, ...]:
    """300 requests of the support template; those after its fault start with "Current time: ..."."""
    return tuple(planned_traffic(300, mix={"support": 1.0}, faults={"support": (60, "volatile_top")}))


def timestamp_token() -> int:
    """The first token of the moved "Current time:" line, in a faulted prompt."""
    text = next(p.text for p in volatile_top() if p.text.startswith("Current time:"))
    return token_at(text, text.index("Current time:"))


@pytest.fixture
def sim() -> Iterator[Server]:
    """One simulated server, registered and scraped (its block size, 16 like the demo's, read from its
    /metrics); its /detokenize decodes the GPT-2 token ids the prompts are made of."""
    config = local_config(name="sim-a", block_size=BLOCK_SIZE, num_blocks=256)
    with running_fleet([config]):
        server = register_server(**{k: str(v) for k, v in describe(config).items()})
        scrape_server(server.pk)
        yield Server.objects.get(pk=server.pk)


def ingest(
    client: Client, token: str, traffic: Sequence[RenderedPrompt], *, server: Server, salt: str | None = None
) -> list[str]:
    """Serve the requests on ``server``, and POST them with their usage to /api/v1/requests, dated a
    second apart, the last one a minute ago, then refresh the per-minute rollups; their ids."""
    start = timezone.now() - timedelta(seconds=len(traffic) + 60)
    salted = {"cache_salt": salt} if salt else {}
    records = []
    with httpx.Client(base_url=server.base_url) as http:
        for i, prompt in enumerate(traffic):
            body = {"model": server.model, "prompt": list(prompt.token_ids), "max_tokens": 1} | salted
            usage = http.post("/v1/completions", json=body).raise_for_status().json()["usage"]
            records.append(
                {
                    "server": server.name,
                    "request_id": f"req-{salt or 'none'}-{i:04d}",
                    "arrived_at": (start + timedelta(seconds=i)).isoformat(),
                    "model": server.model,
                    "template": prompt.template,
                    "tenant": prompt.tenant,
                    "prompt_token_ids": list(prompt.token_ids),
                    "usage": usage,
                }
                | salted
            )
    for first in range(0, len(records), BATCH):
        response = client.post(
            "/api/v1/requests",
            json.dumps(records[first : first + BATCH]),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert response.status_code == 200 and response.json()["rejected"] == [], response.content
    refresh_rollups()  # as beat runs it: the killers search finds its templates in the rollups
    return [str(record["request_id"]) for record in records]
