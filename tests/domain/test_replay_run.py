"""The replay engine: a trace through per-server block pools, routed, waiting for blocks when full."""

from app.domain.replay.routing import Routing
from app.domain.replay.run import ServerShape, Setup, replay
from app.domain.replay.trace import TraceRequest, token_chain

BS = 4


def request(
    n: int, tokens: list[int], *, server: str = "a", at: float | None = None, **kw: object
) -> TraceRequest:
    return TraceRequest(
        request_id=f"r{n}", arrived=float(n) if at is None else at, prompt_tokens=len(tokens), server=server,
        token_ids=tuple(tokens), **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def setup(*blocks: int, routing: Routing = Routing.RECORDED, salted: bool = True) -> Setup:
    servers = tuple(ServerShape(name, count) for name, count in zip("abcd", blocks, strict=False))
    return Setup(servers, BS, routing, salted=salted)


PREFIX = list(range(100, 112))  # three blocks


def test_a_repeated_prefix_is_reused_in_whole_blocks_never_the_last_token() -> None:
    trace = [request(0, [*PREFIX, 1, 2]), request(1, [*PREFIX, 3, 4, 5]), request(2, PREFIX)]

    result = replay(trace, setup(64))

    # The third prompt is the prefix alone: its last token is computed, so two blocks of three.
    assert result.reused == [0, 12, 8]
    assert result.hit_rate == 20 / (14 + 15 + 12)


def test_recorded_routing_keeps_servers_apart_and_prefix_aware_brings_them_together() -> None:
    trace = [request(n, [*PREFIX, n], server="ab"[n % 2]) for n in range(6)]

    recorded = replay(trace, setup(64, 64))
    aware = replay(trace, setup(64, 64, routing=Routing.PREFIX_AWARE))

    assert recorded.servers == [0, 1, 0, 1, 0, 1]
    assert recorded.reused == [0, 0, 12, 12, 12, 12]
    assert aware.reused == [0, 12, 12, 12, 12, 12]


def test_a_small_pool_evicts_the_older_prefix_first() -> None:
    other = list(range(200, 212))
    trace = [request(0, [*PREFIX, 1]), request(1, [*other, 1]), request(2, [*PREFIX, 2])]

    # 5 usable blocks: the second prompt's four evict the first's blocks from its tail.
    assert replay(trace, setup(6)).reused == [0, 0, 4]
    assert replay(trace, setup(9)).reused == [0, 0, 12]


def test_a_request_waits_for_blocks_held_by_a_running_one() -> None:
    long = list(range(300, 320))  # five blocks, held for 10 s
    trace = [request(0, long, held_seconds=10.0), request(1, [*PREFIX, 1], at=1.0)]

    result = replay(trace, setup(7))  # 6 usable blocks: the second needs 4

    assert result.waited == [0.0, 9.0]


def test_a_prompt_larger_than_the_pool_is_unfit_and_reuses_nothing() -> None:
    result = replay([request(0, list(range(40)))], setup(4))

    assert result.unfit == 1 and result.reused == [0]


def test_salts_keep_tenants_apart_unless_dropped() -> None:
    trace = [request(n, [*PREFIX, n], salt=f"tenant-{n}") for n in range(2)]

    assert replay(trace, setup(64)).reused == [0, 0]
    assert replay(trace, setup(64, salted=False)).reused == [0, 12]


def test_the_engines_hashes_are_used_at_their_block_size_and_tokens_at_another() -> None:
    hashes = token_chain([*PREFIX, 1], BS, scope="engine")
    trace = [
        TraceRequest(
            "x", 0.0, 13, server="a", block_size=BS, block_hashes=hashes, token_ids=tuple([*PREFIX, 1])
        ),
        TraceRequest(
            "y", 1.0, 13, server="a", block_size=BS, block_hashes=hashes, token_ids=tuple([*PREFIX, 2])
        ),
    ]

    assert replay(trace, setup(64)).reused == [0, 12]
    assert replay(trace, Setup((ServerShape("a", 64),), 6)).reused == [0, 12]  # two blocks of six


def test_a_request_with_neither_hashes_nor_tokens_takes_room_and_shares_nothing() -> None:
    trace = [TraceRequest("x", 0.0, 12, server="a"), TraceRequest("y", 1.0, 12, server="a")]

    assert replay(trace, setup(64)).reused == [0, 0]
