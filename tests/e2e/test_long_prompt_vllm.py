"""The real vLLM CPU server with a 2,048-token context (the harness' max_model_len and num_blocks), so
that end-to-end tests can send prompts of realistic templates: 1,000 tokens and more.

The recipe's server takes 512 tokens at most; this one is built with 2,048 positions (the model's
config says so) and a cache of 96 blocks of 32 (3,072 tokens), and reuses a 1,200-token prompt's
shared prefix as vLLM does: every full block before the first changed token, never the last token.
"""

import json
import random
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.vllm_cpu import (
    BLOCK_SIZE,
    DATA_DIR,
    VLLMServer,
    VLLMUnavailable,
    build_model,
    serve,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
LENGTH, BLOCKS = 2048, 96
rng = random.Random()  # a run's own tokens: nothing another test sent meets them


@pytest.fixture(scope="module")
def long_vllm() -> Iterator[VLLMServer]:
    try:
        with serve(max_model_len=LENGTH, num_blocks=BLOCKS, log_path=DATA_DIR / "server-2048.log") as server:
            yield server
    except VLLMUnavailable as exc:
        pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")


def post(url: str, body: dict[str, Any]) -> Any:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.load(response)


def completion(server: VLLMServer, prompt: list[int]) -> Any:
    body = {"model": server.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    return post(f"{server.base_url}/v1/completions", body)["usage"]


def test_the_model_is_built_with_the_asked_length() -> None:
    try:
        folder = build_model(max_model_len=LENGTH)
    except VLLMUnavailable as exc:
        pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")
    config = json.loads((folder / "config.json").read_text())
    assert config["max_position_embeddings"] == LENGTH
    assert json.loads((folder / "tokenizer_config.json").read_text())["model_max_length"] == LENGTH


def test_a_prompt_of_1200_tokens_is_served_and_its_shared_prefix_reused(long_vllm: VLLMServer) -> None:
    with urllib.request.urlopen(f"{long_vllm.base_url}/v1/models", timeout=30) as response:
        assert json.load(response)["data"][0]["max_model_len"] == LENGTH
    first = [rng.randrange(1000, 30_000) for _ in range(1200)]
    changed_at = 1100  # inside block 34: blocks 0-33 shared
    second = [*first[:changed_at], *(rng.randrange(1000, 30_000) for _ in range(150))]
    cold = completion(long_vllm, first)
    assert (cold["prompt_tokens"], cold["prompt_tokens_details"]["cached_tokens"]) == (1200, 0)
    reused = completion(long_vllm, second)
    assert reused["prompt_tokens"] == 1250
    assert reused["prompt_tokens_details"]["cached_tokens"] == changed_at // BLOCK_SIZE * BLOCK_SIZE
