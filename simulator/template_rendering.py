"""Rendering a scenario's prompt templates: the Jinja environment and the variables of one request.

Templates are Jinja. They see these variables, built per request by ``simulator.planner``:
``now`` (the request's time, a string), ``request_id``, ``tenant``, ``question`` (one of the template's
questions), and the template's ``tools`` (name/description mappings), ``schema`` (a mapping) and
``chunks`` (strings). The application hands ``tools``, ``schema`` keys and ``chunks`` over in a
different order on every request, as code that builds them from sets or merged dicts does; a
cache-friendly template normalizes them (``tools | sort(attribute="name")``, ``schema | tojson``,
which sorts keys, ``chunks | sort``), and the faults (``simulator.template_faults``) are the commits
that undo this.
"""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import jinja2

if TYPE_CHECKING:
    from simulator.scenario import Template

TEMPLATE_VARIABLES = ("now", "request_id", "tenant", "question", "tools", "schema", "chunks")


def template_environment() -> jinja2.Environment:
    """The Jinja environment templates are compiled and rendered in.

    Block tags swallow their line (``trim_blocks``, ``lstrip_blocks``), so a ``{% for %}`` on a line
    of its own adds no blank line. Undefined variables raise instead of rendering as nothing (a typo
    must not silently change a prompt). Besides Jinja's filters there is ``dumps``: JSON in the
    mapping's own key order, where ``tojson`` sorts keys.
    """
    environment = jinja2.Environment(
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    environment.filters["dumps"] = json.dumps
    return environment


def request_variables(
    template: Template, *, now: str, request_id: str, tenant: str, rng: random.Random
) -> dict[str, object]:
    """The variables one request renders ``template`` with (names in TEMPLATE_VARIABLES).

    ``question`` is one of the template's questions; ``tools`` (name/description mappings), the keys of
    ``schema`` at every depth, and ``chunks`` come in a new random order on each call, as an
    application that builds them from sets would pass them. The same rng state gives the same values.
    """
    tools = [{"name": tool.name, "description": tool.description} for tool in template.tools]
    rng.shuffle(tools)
    chunks = list(template.chunks)
    rng.shuffle(chunks)
    return {
        "now": now,
        "request_id": request_id,
        "tenant": tenant,
        "question": rng.choice(template.questions),
        "tools": tools,
        "schema": shuffle_keys(template.schema, rng),
        "chunks": chunks,
    }


def shuffle_keys(value: object, rng: random.Random) -> object:
    """A copy of a JSON value whose mappings, at every depth, have their keys in a random order."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        return {key: shuffle_keys(value[key], rng) for key in keys}
    if isinstance(value, list):
        return [shuffle_keys(item, rng) for item in value]
    return value
