"""Which requests each client worker sends: as many as its streams would take in one process."""

from __future__ import annotations

import collections

from hypothesis import given
from hypothesis import strategies as st

from loadgen.load.schedule import concurrency_shares
from loadgen.workload.share import Share, request_cycle


def test_equal_shares_deal_the_requests_round_robin() -> None:
    cycle = request_cycle([2, 2, 2])
    assert cycle == [0, 1, 2, 0, 1, 2]
    assert list(Share.of(1, cycle).indices(20)) == [1, 4, 7, 10, 13, 16, 19]


def test_a_worker_with_fewer_streams_gets_fewer_requests() -> None:
    # 16 streams over 3 workers (6, 5, 5) and 48 requests: 3 for each stream, as in one process.
    # Dealt round-robin, worker 1 got 16 for its 5 streams: a fourth round of one request.
    shares = concurrency_shares(3, 16)
    cycle = request_cycle(shares)
    assert collections.Counter(cycle) == {0: 6, 1: 5, 2: 5}
    assert cycle[:6] == [0, 1, 2, 0, 1, 2]  # spread over the cycle, not in blocks
    counts = [len(list(Share.of(k, cycle).indices(48))) for k in range(3)]
    assert counts == [18, 15, 15]
    # the 1,024 streams of ten workers, 3,072 requests: three each
    shares = concurrency_shares(10, 1024)
    cycle = request_cycle(shares)
    assert [len(list(Share.of(k, cycle).indices(3072))) for k in range(10)] == [3 * s for s in shares if s]


def test_unlimited_concurrency_deals_round_robin() -> None:
    assert request_cycle([None, None]) == [0, 1]
    assert list(Share.of(0, request_cycle([None, None])).indices(5)) == [0, 2, 4]


@given(st.lists(st.integers(0, 40), min_size=1, max_size=8).filter(any), st.integers(0, 500))
def test_the_shares_hold_every_request_once_and_map_both_ways(shares: list[int], count: int) -> None:
    cycle = request_cycle(list(shares))
    assert len(cycle) == sum(shares)
    parts = [Share.of(k, cycle) for k in range(len(shares))]
    sent = [list(p.indices(count)) for p in parts]
    assert sorted(i for part in sent for i in part) == list(range(count))
    for p, mine in zip(parts, sent, strict=True):
        assert mine == sorted(mine)
        assert p.below(count) == len(mine)
        for j, i in enumerate(mine):
            assert p.index(j) == i
            assert p.position(i) == j
        assert all(p.position(i) is None for other in sent if other is not mine for i in other)
    # without end (a duration run): the same order, on past the count
    for p, mine in zip(parts, sent, strict=True):
        if mine:
            endless = p.indices(None)
            assert [next(endless) for _ in mine] == mine
