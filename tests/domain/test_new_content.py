"""New content is not a loss: past where a template's prompts usually part, a request's own tokens
are `new_content`; `prompt_changed` only for a departure before that point (issue 27, section 0)."""

import random
from datetime import UTC, datetime, timedelta

from app.domain.blockhash import signed_block_hashes
from app.domain.fanout import QUANTILE, RELEARNED_FROM, FanOutPoints, LowQuantile
from app.domain.lossruns import main_cause, new_content_after
from app.domain.misscauses import FleetHistory
from app.domain.misses import Cause, Diagnosis, Loss, reusable_hit_rate
from app.domain.requestprompt import RequestPrompt

SIZE = 16
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
SYSTEM = random.Random(3).choices(range(50_000), k=320)  # 20 blocks every request shares


def prompt(seed: int, *, volatile_at: int | None = None) -> list[int]:
    own = random.Random(seed)
    tokens = SYSTEM + [own.randrange(50_000) for _ in range(own.randrange(40, 200))]
    if volatile_at is not None:  # a request id near the top
        tokens[volatile_at : volatile_at + 4] = [own.randrange(50_000) for _ in range(4)]
    return tokens


def diagnose(
    history: FleetHistory, tokens: list[int], n: int, *, cached: int = 320, salt: str = ""
) -> Diagnosis:
    """The request diagnosed, having reused `cached` tokens (the system prompt, by default)."""
    found = history.diagnose(
        RequestPrompt(
            server=1, arrived_at=T0 + timedelta(seconds=n), block_size=SIZE, prompt_tokens=len(tokens),
            cached_tokens=cached, block_hashes=signed_block_hashes(tokens, SIZE, cache_salt=salt or None),
            neutral_hashes=signed_block_hashes(tokens, SIZE) if salt else (), salt=salt, family="support",
            token_ids=tokens, kv_events=False,
        )
    )  # fmt: skip
    assert isinstance(found, Diagnosis)
    return found


def test_a_request_whose_stable_part_matched_loses_nothing_to_its_own_question() -> None:
    history = FleetHistory()
    diagnose(history, prompt(0), 0, cached=0)
    first = diagnose(history, prompt(1), 1)  # nothing known yet of where the template's prompts part
    assert first.cause == Cause.PROMPT_CHANGED and first.diverged_at == 320
    found = diagnose(history, prompt(2), 2)
    assert found.cause == Cause.NEW_CONTENT
    assert [(loss.cause, loss.first_token) for loss in found.losses][:1] == [(Cause.NEW_CONTENT, 320)]
    assert Cause.PROMPT_CHANGED not in found.tokens_by_cause() and found.diverged_at is None


def test_a_volatile_token_in_the_stable_part_is_a_change_up_to_the_fan_out_point() -> None:
    history = FleetHistory()
    for n in range(RELEARNED_FROM + 1):
        diagnose(history, prompt(n), n, cached=320 if n else 0)
    found = diagnose(history, prompt(99, volatile_at=40), 99, cached=32)
    assert found.cause == Cause.PROMPT_CHANGED and found.diverged_at == 40
    lost = found.tokens_by_cause()
    assert lost[Cause.PROMPT_CHANGED] == 320 - 32  # from the block holding token 40 to the stable end
    assert lost[Cause.NEW_CONTENT] > 0


def test_a_template_left_volatile_at_its_top_reads_changed_in_every_generation() -> None:
    """A request id near the top, for generation after generation: each request goes on with the
    system prompt its family's earlier prompts held, so its departure is a volatile token's and never
    teaches the point; the system prompt after it stays a loss (the recorded demo's second round read
    the whole of `support`'s as new content once the history had turned)."""
    history = FleetHistory()
    for n in range(RELEARNED_FROM + 1):
        diagnose(history, prompt(n), n, cached=320 if n else 0)
    for generation in range(3):
        changed = [
            diagnose(history, prompt(n, volatile_at=40), n, cached=32)
            for n in range(100 * (generation + 1), 100 * (generation + 1) + 100)
        ]
        assert all(found.cause == Cause.PROMPT_CHANGED for found in changed), generation
        assert {found.tokens_by_cause()[Cause.PROMPT_CHANGED] for found in changed} == {320 - 32}
        history.turn()


HEADER = random.Random(4).choices(range(50_000), k=20)  # "Current time: 2026-12-07T" and the date's tokens


def shifted(seed: int) -> list[int]:
    """The time and a request id at the top, of varying token length after the header they share:
    the system prompt after it moves off the block boundaries (the recorded demo's `support`, whose
    second round read 95 % new once its departures at its first blocks had taught the point)."""
    own = random.Random(seed)
    return HEADER + own.choices(range(50_000), k=own.randrange(9, 30)) + prompt(seed)


