"""A deploy's own test: a version's warm requests against the version before it."""

import random
from datetime import UTC, datetime, timedelta

from app.domain.changepoints import DetectionConfig
from app.domain.deploys import DeployTest, RequestReuse, version_change, warm

START = datetime(2026, 12, 5, 10, 0, 30, tzinfo=UTC)
PLACEMENTS = [(server, salt) for server in range(4) for salt in ("acme", "")]
CONFIG, TEST = DetectionConfig(), DeployTest(min_requests=20, looks=60)


def requests(
    count: int, rate: float, *, start: float = 0.0, cold: float | None = None, seed: int = 0
) -> list[RequestReuse]:
    """`count` requests a second apart over the placements in turn, each reusing about `rate` of its
    prompt; each placement's first reuses `cold` of it when given (a new version's first there)."""
    noise = random.Random(seed)
    found, seen = [], set()
    for index in range(count):
        placement = PLACEMENTS[noise.randrange(len(PLACEMENTS))]
        prompt = noise.randint(300, 500)
        share = cold if cold is not None and placement not in seen else rate + noise.uniform(-0.03, 0.03)
        seen.add(placement)
        at = START + timedelta(seconds=start + index)
        found.append(RequestReuse(at, placement, prompt, round(prompt * min(max(share, 0.0), 1.0))))
    return found


def test_each_placements_first_request_is_a_cold_start_left_out() -> None:
    sent = requests(40, 0.9, cold=0.0)
    kept = warm(sent)
    assert len(kept) == len(sent) - len({r.placement for r in sent})
    assert all(r.reused_tokens > 0 for r in kept)


def test_a_harmless_edit_is_no_regression_though_its_first_requests_miss() -> None:
    before = requests(200, 0.9, seed=1)
    after = requests(60, 0.9, start=200, cold=0.05, seed=2)
    change = version_change(before, after, CONFIG, TEST)
    assert change is not None and not change.is_regression
    assert abs(change.drop) < 0.05


def test_a_volatile_line_is_a_sure_regression_from_twenty_warm_requests() -> None:
    before = requests(200, 0.95, seed=3)
    after = requests(28, 0.3, start=200, cold=0.0, seed=4)
    change = version_change(before, after, CONFIG, TEST)
    assert change is not None and change.is_regression and change.confidence > 0.999
    assert abs(change.rate_before - 0.95) < 0.01 and abs(change.rate_after - 0.3) < 0.02
    assert change.minute == after[0].arrived_at.replace(second=0)


def test_too_few_warm_requests_say_nothing_yet() -> None:
    before = requests(200, 0.95, seed=5)
    after = requests(len(PLACEMENTS) + 10, 0.3, start=200, cold=0.0, seed=6)
    assert version_change(before, after, CONFIG, TEST) is None


def test_a_small_drop_on_scattered_requests_is_not_sure_enough() -> None:
    before = [RequestReuse(r.arrived_at, r.placement, r.prompt_tokens, r.prompt_tokens * (i % 2))
              for i, r in enumerate(requests(40, 0.5, seed=7))]  # fmt: skip
    after = [RequestReuse(r.arrived_at, r.placement, r.prompt_tokens, r.prompt_tokens * (i % 4 == 0))
             for i, r in enumerate(requests(40, 0.5, start=40, seed=8))]  # fmt: skip
    change = version_change(before, after, CONFIG, TEST)
    assert change is not None and change.material and change.confidence < CONFIG.min_confidence
