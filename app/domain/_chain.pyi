# The signature of the C extension built from _chain.c (see its header comment).
from collections.abc import Container, Sequence

import numpy as np
import numpy.typing as npt
from typing_extensions import Buffer

def chain_digests(
    ids: npt.NDArray[np.int64],
    block_size: int,
    array_head: bytes,
    first_tail: bytes,
    later_tail: bytes,
    seed: bytes,
    /,
) -> bytes: ...
def leading(keys: Sequence[object], holding: Container[object], /) -> int: ...
def json_token_ids(raw: Buffer, /) -> bytes | None: ...
