"""Nothing of an engine outlives it: its temporary files and its shared memory.

An engine gets a temporary directory of its own (``TMPDIR``), removed when it stops: vLLM's
``vllm_dist_*`` rendezvous files and its IPC sockets land there, never in the shared ``/tmp``.
torch's compile cache keeps its usual place, so later starts still reuse it. The shared memory
segments and semaphores in ``/dev/shm`` that the engine's processes map are noted while they
run (by process id, never by comparing the whole machine's ``/dev/shm``) and unlinked once the
group is gone, so an engine that was killed leaves none behind. A directory whose loadgen was
itself killed is removed by the next engine start.
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import tempfile
from pathlib import Path

from loadgen.results.files import pid_alive

SCRATCH_PREFIX = "loadgen-engine-"
SHM = Path("/dev/shm")


def new_scratch() -> Path:
    """A fresh temporary directory for one engine, named after this loadgen's process id."""
    sweep_stale()
    return Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-"))


def scratch_env(scratch: Path) -> dict[str, str]:
    """The engine's environment additions: its own TMPDIR, torch's compile cache where it was."""
    env = {"TMPDIR": str(scratch)}
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        with contextlib.suppress(KeyError, OSError):
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tempfile.gettempdir()) / f"torchinductor_{getpass.getuser()}")
    return env


def sweep_stale() -> list[Path]:
    """Remove the engine directories whose loadgen is gone (it was killed before it could)."""
    removed = []
    root = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for path in root.glob(f"{SCRATCH_PREFIX}*"):
            owner = path.name.removeprefix(SCRATCH_PREFIX).split("-", 1)[0]
            if owner.isdigit() and not pid_alive(int(owner)) and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed


def shared_memory_of(pids: list[int]) -> set[Path]:
    """The files in /dev/shm that the processes map or hold open (deleted ones aside)."""
    out: set[Path] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
                if path.startswith(f"{SHM}/") and not path.endswith("(deleted)"):
                    out.add(Path(path))
        with contextlib.suppress(OSError):
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                with contextlib.suppress(OSError):
                    target = str(fd.readlink())
                    if target.startswith(f"{SHM}/") and not target.endswith("(deleted)"):
                        out.add(Path(target))
    return out


def remove(scratch: Path | None, shared: set[Path]) -> list[Path]:
    """After the engine's group is gone: its directory, and what it left in /dev/shm."""
    left = []
    if scratch is not None and scratch.is_dir():
        shutil.rmtree(scratch, ignore_errors=True)
        left.append(scratch)
    for path in sorted(shared):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            path.unlink()
            left.append(path)
    return left
