"""The diagnosis' `diverged_at` on the scenarios' own traffic (simulator/scenarios/*.yaml through the
simulator's planner, rendered, tokenized with GPT-2 and hashed as the servers would) and on the real
vLLM captures' prompts (GPT-2 tokenizes them as the server did: tests/domain/test_gpt2.py): the longest
common prefix with any earlier prompt of the same template and salt, as a brute force finds it."""

from collections.abc import Mapping
from datetime import UTC, datetime
from functools import cache
from itertools import islice
from pathlib import Path

import numpy as np
import pytest

from app.domain.blockhash import signed_block_hashes
from app.domain.followers import Followers
from app.domain.gpt2 import encode, render_chat
from simulator.planner import plan_requests
from simulator.scenario import Scenario, load_scenario
from simulator.template_repo import Commit, template_versions
from tests.support.captures import captured_traffic

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "simulator" / "scenarios").glob("*.yaml"))
T0 = datetime(2026, 1, 1, tzinfo=UTC)
REQUESTS = 1_400  # the demo's first 700 virtual seconds: its volatile top, an edit, a salt rotation


@cache
def traffic(path: Path) -> tuple[Scenario, list[tuple[str, str, list[int]]]]:
    """The scenario and its first REQUESTS prompts: (template, salt, token ids)."""
    scenario = load_scenario(path)
    commits = [
        Commit(sha=f"v{i}", template=v.template, time=v.at, message=v.message, path="", text=v.text)
        for i, v in enumerate(template_versions(scenario))
    ]
    planned = islice(plan_requests(scenario, commits, seed=1), REQUESTS)
    return scenario, [
        (r.template, str(r.body.get("cache_salt") or ""), encode(_text(r.body))) for r in planned
    ]


def _text(body: Mapping[str, object]) -> str:
    messages = body.get("messages")
    return render_chat(messages) if isinstance(messages, list) else str(body["prompt"])


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    length = min(len(a), len(b))
    differ = np.flatnonzero(a[:length] != b[:length])
    return int(differ[0]) if differ.size else length


@pytest.mark.parametrize("path", SCENARIOS, ids=[path.stem for path in SCENARIOS])
def test_diverged_at_is_the_longest_common_prefix_with_any_earlier_prompt_of_the_template(path: Path) -> None:
    scenario, prompts = traffic(path)
    compared = checked_divergences(prompts, scenario.servers.block_size)
    assert compared >= len(prompts) // 4  # many depart somewhere (their own question), after the first


def test_diverged_at_is_the_longest_common_prefix_on_the_real_captures() -> None:
    prompts = [("captures", str(body.get("cache_salt") or ""), encode(str(body["prompt"])))
               for body, _ in captured_traffic()]  # fmt: skip
    assert checked_divergences(prompts, 32) >= 5  # the server's --block-size


def checked_divergences(prompts: list[tuple[str, str, list[int]]], size: int) -> int:
    """Each prompt's divergence from the earlier prompts of its template and salt, as the diagnosis
    finds it (app/domain/followers.py: where a prompt_changed loss starts), against the brute force;
    returns how many were checked (the prompts that depart from all earlier ones)."""
    followers: dict[tuple[str, str], Followers] = {}
    earlier: dict[tuple[str, str], list[np.ndarray]] = {}
    compared = 0
    for n, (template, salt, tokens) in enumerate(prompts):
        chain = signed_block_hashes(tokens, size, cache_salt=salt or None)
        memory = followers.setdefault((template, salt), Followers())
        ours = np.asarray(tokens)
        family = earlier.setdefault((template, salt), [])
        expected = max((common_prefix(ours, other) for other in family), default=None)
        if expected is not None and expected < len(tokens):
            assert memory.divergence(list(chain), tokens, size) == expected, n
            compared += 1
        memory.remember(list(chain), tokens, size)
        family.append(ours)
    return compared
