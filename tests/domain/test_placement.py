"""The share of a group's requests that stayed on the servers it landed on before: what confirms a
routing change."""

import pytest

from app.domain.placement import share_stayed


def test_a_group_kept_on_its_server_stayed_wholly() -> None:
    assert share_stayed({"a": {0: 40}}, {"a": {0: 30}}, min_requests=10) == 1.0


def test_round_robin_over_four_servers_keeps_a_quarter_where_it_was() -> None:
    before = {"a": {0: 40}, "b": {1: 40}}
    after = {"a": {0: 10, 1: 10, 2: 10, 3: 10}, "b": {0: 5, 1: 5, 2: 5, 3: 5}}
    assert share_stayed(before, after, min_requests=10) == pytest.approx(0.25)


def test_a_group_moved_wholly_elsewhere_stayed_nowhere() -> None:
    assert share_stayed({"a": {0: 40}}, {"a": {2: 40}}, min_requests=10) == 0.0


def test_random_routing_that_stays_random_stays_in_proportion() -> None:
    before = {"a": {0: 25, 1: 25, 2: 25, 3: 25}}
    after = {"a": {0: 20, 1: 30, 2: 25, 3: 25}}
    assert share_stayed(before, after, min_requests=10) == pytest.approx(0.95)


def test_groups_are_weighted_by_their_requests_after() -> None:
    before = {"a": {0: 40}, "b": {1: 40}}
    after = {"a": {0: 30}, "b": {2: 10}}  # a stayed (30 requests), b moved (10)
    assert share_stayed(before, after, min_requests=10) == pytest.approx(0.75)


def test_thin_groups_are_left_out_and_none_left_says_nothing() -> None:
    before = {"a": {0: 40}, "thin": {1: 3}}
    after = {"a": {0: 20}, "thin": {2: 20}, "new": {3: 50}}  # `new` had no requests before
    assert share_stayed(before, after, min_requests=10) == 1.0
    assert share_stayed({"thin": {1: 3}}, {"thin": {2: 20}}, min_requests=10) is None
