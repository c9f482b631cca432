"""What a test's own engine leaves behind, by process id and name prefix, never by comparing
the whole machine (another engine on the same host is not ours)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from loadgen.servers.launch import group_members
from loadgen.servers.leftovers import SCRATCH_PREFIX, shared_memory_of


def engine_shared_memory(engine_pid: int) -> set[Path]:
    """The /dev/shm files the engine's process group maps now."""
    return shared_memory_of(group_members(engine_pid))


def scratch_dirs(loadgen_pid: int) -> list[Path]:
    """The engine directories that loadgen process made in the temporary directory."""
    return sorted(Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}{loadgen_pid}-*"))


def left_of(shared: set[Path], loadgen_pid: int) -> list[Path]:
    """Of what the engine held, what is still there: its shared memory and its directory."""
    return sorted(p for p in shared if p.exists()) + scratch_dirs(loadgen_pid)
