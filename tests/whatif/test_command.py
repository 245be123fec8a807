"""`manage.py whatif`: the calibration line, then the tables, then what the TTFT estimate leaves out;
--json as the API gives the answers; exit status 2 when it cannot answer."""

import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from app.domain.replay.whatif import LEAVES_OUT
from app.traffic.models import RequestRecord
from app.whatif.results import answers_out
from app.whatif.services import Scope, ScopeKind, ask
from tests.support.virtual_fleet import run_virtually
from tests.whatif.test_ask import demo

pytestmark = pytest.mark.django_db(transaction=True)


def whatif(*args: str) -> str:
    out = StringIO()
    call_command("whatif", *args, stdout=out)
    return out.getvalue()


def test_the_answers_are_printed_calibration_first_then_the_tables(tmp_path: Path) -> None:
    run = run_virtually(demo(120), tmp_path, scrape_every=15)
    window = ("--since", run.at(0).isoformat(), "--until", run.at(121).isoformat())

    lines = whatif(*window).splitlines()

    assert lines[0].startswith("calibration: good: replayed hit rate ") and "requests exact" in lines[0]
    assert "WARNING" not in "\n".join(lines)
    capacity = lines.index("Capacity")
    assert lines[capacity + 1].split() == ["factor", "KV", "blocks", "hit", "rate", "saved", "tok/h",
                                           "GPU-s/h", "$/h", "TTFT", "saved", "ms"]  # fmt: skip
    factors = [line.split()[0] for line in lines[capacity + 2 : capacity + 10]]
    assert factors == ["0.25x", "0.5x", "0.75x", "1x", "1.5x", "2x", "3x", "4x"]
    assert lines[capacity + 5].split()[1] == f"{4 * 256:,}"  # today's: 4 servers of 256 blocks
    for title in ("Routing", "Server counts", "Block sizes", "Salts", "Restore"):
        assert title in lines
    assert lines[-1].startswith("Answers priced at ") and lines[-1].endswith(f"a GPU-hour. {LEAVES_OUT}")

    found = json.loads(whatif(*window, "--json"))
    expected = ask(scope=Scope(ScopeKind.FLEET), since=run.at(0), until=run.at(121)).answers
    assert found["scope"] == "fleet" and found["answers"] == json.loads(json.dumps(answers_out(expected)))


def test_a_poor_calibration_says_its_answers_are_not_to_be_trusted(tmp_path: Path) -> None:
    run = run_virtually(demo(120), tmp_path, scrape_every=15)
    RequestRecord.objects.update(cached_tokens=0)  # the engines "reused" nothing: the replay disagrees

    lines = whatif("--since", run.at(0).isoformat(), "--until", run.at(121).isoformat()).splitlines()

    assert lines[0].startswith("calibration: poor: ")
    assert "WARNING: the replay does not reproduce this fleet" in lines[1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--scope", "template", "--name", "nobody"), "no template 'nobody'"),
        (("--scope", "template"), "--scope template needs --name"),
        (("--minutes", "0"), "the window must end after it starts"),
        (("--minutes", "1441"), "the window is longer than 24 hours"),
        (("--since", "yesterday"), "--since 'yesterday' is not an ISO 8601 time"),
        (("--minutes", "5", "--until", "2026-01-01T00:00:00Z"), "give either --minutes or --since"),
    ],
)
def test_what_it_cannot_answer_exits_2_saying_why(args: tuple[str, ...], message: str) -> None:
    with pytest.raises(CommandError, match=message) as refused:
        whatif(*args)

    assert refused.value.returncode == 2
