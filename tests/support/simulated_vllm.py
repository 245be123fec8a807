"""The project's simulated vLLM server with the real CPU server's settings, described like the real one.

The end-to-end checks take a ``VLLMServer`` description; this module runs a simulated server on free
local ports (in a background thread, answering at once) and describes it with the same fields, so
the same checks run against both.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

from simulator.fleet import describe
from simulator.server import ServerConfig
from tests.support.simulated_fleet import local_config, running_fleet
from tests.support.vllm_cpu import BLOCK_SIZE, SERVED_MODEL_NAME, VLLMServer

# tests/support/vllm_cpu.py starts vLLM with --num-gpu-blocks-override 48 (null block included) and
# --max-model-len 512; the simulator's num_blocks counts the null block the same way.
NUM_BLOCKS = 48
MAX_MODEL_LEN = 512


def simulated_config(*, otlp_endpoint: str) -> ServerConfig:
    """A simulated server with the real server's capacity on free ports; it answers without sleeping."""
    return local_config(
        model=SERVED_MODEL_NAME,
        block_size=BLOCK_SIZE,
        num_blocks=NUM_BLOCKS,
        max_model_len=MAX_MODEL_LEN,
        otlp_endpoint=otlp_endpoint,
        sleep=False,
    )


def description(config: ServerConfig, startup_seconds: float) -> VLLMServer:
    """``simulator.fleet.describe`` in the fields of the real server's description."""
    described = describe(config)
    return VLLMServer(
        base_url=str(described["base_url"]),
        metrics_url=str(described["metrics_url"]),
        kv_endpoint=str(described["kv_events_endpoint"]),
        replay_endpoint=str(described["kv_replay_endpoint"]),
        topic=str(described["kv_topic"]),
        model=str(described["model"]),
        block_size=config.block_size,
        otlp_endpoint=config.otlp_endpoint or "",
        startup_seconds=startup_seconds,
    )


@contextlib.contextmanager
def serve_simulated(*, otlp_endpoint: str) -> Iterator[VLLMServer]:
    """Run one simulated server that exports its spans to ``otlp_endpoint`` until the block exits.

    At exit the server stops and flushes its buffered spans.
    """
    started = time.monotonic()
    config = simulated_config(otlp_endpoint=otlp_endpoint)
    with running_fleet([config]):
        yield description(config, time.monotonic() - started)
