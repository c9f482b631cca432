"""How a run directory's files are written: appended line by line (records, cell statuses,
samples) or replaced whole (summary, provenance, scenario, report, charts), never through a
link planted in the directory, and never leaving half a line or half a file behind.

A write that fails (disk full, read-only, no permission) raises ``OutputError`` naming the
file and the OS error; an appended line that did not fit is cut off again, so the file's
lines stay whole and the next line, once there is room, starts where it should.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from loadgen.errors import OutputError

_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
TMP = ".tmp"  # the suffix of a file being replaced (removed when a run starts, if one was left)


def os_reason(exc: OSError) -> str:
    """``No space left on device (ENOSPC)``; a link where a file belongs said as such."""
    code = exc.errno or 0
    if code == errno.ELOOP:
        return "it is a symbolic link, which loadgen does not follow in a run directory (ELOOP)"
    name = errno.errorcode.get(code, str(code))
    return f"{os.strerror(code)} ({name})" if code else str(exc)


def output_error(path: Path, what: str, exc: OSError) -> OutputError:
    return OutputError(f"{path}: cannot {what}: {os_reason(exc)}")


class AppendFile:
    """A file lines are appended to, each written whole with one system call (or cut off again)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, _APPEND, 0o644)
            self._size = os.fstat(self._fd).st_size
        except OSError as exc:
            raise output_error(path, "open it for appending", exc) from None

    @property
    def size(self) -> int:
        """The bytes written so far (where the next line starts)."""
        return self._size

    def append(self, line: bytes) -> None:
        try:
            view = memoryview(line)
            while view:
                n = os.write(self._fd, view)
                view = view[n:]
        except OSError as exc:
            try:  # no half line: what did fit is cut off again
                os.ftruncate(self._fd, self._size)
            except OSError:
                pass
            raise output_error(self.path, "append to it", exc) from None
        self._size += len(line)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def write_file(path: Path, data: bytes) -> None:
    """Replace ``path`` whole: written to a new temporary file beside it (never through a link
    there), then renamed over it; on failure the temporary file is removed and ``path`` is
    as it was."""
    tmp = path.with_name(path.name + TMP)
    try:
        tmp.unlink(missing_ok=True)  # a stale one (or a link planted there) goes; its target is untouched
        fd = os.open(tmp, _CREATE, 0o644)
    except OSError as exc:
        raise output_error(path, "write it", exc) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        tmp.replace(path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise output_error(path, "write it", exc) from None


def remove_stale(run_dir: Path) -> None:
    """Temporary files an interrupted run left in ``run_dir`` (links among them: only the link goes)."""
    for tmp in run_dir.glob("*" + TMP):
        if tmp.is_symlink() or tmp.is_file():
            tmp.unlink(missing_ok=True)


def pid_alive(pid: int) -> bool:
    """Whether a process of this id runs (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
