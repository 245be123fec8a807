"""Session fixtures for the end-to-end tests: the real vLLM CPU server and an OTLP receiver it exports to."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest

from tests.support.otlp_receiver import OTLPReceiver, run_otlp_receiver
from tests.support.vllm_cpu import VLLMServer, VLLMUnavailable, build_model, install, serve

logger = logging.getLogger(__name__)


@pytest.fixture(scope="session")
def otlp_receiver() -> Iterator[OTLPReceiver]:
    """A local OTLP/HTTP receiver; the real server sends its traces here."""
    with run_otlp_receiver() as receiver:
        yield receiver


@pytest.fixture(scope="session")
def real_vllm(otlp_receiver: OTLPReceiver) -> Iterator[VLLMServer]:
    """The real vLLM CPU server, installed and started once per session.

    Skips, with the reason, when vLLM cannot be installed, its model built or the server started here.
    """
    stack = contextlib.ExitStack()
    try:
        install()
        build_model()
        server = stack.enter_context(serve(otlp_endpoint=otlp_receiver.url))
    except VLLMUnavailable as exc:
        pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")
    with stack:
        yield server