def test_a_volatile_span_of_varying_length_at_the_top_reads_changed_in_every_generation() -> None:
    history = FleetHistory()
    for n in range(RELEARNED_FROM + 1):
        diagnose(history, prompt(n), n, cached=320 if n else 0)
    for generation in range(3):
        changed = [
            diagnose(history, shifted(n), n, cached=16 if n > 100 else 0)
            for n in range(100 * (generation + 1), 100 * (generation + 1) + 100)
        ]
        assert all(found.cause == Cause.PROMPT_CHANGED for found in changed), generation
        lost = [found.tokens_by_cause()[Cause.PROMPT_CHANGED] for found in changed]
        assert min(lost) >= 320 - SIZE, generation  # from the header's end to the fan-out point
        history.turn()


def test_a_template_volatile_under_a_salt_it_never_had_healthy_reads_changed_after_the_turn() -> None:
    """The demo's acme rotates its salt while `support` is volatile: under the new salt no healthy
    prompt was ever seen, and the text its departures go on with is the template's, learned under
    the old salt (the demo's second round read the system prompt new until this held)."""
    history = FleetHistory()
    for n in range(RELEARNED_FROM + 1):
        diagnose(history, prompt(n), n, cached=320 if n else 0, salt="acme-2026")
    for generation in range(2):
        changed = [
            diagnose(history, shifted(n), n, cached=16 if n > 100 else 0, salt="acme-2026-rotated")
            for n in range(100 * (generation + 1), 100 * (generation + 1) + 100)
        ]
        first = changed.pop(0) if generation == 0 else None
        assert first is None or first.cause == Cause.COLD  # the first prompt under its salt
        assert all(found.cause == Cause.PROMPT_CHANGED for found in changed), generation
        history.turn()


def test_a_template_whose_stable_part_got_shorter_is_learned_again_at_the_turn() -> None:
    """A shorter system prompt, then each request's own question: those departures go on with
    content of their own, so they teach the point, and once the history turns the question is new
    content again (within the generation the point only deepens: the change reads as one)."""
    history = FleetHistory()
    for n in range(RELEARNED_FROM + 1):
        diagnose(history, prompt(n), n, cached=320 if n else 0)

    def shorter(seed: int) -> list[int]:
        return SYSTEM[:160] + prompt(seed)[320:]

    changed = [diagnose(history, shorter(n), n, cached=160) for n in range(100, 200)]
    assert all(found.cause == Cause.PROMPT_CHANGED for found in changed)
    history.turn()
    found = diagnose(history, shorter(300), 300, cached=160)
    assert found.cause == Cause.NEW_CONTENT
    assert [(loss.cause, loss.first_token) for loss in found.losses][:1] == [(Cause.NEW_CONTENT, 160)]


def test_the_point_is_a_low_quantile_of_departures_so_conversations_turns_stay_new_content() -> None:
    points = FanOutPoints()
    for turn in range(RELEARNED_FROM * 2):
        points.departed("chat", 320 + 64 * (turn % 8))  # the system prompt, then deeper turns
    points.departed("chat", 48)  # one tenant's branch of the template, once
    assert points.point("chat") == 320 and points.point("other") is None


def test_the_running_quantile_is_the_sorted_departures_quantile_at_every_step() -> None:
    """LowQuantile against the definition (the smallest departure with at least QUANTILE of them at
    or before it), after each of 2,000 departures: deepening turns, repeats and early outliers."""
    rng, running, seen = random.Random(27), LowQuantile(), []
    for n in range(2000):
        at_token = rng.choice([rng.randrange(0, 64), 320 + 16 * (n % 40), 320, rng.randrange(0, 4000)])
        seen.append(at_token)
        wanted = len(seen) * QUANTILE
        expected = next(v for i, v in enumerate(sorted(seen), 1) if i >= wanted)
        assert running.add(at_token) == expected == running.value, n


def test_a_run_across_the_point_is_split_and_new_content_runs_merge() -> None:
    losses = [Loss(Cause.PROMPT_CHANGED, 32, 96), Loss(Cause.COLD, 128, 64), Loss(Cause.BELOW_BLOCK, 192, 7)]
    found = new_content_after(losses, 96)
    assert found == [
        Loss(Cause.PROMPT_CHANGED, 32, 64),
        Loss(Cause.NEW_CONTENT, 96, 96),
        Loss(Cause.BELOW_BLOCK, 192, 7),
    ]
    assert main_cause(found, reusable=12) == Cause.PROMPT_CHANGED
    assert main_cause(new_content_after(losses, 0), reusable=12) == Cause.NEW_CONTENT
    evicted = [Loss(Cause.EVICTED, 32, 96)]
    assert new_content_after(evicted, 0) == evicted  # a repeated tail evicted is a real loss


def test_the_reusable_hit_rate_leaves_out_what_no_cache_could_reuse() -> None:
    by_cause = {"new_content": 300, "below_block": 100, "evicted": 100}
    assert reusable_hit_rate(prompt_tokens=1000, reused_tokens=500, by_cause=by_cause) == 500 / 600
    assert reusable_hit_rate(prompt_tokens=100, reused_tokens=0, by_cause={"new_content": 100}) is None
