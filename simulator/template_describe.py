"""The describing file (``prefixscope.yaml``) of a scenario's template repository, so that Prefixscope's
template check (docs/template-check.md) can render and judge its templates as the load generator does.

Each template gets three sample requests made as the planner makes them (simulator/template_rendering.py):
``now``, ``request_id`` and ``question`` change per request and ``tenant`` per user; the application
passes ``tools`` and ``chunks`` in no fixed order and builds ``schema`` with keys in any order, which the
check's perturbations reproduce. A chat template's render is the system message and ``question`` its
user message, as the simulator sends them.
"""

from __future__ import annotations

import random
from datetime import datetime, timedelta

import yaml

from simulator.scenario import Scenario, Template
from simulator.template_rendering import request_variables

CONFIG_FILE = "prefixscope.yaml"
SAMPLES = 3
_TENANTS = ("acme", "globex", "initech")


def describe(scenario: Scenario, block_size: int, start: datetime) -> str:
    """The YAML text of the describing file: the bundled GPT-2 tokenizer (the served model's), the
    servers' block size, the Jinja options the simulator renders with, and one entry per template."""
    body = {
        "version": 1,
        "tokenizer": "gpt2",
        "block_size": block_size,
        "jinja": {"trim_blocks": True, "lstrip_blocks": True, "keep_trailing_newline": True},
        "templates": [_entry(template, start) for template in scenario.templates],
    }
    header = "# How Prefixscope's template check renders these templates: docs/template-check.md\n"
    return header + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=110)


def _entry(template: Template, start: datetime) -> dict[str, object]:
    entry: dict[str, object] = {"files": f"templates/{template.name}.j2", "kind": template.kind}
    if template.kind == "chat":
        entry["user"] = "question"
    several_questions = len(set(template.questions)) > 1  # a variable that never varies is not per request
    entry |= {
        "per_request": ["now", "request_id", *(["question"] if several_questions else [])],
        "per_user": ["tenant"],
        "unordered": ["tools", "chunks"],
        "samples": [_sample(template, index, start) for index in range(SAMPLES)],
    }
    return entry


def _sample(template: Template, index: int, start: datetime) -> dict[str, object]:
    at = start + timedelta(seconds=37 * index + 11 * index * index)
    variables = request_variables(
        template,
        now=at.isoformat(timespec="seconds"),
        request_id=f"req-{index + 1:04d}-{template.name}",
        tenant=_TENANTS[index % len(_TENANTS)],
        rng=random.Random(index),
    )
    variables["question"] = template.questions[index % len(template.questions)]
    return variables
