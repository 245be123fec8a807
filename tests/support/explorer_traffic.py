"""Recorded traffic for the requests explorer's tests: two servers, two templates (two versions of
one), two tenants, cached shares from none to most, and arrivals that share a timestamp, stored
through the real ingest path and diagnosed by the real diagnosis."""

import random
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts

BLOCK = 16
OLD, NEW = "a1b2c3d4" * 5, "e5f6a7b8" * 5  # template versions of "support"


@dataclass(frozen=True, slots=True)
class Sent:
    server: str
    request_id: str
    arrived_at: datetime
    template: str
    version: str
    tenant: str
    prompt_tokens: int
    cached_tokens: int


def record_traffic(*, count: int = 40, now: datetime | None = None) -> list[Sent]:
    """`count` requests up to 40 seconds apart, the last a little before `now`, every third sharing
    its arrival time with the one before; stored, then diagnosed. Servers at 127.0.0.1:9, where
    nothing listens (no /detokenize)."""
    now = now or timezone.now()
    for name in ("vllm-a", "vllm-b"):
        Server.objects.get_or_create(
            name=name, defaults={"base_url": f"http://127.0.0.1:9/{name}", "block_size": BLOCK, "model": "m"}
        )
    rng = random.Random(5)
    system = [rng.randrange(1, 50_000) for _ in range(4 * BLOCK)]
    sent, facts = [], []
    at = now - timedelta(seconds=40 * count)
    for n in range(count):
        if n % 3 != 2:
            at += timedelta(seconds=40)
        template = "support" if n % 4 else "search"
        prompt = system + [rng.randrange(1, 50_000) for _ in range(BLOCK + n % 7)]
        cached = [0, 2 * BLOCK, 4 * BLOCK][n % 3]
        item = Sent(
            server="vllm-a" if n % 2 else "vllm-b",
            request_id=f"req-{n:03d}",
            arrived_at=at,
            template=template,
            version=(OLD if n < count // 2 else NEW) if template == "support" else "",
            tenant="acme" if n % 5 else "globex",
            prompt_tokens=len(prompt),
            cached_tokens=cached,
        )
        sent.append(item)
        facts.append(
            RequestFacts(
                request_id=item.request_id,
                arrived_at=at,
                server=item.server,
                model="m",
                tenant=item.tenant,
                template=template,
                template_version=item.version,
                prompt_tokens=len(prompt),
                cached_tokens=cached,
                prompt_token_ids=prompt,
                client_ttft_seconds=0.2 + n / 100,
                server_ttft_seconds=0.1 + n / 100,
            )
        )
    outcome = ingest_request_records(facts, source="gateway", now=now)
    assert outcome.rejected == []
    diagnose_requests(now=now + timedelta(minutes=2))
    return sent


def newest_first(sent: list[Sent]) -> list[tuple[str, str]]:
    """The explorer's order: arrival, then server id, then request id, all descending."""
    ids = dict(Server.objects.values_list("name", "pk"))
    ordered = sorted(sent, key=lambda s: (s.arrived_at, ids[s.server], s.request_id), reverse=True)
    return [(s.server, s.request_id) for s in ordered]
