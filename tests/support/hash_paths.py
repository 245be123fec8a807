"""The three ways a block-hash chain is computed (app/domain/blockhash.py), for tests to run each."""

import sys

import pytest

from app.domain import blockhash

HASH_PATHS = ["cbor2", "numpy", "c"]


def use_hash_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Hash chains from here on by ``path``: in Python with each block's ids CBOR-encoded by "cbor2"
    (as a short prompt's are) or by "numpy" (a long one's), or by "c" (app/domain/_chain.c, what an
    install with a C compiler runs; skipped where it was not built)."""
    if path == "c":
        if not blockhash.hashes_in_c():
            pytest.skip("app/domain/_chain.c was not built (no C compiler at install)")
        return
    monkeypatch.setattr(blockhash, "_native", None)
    monkeypatch.setattr(blockhash, "_NUMPY_BLOCKS", 1 if path == "numpy" else sys.maxsize)
