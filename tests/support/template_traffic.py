"""A template's known history for its page's tests: two commits of a real git repository imported by the
import service, then twenty minutes of requests naming them (ingested, rolled up and diagnosed as the
tasks do): version one reuses 80 % of each prompt, version two, which moved its timestamp line to the
top, 20 %. A second template, billing, reuses 30 % of its prompts."""

from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from django.utils import timezone

from app.diagnosis.run import diagnose_requests
from app.fleet.models import Server
from app.prompts.history import import_template_history
from app.prompts.models import Template, TemplateVersion
from app.prompts.services import register_repository
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts
from tests.prompts.conftest import GitRepo

V1 = "You are a support agent for Acme.\nAnswer briefly.\nCurrent time: {{ now }}\nTools: {{ tools }}\n"
V2 = (
    "Current time: {{ now }}\nYou are a support agent for Acme.\nAnswer briefly.\nBe kind.\n"
    "Tools: {{ tools }}\n"
)
PROMPT = 1000  # tokens of every request
CACHED = {1: 800, 2: 200}  # per version


@dataclass(frozen=True, slots=True)
class History:
    server: Server
    support: Template
    billing: Template
    one: TemplateVersion
    two: TemplateVersion
    start: datetime  # the first minute of traffic; version two from start + 10 minutes


def a_template_history(folder: Path) -> History:
    now = timezone.now().replace(second=0, microsecond=0)
    start = now - timedelta(minutes=30)
    repo = GitRepo(folder / "prompts")
    repo.write("templates/support.j2", V1)
    one = repo.commit("Support prompt", when=start - timedelta(hours=3))
    repo.write("templates/support.j2", V2)
    two = repo.commit("Timestamp first, be kind", when=start - timedelta(hours=1))
    repository = register_repository(location=str(repo.path), globs=["templates/*.j2"])
    assert import_template_history(repository_id=repository.pk, now=timezone.now()).error == ""
    server = Server.objects.create(name="vllm-t", base_url="http://vllm-t:8000", block_size=16, model="tiny")
    facts = []
    for minute in range(20):
        version, sha = (1, one) if minute < 10 else (2, two)
        for n in range(2):
            at = start + timedelta(minutes=minute, seconds=5 + 20 * n)
            facts.append(_request(f"s{minute}-{n}", at, "support", sha, CACHED[version], ttft=0.1 * version))
        facts.append(
            _request(f"b{minute}", start + timedelta(minutes=minute, seconds=30), "billing", "", 300)
        )
    ingest_request_records(facts, source="rest", now=timezone.now())
    refresh_minute_rollups(since=start, until=start + timedelta(minutes=20))
    diagnose_requests(now=timezone.now())
    support = Template.objects.get(name="support")
    return History(
        server=server,
        support=support,
        billing=Template.objects.get(name="billing"),
        one=support.versions.get(commit_sha=one),
        two=support.versions.get(commit_sha=two),
        start=start,
    )


def _request(
    rid: str, at: datetime, template: str, sha: str, cached: int, *, ttft: float = 0.2
) -> RequestFacts:
    # Prompts that differ from the fourth block on: the diagnosis finds their losses in them.
    ids = [*range(1, 49), *((100 + 13 * i + 101 * sum(map(ord, rid))) % 50000 for i in range(PROMPT - 48))]
    return RequestFacts(
        request_id=rid,
        arrived_at=at,
        server="vllm-t",
        model="tiny",
        tenant="acme",
        template=template,
        template_version=sha,
        prompt_tokens=PROMPT,
        cached_tokens=cached,
        client_ttft_seconds=ttft,
        prompt_token_ids=ids,
    )
