"""The same trace, imported into the server and diagnosed there, gives the analyzer's causes and killers."""

import json
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.utils import timezone

from app.analyzer.cli import main
from app.compare.killers import find_all_killers
from app.diagnosis.run import diagnose_requests, forget_kept_replay
from app.fleet.models import Server
from app.fleet.services import register_server
from app.prompts.models import CacheKiller
from app.rollups.refresh import refresh_minute_rollups
from app.traffic.models import RequestDiagnosis
from app.traffic.services.partitions import maintain_partitions
from bench.analysis_trace import SERVER, write_traces
from bench.bench_analysis import import_trace

pytestmark = pytest.mark.django_db(transaction=True)


def test_server_and_analyzer_agree(
    tmp_path: Path, settings: object, capsys: pytest.CaptureFixture[str]
) -> None:
    settings.PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES = settings.PREFIXSCOPE_KILLER_WINDOW_MINUTES = 24 * 60  # type: ignore[attr-defined]
    now = timezone.now()
    paths, _ = write_traces(
        tmp_path, requests=240, block_sizes=[16], start=now - timedelta(minutes=30), seconds=600
    )
    register_server(name=SERVER, base_url="http://127.0.0.1:9", model="bench")
    Server.objects.update(block_size=16, hash_algo="sha256_cbor")
    maintain_partitions(now=now)
    first, last, _ = import_trace(paths[16])
    forget_kept_replay()
    diagnose_requests(now=timezone.now())
    refresh_minute_rollups(
        since=first, until=last + timedelta(microseconds=1)
    )  # killers look for active templates there
    find_all_killers(now=timezone.now())
    server_causes = Counter(d.cause or d.unknown or "reused" for d in RequestDiagnosis.objects.all())
    server_killers = {
        (k.template.name, k.position_token, k.kind) for k in CacheKiller.objects.select_related("template")
    }

    assert main(["analyze", str(paths[16]), "--json", "--no-curve"]) == 0
    report = json.loads(capsys.readouterr().out)
    causes = Counter({row["cause"]: row["requests"] for row in report["causes"] if row["requests"]})
    killers = {
        (k["group"]["name"], k["killer"]["position_token"], k["killer"]["klass"]) for k in report["killers"]
    }
    assert sum(server_causes.values()) == 240
    assert causes == server_causes
    assert killers == server_killers and killers
    per_request = {d.request_id: d.cause or "reused" for d in RequestDiagnosis.objects.all()}
    assert {row["request_id"]: row["cause"] or "reused" for row in report["rows"]} == per_request


def test_export_trace_round_trips_to_the_servers_causes(
    tmp_path: Path, settings: object, capsys: pytest.CaptureFixture[str]
) -> None:
    settings.PREFIXSCOPE_DIAGNOSIS_LOOKBACK_MINUTES = 24 * 60  # type: ignore[attr-defined]
    now = timezone.now()
    paths, _ = write_traces(
        tmp_path, requests=120, block_sizes=[16], start=now - timedelta(minutes=30), seconds=600
    )
    register_server(name=SERVER, base_url="http://127.0.0.1:9", model="bench")
    Server.objects.update(block_size=16, hash_algo="sha256_cbor")
    maintain_partitions(now=now)
    first, last, _ = import_trace(paths[16])
    forget_kept_replay()
    diagnose_requests(now=timezone.now())
    server_causes = {d.request_id: d.cause or "reused" for d in RequestDiagnosis.objects.all()}
    exported = tmp_path / "export.jsonl"
    call_command("export_trace", since=first.isoformat(), until=(last + timedelta(seconds=1)).isoformat(),
                 output=str(exported))  # fmt: skip
    line = json.loads(exported.read_text().splitlines()[0])
    assert (
        line["block_size"] == 16 and all(0 <= h < 2**64 for h in line["block_hashes"]) and line["token_ids"]
    )

    assert main(["analyze", str(exported), "--json", "--no-curve"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["format"] == "prefixscope" and report["block_size"] == 16
    assert {row["request_id"]: row["cause"] or "reused" for row in report["rows"]} == server_causes
