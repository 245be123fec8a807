"""KV-cache memory: bytes per token for standard (multi-head or grouped-query) attention.

Not for MLA or hybrid attention/Mamba models, whose KV layout differs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

# "auto" stores KV in the model's dtype; the models served with it are 16-bit in
# practice. Pass the model's dtype name instead when it is float32.
KV_CACHE_DTYPE_BYTES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "auto": 2,
        "bfloat16": 2,
        "float16": 2,
        "float32": 4,
        "fp8": 1,
        "fp8_e4m3": 1,
        "fp8_e5m2": 1,
    }
)


def bytes_per_element(kv_cache_dtype: str) -> int:
    """Return the bytes of one KV element for a vLLM ``--kv-cache-dtype`` name.

    Names are matched exactly, as vLLM spells them. Raises ValueError for any other.
    """
    try:
        return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]
    except KeyError:
        known = ", ".join(sorted(KV_CACHE_DTYPE_BYTES))
        msg = f"unknown KV-cache dtype {kv_cache_dtype!r}; known: {known}"
        raise ValueError(msg) from None


@dataclass(frozen=True, slots=True)
class KvCacheShape:
    """The model dimensions that size its KV cache.

    Raises ValueError for a non-positive dimension or an unknown dtype name.
    """

    layers: int
    kv_heads: int
    head_dim: int
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for name in ("layers", "kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        bytes_per_element(self.kv_cache_dtype)


def kv_bytes_per_token(shape: KvCacheShape) -> int:
    """Return the KV-cache bytes one token takes: a key and a value per layer and head."""
    per_element = bytes_per_element(shape.kv_cache_dtype)
    return 2 * shape.layers * shape.kv_heads * shape.head_dim * per_element


def kv_bytes_for_tokens(shape: KvCacheShape, tokens: int) -> int:
    """Return the KV-cache bytes ``tokens`` tokens take. Raises ValueError if tokens < 0."""
    if tokens < 0:
        raise ValueError(f"a token count cannot be negative, got {tokens}")
    return tokens * kv_bytes_per_token(shape)


def tokens_that_fit(shape: KvCacheShape, budget_bytes: int) -> int:
    """Return how many whole tokens' KV fits in ``budget_bytes`` (rounded down).

    Raises ValueError if budget_bytes < 0.
    """
    if budget_bytes < 0:
        raise ValueError(f"a byte budget cannot be negative, got {budget_bytes}")
    return budget_bytes // kv_bytes_per_token(shape)


def parse_kv_shapes(text: str) -> dict[str, KvCacheShape]:
    """Model KV shapes from ``model=layers:kv_heads:head_dim[:kv_cache_dtype]`` items separated by
    ``;`` (a model name may hold ``/``, ``:`` and ``=``: the shape is what follows its last ``=``).

    Raises ValueError, naming the item, for one that is not of that form.
    """
    shapes: dict[str, KvCacheShape] = {}
    for item in filter(None, (part.strip() for part in text.split(";"))):
        model, _, shape = item.rpartition("=")
        parts = shape.split(":")
        if not model or len(parts) not in (3, 4) or not all(p.isdigit() for p in parts[:3]):
            raise ValueError(f"{item!r} is not model=layers:kv_heads:head_dim[:kv_cache_dtype]")
        layers, kv_heads, head_dim = (int(p) for p in parts[:3])
        dtype = parts[3] if len(parts) == 4 else "auto"
        shapes[model.strip()] = KvCacheShape(layers, kv_heads, head_dim, dtype)
    return shapes
