"""Which of a run's requests each client worker sends (``load.workers``).

In one process, C streams take the run's requests in turn: with a closed loop each stream sends
about count / C of them. Workers split the streams (``concurrency_shares``), and the requests
must follow the streams, not the workers: dealt round-robin, a worker with one stream fewer than
another got as many requests, and its last ones ran in a round of their own after everyone
else's (1,024 streams, 3,072 requests, 10 workers: six of them ran a fourth round of one
request each, and the run lasted a third longer than in one process).

So the requests are dealt in cycles of C: in each, worker k has as many as it has streams,
spread evenly over the cycle (with equal shares, worker k of W sends k, k + W, k + 2W, ...).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterator


def request_cycle(shares: list[int | None]) -> list[int]:
    """The worker of each request of one cycle: as many for worker k as ``shares[k]`` streams,
    spread evenly; unlimited shares (None) or none at all: one each, round-robin."""
    if any(s is None for s in shares) or not any(shares):
        return list(range(len(shares)))
    # worker k's j-th request of the cycle falls at (j + 1/2) / share_k of it; ties in worker order
    places = sorted(((j + 0.5) / s, k) for k, s in enumerate(shares) if s for j in range(s))
    return [k for _, k in places]


class Share:
    """The requests one worker sends: in each cycle of ``cycle`` requests, those at ``slots``.
    Its ``j``-th request is the run's request ``index(j)``."""

    __slots__ = ("_at", "cycle", "slots")

    def __init__(self, slots: tuple[int, ...], cycle: int) -> None:
        self.slots, self.cycle = tuple(sorted(slots)), cycle
        self._at = {s: n for n, s in enumerate(self.slots)}

    @classmethod
    def of(cls, worker: int, cycle: list[int]) -> Share:
        """Worker ``worker``'s share of ``request_cycle``'s cycle."""
        return cls(tuple(n for n, k in enumerate(cycle) if k == worker), len(cycle))

    def index(self, j: int) -> int:
        turn, at = divmod(j, len(self.slots))
        return turn * self.cycle + self.slots[at]

    def position(self, i: int) -> int | None:
        """Where the run's request ``i`` is in this share (None: another worker's)."""
        turn, slot = divmod(i, self.cycle)
        at = self._at.get(slot)
        return None if at is None or i < 0 else turn * len(self.slots) + at

    def below(self, n: int) -> int:
        """How many of this share's requests come before the run's request ``n``."""
        turn, slot = divmod(n, self.cycle)
        return turn * len(self.slots) + bisect.bisect_left(self.slots, slot)

    def indices(self, count: int | None) -> Iterator[int]:
        """The run's requests this share sends, in order (of ``count``; None: without end)."""
        if not self.slots:
            return iter(())
        every = map(self.index, itertools.count())
        return every if count is None else itertools.islice(every, self.below(count))
