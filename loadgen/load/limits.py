"""The client's own limits, checked before a run: a connection per request in flight needs a
file descriptor, and running out mid-run would look like the server refusing connections."""

from __future__ import annotations

import errno
import resource

from loadgen.errors import UsageError
from loadgen.scenario.matrix import Cell, SearchLine

# descriptors the client holds besides its connections (run directory files, probes, workers' pipes)
SPARE_FDS = 64
# what the client, not the server, ran out of when a connection cannot be opened
CLIENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connections_needed(cells: list[Cell], lines: list[SearchLine]) -> int:
    """The most requests any cell (or probe) can have in flight at once."""
    most = 1
    for cell in cells:
        most = max(most, cell.in_flight_max)
    for line in lines:
        search, w = line.search, line.point.workload
        cap = line.point.load.concurrency[0]
        most = max(most, int(search.max) if search.by == "concurrency" else (cap or w.num_prompts))
    return most


def ensure_fd_limit(connections: int) -> int:
    """Raise the soft open-file limit to what ``connections`` need (up to the hard limit);
    refuse a load the hard limit cannot hold. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = connections + SPARE_FDS
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(hard, max(needed, soft))
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        raise UsageError(
            f"{connections} requests in flight need about {needed} open files, and this process may open "
            f"{soft} (ulimit -n; hard limit {hard}): raise the limit (ulimit -n {needed}) or lower the concurrency"
        )
    return soft
