"""KV-cache sizing from model dimensions and vLLM's KV-cache dtype names."""

from __future__ import annotations

import re

import pytest

from app.domain.kvmemory import (
    KvCacheShape,
    bytes_per_element,
    kv_bytes_for_tokens,
    kv_bytes_per_token,
    parse_kv_shapes,
    tokens_that_fit,
)
from tests.support.captures import VLLM_CPU_FIXTURES

# The captured server's model (fixtures README): 2 layers, 2 KV heads, head_dim 64, bf16.
TINY = KvCacheShape(layers=2, kv_heads=2, head_dim=64, kv_cache_dtype="bfloat16")
GIB = 1 << 30


@pytest.mark.parametrize(
    ("name", "size"),
    [
        ("auto", 2),
        ("bfloat16", 2),
        ("float16", 2),
        ("float32", 4),
        ("fp8", 1),
        ("fp8_e4m3", 1),
        ("fp8_e5m2", 1),
    ],
)
def test_each_known_kv_cache_dtype_has_its_element_size(name: str, size: int) -> None:
    assert bytes_per_element(name) == size


@pytest.mark.parametrize("name", ["int8", "BFLOAT16", "fp4", ""])
def test_an_unknown_kv_cache_dtype_is_refused_with_the_known_names(name: str) -> None:
    with pytest.raises(ValueError, match=r"unknown KV-cache dtype .*known: auto, bfloat16"):
        bytes_per_element(name)


@pytest.mark.parametrize(
    ("shape", "per_token"),
    [
        (TINY, 1024),
        (KvCacheShape(layers=2, kv_heads=2, head_dim=64), 1024),  # "auto" is 16-bit
        (KvCacheShape(layers=32, kv_heads=8, head_dim=128, kv_cache_dtype="bfloat16"), 131072),
        (KvCacheShape(layers=32, kv_heads=8, head_dim=128, kv_cache_dtype="fp8"), 65536),
        (KvCacheShape(layers=1, kv_heads=1, head_dim=1, kv_cache_dtype="float32"), 8),
    ],
)
def test_a_token_takes_a_key_and_a_value_per_layer_and_head(shape: KvCacheShape, per_token: int) -> None:
    assert kv_bytes_per_token(shape) == per_token


@pytest.mark.parametrize(("tokens", "size"), [(0, 0), (1, 1024), (1536, 1_572_864)])
def test_bytes_for_tokens_scale_with_the_token_count(tokens: int, size: int) -> None:
    assert kv_bytes_for_tokens(TINY, tokens) == size


@pytest.mark.parametrize(
    ("budget", "tokens"),
    [(0, 0), (1023, 0), (1024, 1), (2047, 1), (GIB, 1_048_576)],
)
def test_only_whole_tokens_fit_in_a_byte_budget(budget: int, tokens: int) -> None:
    assert tokens_that_fit(TINY, budget) == tokens


def test_negative_token_counts_and_budgets_are_refused() -> None:
    with pytest.raises(ValueError, match="token count"):
        kv_bytes_for_tokens(TINY, -1)
    with pytest.raises(ValueError, match="byte budget"):
        tokens_that_fit(TINY, -1)


@pytest.mark.parametrize(("layers", "kv_heads", "head_dim"), [(0, 2, 64), (2, -1, 64), (2, 2, 0)])
def test_a_shape_needs_positive_dimensions(layers: int, kv_heads: int, head_dim: int) -> None:
    with pytest.raises(ValueError, match="must be positive"):
        KvCacheShape(layers=layers, kv_heads=kv_heads, head_dim=head_dim)


def test_a_shape_needs_a_known_dtype() -> None:
    with pytest.raises(ValueError, match="unknown KV-cache dtype"):
        KvCacheShape(layers=2, kv_heads=2, head_dim=64, kv_cache_dtype="int4")


def test_the_captured_servers_kv_cache_dtype_is_known() -> None:
    metrics = (VLLM_CPU_FIXTURES / "metrics-after.txt").read_text(encoding="utf-8")
    match = re.search(r'^vllm:cache_config_info\{(?:.*,)?cache_dtype="([^"]+)"', metrics, re.MULTILINE)
    assert match is not None

    shape = KvCacheShape(layers=2, kv_heads=2, head_dim=64, kv_cache_dtype=match.group(1))
    assert kv_bytes_per_token(shape) == 1024


def test_model_shapes_are_read_from_the_settings_text() -> None:
    shapes = parse_kv_shapes(" Qwen/Qwen3-8B=36:8:128 ; org/m=v:2=4:2:64:fp8;")
    assert shapes == {
        "Qwen/Qwen3-8B": KvCacheShape(36, 8, 128),
        "org/m=v:2": KvCacheShape(4, 2, 64, "fp8"),  # the shape follows the last "="
    }
    assert parse_kv_shapes("") == {}


@pytest.mark.parametrize("text", ["qwen", "qwen=36:8", "=36:8:128", "qwen=36:8:x", "qwen=36:8:128:int3"])
def test_a_shape_not_of_the_form_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_kv_shapes(text)
