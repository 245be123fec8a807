"""The official SARIF 2.1.0 schema, as the npm package `@microsoft/sarif-multitool-linux` ships it
(a devDependency in package.json: `npm ci`, which `make test` runs, installs it), and a validator."""

import json
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema_rs

SCHEMA = (
    Path(__file__).resolve().parents[2]
    / "node_modules"
    / "@microsoft"
    / "sarif-multitool-linux"
    / "sarif-2.1.0.json"
)


@cache
def _validator() -> jsonschema_rs.Validator:
    """The schema's validator for its own draft (2020-12), formats checked."""
    assert SCHEMA.exists(), f"{SCHEMA} is missing: `npm ci` installs it (package.json's devDependencies)"
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    return jsonschema_rs.Draft202012Validator(schema, validate_formats=True)


def sarif_problems(log: Any) -> list[str]:
    """Where and why ``log`` breaks the SARIF 2.1.0 schema (empty when it is valid)."""
    return [f"/{'/'.join(map(str, e.instance_path))}: {e.message}" for e in _validator().iter_errors(log)]
