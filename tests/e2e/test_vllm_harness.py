"""The vLLM CPU harness' parameters, without starting vLLM: the flags and model folder they give."""

from tests.support.vllm_cpu import MAX_MODEL_LEN, MODEL_DIR, NUM_BLOCKS, _server_flags, model_dir_for


def flag(flags: list[str], name: str) -> str:
    return flags[flags.index(name) + 1]


def test_the_server_is_started_with_the_asked_length_and_cache_blocks() -> None:
    flags = _server_flags("http://127.0.0.1:1/v1/traces", 2, 3, "kv", max_model_len=2048, num_blocks=96)
    assert (flag(flags, "--max-model-len"), flag(flags, "--num-gpu-blocks-override")) == ("2048", "96")
    assert model_dir_for(2048) != model_dir_for(MAX_MODEL_LEN) == MODEL_DIR  # built apart


def test_the_defaults_are_the_fixtures_recipe() -> None:
    flags = _server_flags(
        otlp_endpoint="http://127.0.0.1:1/v1/traces",
        kv_port=2,
        replay_port=3,
        topic="kv",
        max_model_len=MAX_MODEL_LEN,
        num_blocks=NUM_BLOCKS,
    )
    assert (flag(flags, "--max-model-len"), flag(flags, "--num-gpu-blocks-override")) == ("512", "48")
