"""Running out of file descriptors is the client's limit, said before the run, never blamed on
the server."""

from __future__ import annotations

import errno
import resource
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[3]


def run_with_limit(soft: int, hard: int | None, *args: str) -> subprocess.CompletedProcess[str]:
    """loadgen run under ``ulimit -Sn soft`` (and ``-Hn hard``: lowering the hard limit needs no privilege)."""
    cmd = " ".join([sys.executable, "-m", "loadgen", "run", "--base-url", "http://127.0.0.1:9/v1", *args])
    limits = f"ulimit -Sn {soft}" + (f" && ulimit -Hn {hard}" if hard is not None else "")
    return subprocess.run(["bash", "-c", f"{limits} && exec {cmd}"], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)


def test_a_concurrency_the_limit_cannot_hold_is_refused_before_the_run(tmp_path: Path) -> None:
    proc = run_with_limit(256, 256, "--concurrency", "400", "--num-prompts", "400", "--out", str(tmp_path / "r"))
    assert proc.returncode == 2, proc.stderr
    assert "400 requests in flight need about 464 open files, and this process may open 256" in proc.stderr
    assert "ulimit -n 464" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_the_soft_limit_is_raised_to_what_the_run_needs(tmp_path: Path) -> None:
    # soft 256 under this machine's hard limit: raised, and the run goes on to the (absent) server
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 464:
        pytest.skip(f"the hard open-file limit here is {hard}")
    proc = run_with_limit(256, None, "--concurrency", "400", "--num-prompts", "400", "--out", str(tmp_path / "r"))
    assert "open files" not in proc.stderr
    assert proc.returncode == 3, proc.stderr  # nothing listens on port 9: the server's failure, rightly


def test_emfile_is_the_clients_failure() -> None:
    from loadgen.load.limits import CLIENT_ERRNOS

    assert errno.EMFILE in CLIENT_ERRNOS
    assert errno.ECONNREFUSED not in CLIENT_ERRNOS
