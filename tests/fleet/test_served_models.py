"""The scrape reads /v1/models: the LoRA adapters a server serves, and the (name, path) of a request's
adapter that its block hashes need.

The answers are real: the shared capture of a server without adapters, and
tests/collectors/models/models-lora.json, recorded from vLLM 0.32 serving one adapter.
"""

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from app.domain.blockhash import LoraKey
from app.fleet.models import Server
from app.fleet.selectors import UnknownModel, request_lora
from app.traffic.tasks import scrape_server
from tests.support.captures import VLLM_CPU_FIXTURES

METRICS = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_bytes()
NO_ADAPTERS = (VLLM_CPU_FIXTURES / "models.json").read_bytes()
ONE_ADAPTER = (Path(__file__).parents[1] / "collectors" / "models" / "models-lora.json").read_bytes()


@dataclass
class Pages:
    """What the fake server answers, by path; a path it lacks answers 404."""

    by_path: dict[str, bytes] = field(default_factory=dict)


@pytest.fixture
def pages() -> Pages:
    return Pages({"/metrics": METRICS, "/v1/models": ONE_ADAPTER})


@pytest.fixture
def vllm_url(pages: Pages) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.by_path.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            self.wfile.write(body or b"not found")

        def log_message(self, *args: object) -> None:
            """Keep the test output quiet."""

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()


@pytest.mark.django_db
def test_a_scrape_stores_the_adapters_the_server_lists_with_their_paths(vllm_url: str) -> None:
    server = Server.objects.create(name="vllm-lora", base_url=vllm_url)

    scrape_server(server.pk)

    server.refresh_from_db()
    assert (server.base_models, server.lora_adapters) == (["tiny"], {"support-lora": "lora-adapter"})
    assert server.models_read_at == server.last_scraped_at
    assert request_lora(server, "support-lora") == LoraKey("support-lora", "lora-adapter")


@pytest.mark.django_db
def test_an_adapter_unloaded_since_the_last_scrape_is_gone(vllm_url: str, pages: Pages) -> None:
    server = Server.objects.create(name="vllm-lora", base_url=vllm_url)
    scrape_server(server.pk)

    pages.by_path["/v1/models"] = NO_ADAPTERS
    scrape_server(server.pk)

    server.refresh_from_db()
    assert server.lora_adapters == {}
    with pytest.raises(UnknownModel):
        request_lora(server, "support-lora")


@pytest.mark.django_db
@pytest.mark.parametrize("unread", ["/v1/models", "/metrics"])
def test_what_was_last_read_stays_when_a_page_does_not_answer(
    vllm_url: str, pages: Pages, unread: str
) -> None:
    server = Server.objects.create(name="vllm-lora", base_url=vllm_url)
    scrape_server(server.pk)
    first_read = Server.objects.get(pk=server.pk).models_read_at

    del pages.by_path[unread]
    scrape_server(server.pk)

    server.refresh_from_db()
    assert server.lora_adapters == {"support-lora": "lora-adapter"}
    assert server.models_read_at == first_read
    # /v1/models is not /metrics: a server without it is still up.
    assert server.state == (Server.State.ACTIVE if unread == "/v1/models" else Server.State.DOWN)


SERVED = Server(
    name="vllm-0",
    base_url="http://vllm-0:8000",
    model="tiny",
    base_models=["tiny", "tiny-alias"],
    lora_adapters={"support-lora": "/adapters/support", "sql-lora": "org/sql-lora"},
    models_read_at=datetime(2026, 12, 1, tzinfo=UTC),
)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("support-lora", LoraKey("support-lora", "/adapters/support")),
        ("sql-lora", LoraKey("sql-lora", "org/sql-lora")),
        ("tiny", None),
        ("tiny-alias", None),  # --served-model-name with two names
        ("", None),  # vLLM serves the base model to a request that names none
    ],
)
def test_a_requests_model_names_its_adapter_or_the_base_model(model: str, expected: LoraKey | None) -> None:
    assert request_lora(SERVED, model) == expected


def test_a_model_the_server_does_not_list_has_no_adapter_key() -> None:
    with pytest.raises(UnknownModel, match="typo-lora"):
        request_lora(SERVED, "typo-lora")


def test_a_server_whose_models_were_never_read_is_taken_to_serve_its_base_model() -> None:
    # Records can arrive before the first scrape: most servers serve no adapter, and the scrape
    # corrects the requests after it.
    unread = Server(name="vllm-1", base_url="http://vllm-1:8000", model="tiny")

    assert request_lora(unread, "tiny") is None
    assert request_lora(unread, "support-lora") is None
