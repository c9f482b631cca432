"""Launching a server: own process group, log to a file, readiness with a deadline, clean stop.

``LaunchSpec`` is the exact command line and environment; ``LaunchedServer`` runs it.
A server that exits before it is ready is reported at once with the tail of its log; on
stop the whole process group gets SIGTERM, then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType

from loadgen.errors import Interrupted, LaunchError
from loadgen.results.files import output_error
from loadgen.scenario.serve import Serve
from loadgen.servers.heartbeat import EVERY_S, Echo, last_start, note_start, phase, start_key
from loadgen.servers.leftovers import new_scratch, remove, scratch_env, shared_memory_of


@dataclass(frozen=True, slots=True)
class LaunchSpec:
    argv: tuple[str, ...]
    host: str
    port: int
    env: dict[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 60.0
    name: str = "server"
    cpus: tuple[int, ...] = ()  # the cores the server's process group may run on (empty: any)
    # answered 200 in turn once it is ready (an engine without /health is ready at /v1/models)
    ready_paths: tuple[str, ...] = ("/health", "/v1/models")

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def check_port(spec: LaunchSpec) -> None:
    """Refuse a port something already listens on, before anything is started."""
    if port_in_use(spec.host, spec.port):
        raise LaunchError(
            f"{spec.name}: port {spec.port} on {spec.host} is already in use; "
            "choose another with --port (serve.port in a scenario)"
        )


def sim_spec(serve: Serve) -> LaunchSpec:
    """``loadgen sim`` as a child process, with the scenario's options."""
    port = serve.port or free_port(serve.host)
    argv = (sys.executable, "-m", "loadgen", "sim", "--host", serve.host, "--port", str(port), *serve.sim.argv())
    return LaunchSpec(argv, serve.host, port, ready_timeout_s=serve.ready_timeout_s or 60.0, name="sim")


# what stops loadgen cleanly: Ctrl-C, SIGTERM, and SIGHUP (a closed terminal or a dropped SSH session)
STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    """In the engine's leader, before it runs: SIGTERM when loadgen dies, however it dies
    (SIGKILL included), so that no engine outlives the loadgen that launched it (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def stops_interrupt() -> None:
    """SIGTERM and SIGHUP interrupt as Ctrl-C does (KeyboardInterrupt: the run directory is
    finished, the engine stopped), instead of ending the process on the spot (main thread only)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.default_int_handler)


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """While starting a server, SIGTERM and SIGHUP raise ``Interrupted`` (as SIGINT raises
    KeyboardInterrupt), so the half-started engine is stopped instead of orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupted(signum: int, frame: FrameType | None) -> None:
        raise Interrupted(f"interrupted by signal {signum} while the server was starting")

    previous = {sig: signal.signal(sig, raise_interrupted) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def group_members(pgid: int) -> list[int]:
    """The processes of a process group still running (zombies, dead but not yet reaped, aside)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            pids.append(int(stat.parent.name))
    return pids


# a log line that says what went wrong (an exception's last line, an engine's ERROR line)
_ERROR_WORDS = re.compile(r"error|exception|fatal|failed|traceback|killed|abort", re.IGNORECASE)


