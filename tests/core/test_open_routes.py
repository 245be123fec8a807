"""The routes that answer without a login are docs/access.md's list of them, and /metrics takes the
bearer token PREFIXSCOPE_METRICS_BEARER_TOKEN names, as Prometheus' scrape example sends it."""

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver

from app.core.runbooks import RUNBOOKS

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.django_db


def docs_open_routes() -> set[str]:
    """The paths of docs/access.md's "No login" bullet (its first sentence: the token routes follow)."""
    text = (ROOT / "docs" / "access.md").read_text()
    bullet = re.search(r"^- \*\*No login\*\*.*?(?=^- |^#|^$|\Z)", text, re.M | re.S)
    assert bullet, "docs/access.md has no '- **No login**' bullet"
    return set(re.findall(r"`(/[^` ]*)`", bullet.group(0).split(" Ingest (")[0]))


def plain_paths(patterns: list[URLPattern | URLResolver], prefix: str = "") -> Iterator[str]:
    """Every routed path without a parameter."""
    for pattern in patterns:
        route = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from plain_paths(pattern.url_patterns, route)
        elif not re.search(r"[<^$(]", route):
            yield "/" + route


def test_the_routes_open_without_a_login_are_the_docs_list(client: Client) -> None:
    opened = {
        path for path in set(plain_paths(get_resolver().url_patterns)) if client.get(path).status_code == 200
    }
    listed = docs_open_routes()
    assert opened == {path for path in listed if "<" not in path}
    assert "/docs/runbooks/<alert>/" in listed
    for slug in RUNBOOKS:
        assert client.get(f"/docs/runbooks/{slug}/").status_code == 200, slug


def scrape_token_file() -> Path:
    example = yaml.safe_load((ROOT / "deploy" / "prometheus" / "scrape-with-token.yml").read_text())
    (job,) = example["scrape_configs"]
    assert job["metrics_path"] == "/metrics" and job["authorization"]["type"] == "Bearer"
    return Path(job["authorization"]["credentials_file"])


def test_metrics_are_open_without_a_token_set(client: Client) -> None:
    assert client.get("/metrics").status_code == 200


@override_settings(PREFIXSCOPE_METRICS_BEARER_TOKEN="s3cret-metrics-token")
def test_metrics_want_the_bearer_token_when_one_is_set(client: Client, tmp_path: Path) -> None:
    # What Prometheus does with the example: read the credentials file, send it as a Bearer token.
    secret = tmp_path / scrape_token_file().name
    secret.write_text("s3cret-metrics-token\n")
    scraped = client.get("/metrics", headers={"Authorization": f"Bearer {secret.read_text().strip()}"})
    assert scraped.status_code == 200 and b"prefixscope_" in scraped.content
    for header in (
        {},
        {"Authorization": "Bearer s3cret-metrics-tokeN"},
        {"Authorization": "Basic s3cret-metrics-token"},
    ):
        refused = client.get("/metrics", headers=header)
        assert refused.status_code == 401 and refused["WWW-Authenticate"].startswith("Bearer")
        assert b"prefixscope_" not in refused.content
