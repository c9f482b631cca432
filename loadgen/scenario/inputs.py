"""Files a user names, read with bounds: a plain file only (a FIFO or a device such as /dev/zero
may never end, and a run that reads one cannot be stopped), and no larger than what it is."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from loadgen.errors import ScenarioError

SCENARIO_MAX_BYTES = 16 << 20  # a scenario is a few kB; this is far past any
TOOLS_MAX_BYTES = 16 << 20  # a tools array sent with every request (a 51 MB one took 17 s to stop)
SESSIONS_MAX_BYTES = 1 << 30  # agent sessions, read whole before the run


def not_plain(path: Path) -> str | None:
    """Why ``path`` is not a plain file to read, or None; follows links (the target is read)."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        return f"cannot read it ({exc.strerror or exc})"
    if stat.S_ISDIR(mode):
        return "a directory, not a file"
    if not stat.S_ISREG(mode):
        return "not a plain file (a FIFO or a device may never end): give a file"
    return None


def read_input(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of ``path``, a plain file of at most ``max_bytes``; ``ScenarioError`` naming it
    and what it should be otherwise. Opened without blocking: a FIFO put there after a check
    fails here instead of waiting for a writer."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ScenarioError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScenarioError(f"{path}: not a plain file (a FIFO or a device may never end); "
                                f"give the {what} as a file")
        if st.st_size > max_bytes:
            raise ScenarioError(f"{path}: {st.st_size / 2**20:,.1f} MiB, over the {max_bytes >> 20} MiB "
                                f"a {what} may be")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:  # (grown while read)
        raise ScenarioError(f"{path}: over the {max_bytes >> 20} MiB a {what} may be")
    return data