def last_error(log_tail: str) -> str | None:
    """The last line of a log that says what went wrong (a traceback's final line, not its
    frames), cut to 240 characters; None when no line does."""
    for line in reversed(log_tail.splitlines()):
        text = line.strip()
        if not text or text.startswith(("File ", "^", "~")) or "Traceback (most recent call last)" in text:
            continue
        if _ERROR_WORDS.search(text):
            return text if len(text) <= 240 else text[:239] + "…"
    return None


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class LaunchedServer:
    """Context manager: starts ``spec``, waits until ready, always stops the whole group."""

    def __init__(self, spec: LaunchSpec, log_path: Path, grace_s: float = 10.0, on_wait: Echo | None = None) -> None:
        self.spec = spec
        self.on_wait = on_wait  # told every few seconds how the start goes (elapsed, the log's phase)
        self.scratch: Path | None = None  # the engine's own TMPDIR, removed when it stops
        self.shared: set[Path] = set()  # what its processes were seen mapping in /dev/shm
        self.log_path = log_path
        self.grace_s = grace_s
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, on_spawn: Callable[[int], None] | None = None) -> str:
        """Start the process (``on_spawn`` gets its PID, which is also its process group) and
        wait until it is ready; returns its base URL."""
        spec = self.spec
        check_port(spec)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.scratch = new_scratch()
        env = {**os.environ, **scratch_env(self.scratch), **spec.env}
        try:  # never through a link planted where the log belongs
            fd = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise output_error(self.log_path, "write the engine's log there", exc) from None
        with os.fdopen(fd, "ab") as log:
            try:
                self.proc = subprocess.Popen(
                    spec.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    env=env, start_new_session=True,
                    preexec_fn=_die_with_parent if sys.platform == "linux" else None,  # noqa: PLW1509
                )
            except OSError as exc:
                raise LaunchError(f"{spec.name}: cannot start {spec.argv[0]!r}: {exc}") from exc
        if spec.cpus:
            # before the program can start a thread or a child: they inherit the leader's cores
            with contextlib.suppress(ProcessLookupError):
                os.sched_setaffinity(self.proc.pid, spec.cpus)
        try:
            with sigterm_interrupts():
                if on_spawn is not None:
                    on_spawn(self.proc.pid)
                self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return spec.base_url

    def _wait_ready(self) -> None:
        assert self.proc is not None
        spec = self.spec
        deadline = time.monotonic() + spec.ready_timeout_s
        root = f"http://{spec.host}:{spec.port}"
        stages = list(spec.ready_paths)
        stage = stages.pop(0)
        key = start_key(spec.argv)
        before = last_start(key)
        t0 = said = time.monotonic()
        import httpx  # (here: a command that launches nothing starts without it)

        from loadgen.scenario.redact import secret_flags  # (the scenario's schema: not for ``loadgen sim``)

        # an engine started with a key asks for it at /v1/models (the last --api-key given)
        api_key = next((spec.argv[i].partition("=")[2] if spec.argv[i].startswith("--api-key=") else spec.argv[i]
                        for i, flag in sorted(secret_flags(spec.argv).items(), reverse=True) if flag == "--api-key"),
                       None)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        refused = ""  # what the server says of a request without the key it wants
        with httpx.Client(timeout=2.0, trust_env=False, headers=headers) as http:
            while True:
                if self.on_wait is not None and time.monotonic() - said >= EVERY_S:
                    said = time.monotonic()
                    doing = refused or phase(tail(self.log_path, 40))
                    self.on_wait(f"{spec.name} starting: {said - t0:.0f} s" + (f", {doing}" if doing else "")
                                 + (f" (the last start here took {before:.0f} s)" if before else ""))
                code = self.proc.poll()
                if code is not None:
                    log = tail(self.log_path, 60)
                    why = last_error(log)
                    raise LaunchError(
                        f"{spec.name} exited with status {code} before it was ready"
                        + (f": {why}" if why else "") + f" (log: {self.log_path})",
                        "\n".join(log.splitlines()[-20:]),
                    )
                with contextlib.suppress(httpx.HTTPError):
                    status = http.get(root + stage).status_code
                    if status in (401, 403):
                        refused = (f"{stage} answers HTTP {status}: the server wants an API key"
                                   + (" other than its --api-key" if api_key else
                                      " not on its command line (one from its environment?); give it as --api-key"))
                    if status == 200:
                        if not stages:
                            note_start(key, time.monotonic() - t0)
                            self.shared |= shared_memory_of(group_members(self.proc.pid))
                            return
                        stage = stages.pop(0)
                        continue
                if time.monotonic() > deadline:
                    raise LaunchError(
                        f"{spec.name} not ready after {spec.ready_timeout_s:g} s "
                        f"(waiting for {stage}{'; ' + refused if refused else ''}; log: {self.log_path})",
                        tail(self.log_path),
                    )
                time.sleep(0.2)

    def stop(self) -> int | None:
        """SIGTERM to the process group, SIGKILL after the grace period; returns the exit code."""
        proc = self.proc
        if proc is None:
            return None
        deadline = time.monotonic() + self.grace_s
        self.shared |= shared_memory_of(group_members(proc.pid))
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(self.grace_s)
            except subprocess.TimeoutExpired:
                pass
        # the leader may be gone while children of the group are still cleaning up (vLLM's
        # resource tracker unlinks its shared memory in /dev/shm last): they get the rest of
        # the grace period before the group is killed
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        # SIGKILL is delivered at once but a process takes a moment to die (longer on a busy
        # machine): return only when no member of the group is left running
        deadline = time.monotonic() + 10
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not group_members(proc.pid):  # what it leaves goes only once no process of it can use it
            remove(self.scratch, self.shared)
            self.scratch, self.shared = None, set()
        return proc.returncode

    def __enter__(self) -> LaunchedServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def shell_line(launch: LaunchSpec) -> str:
    """The command as one line a user can paste: ``ENV=... [taskset -c CORES] argv``, the value
    of a secret flag (``--api-key``) redacted: it is shown and written down."""
    from loadgen.scenario.redact import redact_secret_flags  # (the scenario's schema: not for ``loadgen sim``)

    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in launch.env.items())
    pinned = ["taskset", "-c", ",".join(map(str, launch.cpus))] if launch.cpus else []
    return f"{env} {shlex.join([*pinned, *redact_secret_flags(launch.argv)])}".strip()


def serve_foreground(server: LaunchedServer, on_ready: Callable[[str, float], None]) -> tuple[bool, int | None]:
    """Start ``server``, call ``on_ready(base_url, seconds)``, then hold it until SIGINT or
    SIGTERM; always stops the whole group. Returns (stopped by a signal, the exit code)."""
    stop = threading.Event()
    t = time.monotonic()
    try:
        url = server.start()  # Ctrl-C, SIGTERM or SIGHUP while starting stops the engine and exits 130
        for sig in STOP_SIGNALS:
            signal.signal(sig, lambda *_: stop.set())
        on_ready(url, time.monotonic() - t)
        while not stop.is_set() and server.proc is not None and server.proc.poll() is None:
            stop.wait(0.5)
    finally:
        code = server.stop()
    return stop.is_set(), code
