"""Run a command in a real terminal of a given width (a pseudo-terminal, as a user's shell
gives), and read what it printed, colours stripped."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
from pathlib import Path

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\r")


def in_terminal(args: list[str], columns: int, cwd: Path | None = None, timeout: float = 120,
                interrupt_on: re.Pattern[str] | None = None) -> tuple[int, str]:
    """(exit code, text) of ``python -m loadgen ARGS`` run in a ``columns``-wide terminal;
    ``interrupt_on``: Ctrl-C (SIGINT) once what it printed matches."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50", "TERM": "xterm-256color"}
    proc = subprocess.Popen([sys.executable, "-m", "loadgen", *args], stdin=follower, stdout=follower,
                            stderr=follower, env=env, cwd=cwd)
    os.close(follower)
    out = bytearray()
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the program ended
            break
        if not chunk:
            break
        out += chunk
        if interrupt_on is not None and interrupt_on.search(ANSI.sub("", out[-4096:].decode(errors="replace"))):
            proc.send_signal(signal.SIGINT)
            interrupt_on = None
    os.close(leader)
    code = proc.wait(timeout=timeout)
    return code, ANSI.sub("", out.decode(errors="replace"))
