"""The token-retention rule: one definition for request records and pasted prompts alike."""

from datetime import UTC, datetime, timedelta

import pytest

from app.domain.retention import keeps_token_ids, token_ids_cutoff

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("days", "hash_only", "cutoff"),
    [
        (7, False, NOW - timedelta(days=7)),
        (7, True, None),  # hash-only mode keeps none, whatever the days
        (0, False, None),  # 0 days keeps none (some copies of the rule once kept those of `now`)
    ],
)
def test_the_cutoff_follows_the_days_and_hash_only_mode(
    days: int, hash_only: bool, cutoff: datetime | None
) -> None:
    assert token_ids_cutoff(NOW, days=days, hash_only=hash_only) == cutoff


def test_token_ids_are_kept_from_the_cutoff_on() -> None:
    cutoff = token_ids_cutoff(NOW, days=7, hash_only=False)
    assert keeps_token_ids(NOW - timedelta(days=7), cutoff)
    assert not keeps_token_ids(NOW - timedelta(days=7, seconds=1), cutoff)
    assert not keeps_token_ids(NOW, None)
