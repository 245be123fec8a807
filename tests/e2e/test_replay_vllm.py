"""The replay against the real vLLM CPU server (issue 26): one trace of prompts with shared prefixes
(tests/support/replay_vllm.py) sent one at a time to a fresh server at two
`--num-gpu-blocks-override` values, both small enough to evict.

Calibration: each trace replayed at the blocks it was served with gives the server's hit rate within
2 points. Prediction: the trace gathered at the first override, replayed at the second's blocks,
gives within 3 points what the server at the second override reused of the same prompts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from app.domain.replay.trace import TraceRequest
from tests.support.replay_vllm import hit_rate, predicted, send_trace, truth_prompts
from tests.support.vllm_cpu import DATA_DIR, VLLMUnavailable, serve

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1800)]
SMALL, LARGE = 24, 40  # blocks counting the null block: about 40 % and 63 % reused, both evicting

Traces = dict[int, tuple[TraceRequest, ...]]


@pytest.fixture(scope="module")
def traces() -> Iterator[Traces]:
    """The same prompts through a fresh server at each override, one server at a time."""
    prompts = truth_prompts()
    gathered: Traces = {}
    try:
        for blocks in (SMALL, LARGE):
            with serve(num_blocks=blocks, log_path=DATA_DIR / f"server-replay-{blocks}.log") as server:
                gathered[blocks] = send_trace(server, prompts, name=f"vllm-{blocks}")
    except VLLMUnavailable as exc:
        pytest.skip(f"vLLM CPU server unavailable: {exc.reason}")
    yield gathered


@pytest.mark.parametrize("blocks", [SMALL, LARGE])
def test_calibration_replays_what_the_server_reused(traces: Traces, blocks: int) -> None:
    trace = traces[blocks]

    rate, reused = predicted(trace, num_blocks=blocks, block_size=trace[0].block_size)

    assert abs(rate - hit_rate(trace)) <= 2, (rate, hit_rate(trace))
    assert sum(r.cached_tokens != 0 for r in trace) >= len(trace) // 4  # hits to calibrate against
    exact = sum(r.cached_tokens == mine for r, mine in zip(trace, reused, strict=True)) / len(trace)
    assert exact >= 0.9, exact


def test_the_replay_predicts_the_server_at_the_other_override(traces: Traces) -> None:
    small, large = traces[SMALL], traces[LARGE]
    assert [r.token_ids for r in small] == [r.token_ids for r in large]  # one trace, two caches

    rate, _ = predicted(small, num_blocks=LARGE, block_size=small[0].block_size)

    assert hit_rate(large) - hit_rate(small) > 10  # the two overrides differ: a prediction to make
    assert abs(rate - hit_rate(large)) <= 3, (rate, hit_rate(large))
