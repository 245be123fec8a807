"""docs/api.md's map of the routes is the API's own schema: every operation of /api/openapi.json is
listed there, and nothing listed is missing from it."""

import re
from pathlib import Path

from app.api.api import api

ROOT = Path(__file__).resolve().parents[2]


def schema_routes() -> set[str]:
    return {
        f"{method.upper()} {path}"
        for path, item in api.get_openapi_schema()["paths"].items()
        for method in item
    }


def documented_routes() -> set[str]:
    text = (ROOT / "docs" / "api.md").read_text()
    return set(re.findall(r"`((?:GET|POST|PUT|PATCH|DELETE) /[^`\s]+)`", text.split("## The routes")[1]))


def test_docs_api_lists_every_route_of_the_schema() -> None:
    assert documented_routes() == schema_routes()
