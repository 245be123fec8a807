"""A diagnosis's losses are stored as JSON (RequestDiagnosis.losses) in one format: `Loss.to_json`
writes it, `Loss.from_json` reads it back, rows written before either existed included."""

from datetime import UTC, datetime

from app.domain.misses import CAUSE_LABELS, Cause, Loss, LossJson, cause_label

# As the diagnosis task wrote them before Loss had its own pair of functions (app/diagnosis/run.py).
STORED: list[LossJson] = [
    {"cause": "routed_elsewhere", "first_token": 0, "tokens": 192, "server_id": 7, "server_tokens": 192},
    {
        "cause": "evicted",
        "first_token": 192,
        "tokens": 64,
        "server_id": 3,
        "stored_at": "2026-03-01T10:00:00.123456+00:00",
        "removed_at": "2026-03-01T10:05:07+00:00",
    },
    {"cause": "below_block", "first_token": 256, "tokens": 8},
]


def test_stored_losses_read_back_typed_and_write_back_as_they_were() -> None:
    losses = [Loss.from_json(stored) for stored in STORED]

    assert losses[1] == Loss(
        Cause.EVICTED,
        first_token=192,
        tokens=64,
        server=3,
        stored_at=datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=UTC),
        removed_at=datetime(2026, 3, 1, 10, 5, 7, tzinfo=UTC),
    )
    assert (losses[0].server, losses[0].server_tokens, losses[2].server) == (7, 192, None)
    written = [loss.to_json() for loss in losses]
    assert written == STORED
    assert [list(loss) for loss in written] == [list(loss) for loss in STORED]  # in the same key order


def test_a_loss_holds_the_tokens_of_its_run() -> None:
    loss = Loss(Cause.SALT, first_token=16, tokens=32)
    assert (loss.end, loss.holds(15), loss.holds(16), loss.holds(47), loss.holds(48)) == (
        48,
        False,
        True,
        True,
        False,
    )


def test_every_cause_has_a_label_and_a_value_that_names_none_is_shown_as_itself() -> None:
    assert set(CAUSE_LABELS) == set(Cause)
    assert cause_label("salt") == "Tenant salt" and cause_label(Cause.EVICTED) == "Evicted"
    assert cause_label("gone_cause") == "gone_cause"
