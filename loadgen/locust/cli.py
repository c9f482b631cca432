"""``loadgen locust``: Locust's own command line, with loadgen's locustfile and safe defaults.

Every Locust option passes through. Before Locust starts, the scenario is checked here
(a bad file is one line and exit 2, not a traceback from inside Locust), the web UI is bound
to 127.0.0.1 unless ``--web-host`` says otherwise, and ``--host`` defaults to the
scenario's ``target.base_url``. Locust then runs in its own process: it patches the
standard library with gevent at import, which loadgen's asyncio side must never see.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from loadgen.errors import UsageError
from loadgen.locust.plan import LocustPlan, plan_for
from loadgen.locust.transport import BASIC_AUTH_ENV, QUITTING_FILE_ENV, STOP_FILE_ENV
from loadgen.results.rundir import RECORDS, taken_message
from loadgen.scenario.loader import load_scenario
from loadgen.scenario.wire import split_userinfo

LOCUSTFILE = Path(__file__).with_name("locustfile.py")
SHAPEFILE = Path(__file__).with_name("locustshape.py")


def locustfile(shape: bool) -> Path:
    return SHAPEFILE if shape else LOCUSTFILE


def _prescan(args: list[str]) -> argparse.Namespace:
    """The few Locust options loadgen looks at; everything else is Locust's business."""
    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--scenario")
    pre.add_argument("--set", dest="sets", action="append", default=[])
    pre.add_argument("-H", "--host")
    pre.add_argument("-f", "--locustfile")
    pre.add_argument("--web-host")
    pre.add_argument("--web-port", type=int, default=8089)
    pre.add_argument("--headless", action="store_true")
    pre.add_argument("--loadgen-out")
    pre.add_argument("--worker", action="store_true")
    pre.add_argument("--processes", type=int)
    pre.add_argument("--master-bind-host")
    pre.add_argument("--master-bind-port", type=int)
    pre.add_argument("--master-port", type=int)
    known, _ = pre.parse_known_args(args)
    return known


# Locust's port for its workers (--master-bind-port, --master-port)
MASTER_PORT = 5557


def locust_command(args: list[str], *, shape: bool = False, out: Path | None = None) -> tuple[list[str], LocustPlan]:
    """The ``python -m locust`` command line for ``loadgen locust ARGS``, and the checked plan."""
    opts = _prescan(args)
    if opts.scenario is None:
        raise UsageError("--scenario: give a loadgen scenario file, e.g. --scenario scenarios/chat.yaml")
    plan = plan_for(load_scenario(opts.scenario, opts.sets), opts.scenario)
    extra: list[str] = []
    if opts.locustfile is None:
        extra += ["-f", str(locustfile(shape))]
    elif shape:
        raise UsageError("--shape uses loadgen's shape locustfile; drop -f, or add ScenarioSteps to your own file")
    if plan.search is not None and not shape and not opts.worker:
        raise UsageError(f"{opts.scenario}: load.search -> add --shape: the shape sets each probe's users")
    if plan.repeats > 1 and not shape and not opts.worker:
        raise UsageError(f"{opts.scenario}: load.repeats -> add --shape: the shape runs each step's repeats")
    if plan.step_lengths and not shape and not opts.worker:
        raise UsageError(f"{opts.scenario}: load.stages -> add --shape: the shape runs the stages")
    args = _host_without_userinfo(args)
    if opts.host is None and not opts.worker:
        base_url = plan.scenario.target.base_url
        if base_url is None:
            raise UsageError(
                f"--host: give the server's base URL (e.g. --host http://127.0.0.1:8000/v1), or set "
                f"target.base_url in {opts.scenario}"
            )
        base_url, userinfo = split_userinfo(base_url)
        if userinfo:
            os.environ[BASIC_AUTH_ENV] = userinfo
        extra += ["--host", base_url]
    if opts.web_host is None and not opts.worker:
        extra += ["--web-host", "127.0.0.1"]
    if not opts.headless and not opts.worker:
        _port_free(opts.web_host or "127.0.0.1", opts.web_port)
    if opts.processes and not opts.worker:
        # the master Locust forks takes --master-bind-port, its workers connect to --master-port:
        # one given without the other, the workers would wait for a master on Locust's default
        port = opts.master_bind_port or opts.master_port
        if port is None:
            _port_free(opts.master_bind_host or "*", MASTER_PORT, "--master-bind-port")
        else:
            for name, given in (("--master-bind-port", opts.master_bind_port), ("--master-port", opts.master_port)):
                if given is None:
                    extra += [name, str(port)]
    if out is not None:
        if opts.loadgen_out is not None:
            raise UsageError("--out and --loadgen-out name the same run directory; give one")
        if opts.worker:
            raise UsageError("--out: a worker sends its records to the master; give --out to the master")
        if (out / RECORDS).exists():  # said before Locust starts, not once its test does
            raise UsageError(taken_message(out, resumable=False))
        extra += ["--loadgen-out", str(out)]
    return [sys.executable, "-m", "locust", *args, *extra], plan


def _port_free(host: str, port: int, flag: str = "--web-port") -> None:
    """A port Locust will listen on is free: two web UIs on one port would leave the second
    unreachable, and a second master's workers would find the first one."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as Locust binds: a closed UI's port is free
        try:
            s.bind((host if host not in ("", "*") else "0.0.0.0", port))  # noqa: S104 - the user's own host
        except OSError as exc:
            raise UsageError(
                f"{flag} {port}: {host}:{port} is in use ({exc.strerror}; another Locust?); give another {flag}"
            ) from None


def _host_without_userinfo(args: list[str]) -> list[str]:
    """``--host http://user:pw@h/v1`` passed on as ``--host http://h/v1``, the user and password
    handed to the users through the environment: Locust shows its host on its page and in its
    files, and a process's command line is visible to every user of the machine."""
    out = list(args)
    for i, arg in enumerate(out):
        for flag in ("--host", "-H"):
            if arg.startswith(flag + "="):
                url, userinfo = split_userinfo(arg[len(flag) + 1:])
                out[i] = f"{flag}={url}"
            elif arg == flag and i + 1 < len(out):
                url, userinfo = split_userinfo(out[i + 1])
                out[i + 1] = url
            else:
                continue
            if userinfo:
                os.environ[BASIC_AUTH_ENV] = userinfo
    return out


# after a stop, how long Locust has to say it is quitting on its own before loadgen signals it
QUIT_GRACE_S = 3.0


def run_child(cmd: list[str]) -> int:
    """Run Locust and wait for it. SIGINT, SIGTERM and SIGHUP sent to loadgen reach Locust as
    SIGTERM (Locust's own clean stop: its stats and loadgen's run directory written); Locust
    never outlives loadgen. A stopped test is labelled interrupted in the run directory, and
    loadgen exits 130.

    A stop to the whole process group (Ctrl-C, a closed terminal, ``timeout``) reaches Locust
    too, which then says it is quitting: loadgen sends nothing more (a second signal, mid-way
    through Locust's own stop, ended it with a traceback where Locust ran worker processes).
    A stop to loadgen alone is passed on once Locust has not said so within ``QUIT_GRACE_S``."""
    with tempfile.TemporaryDirectory(prefix="loadgen-locust-") as tmp:
        marker, quitting = Path(tmp) / "stopped", Path(tmp) / "quitting"
        proc = subprocess.Popen(cmd, env={**os.environ, STOP_FILE_ENV: str(marker),
                                          QUITTING_FILE_ENV: str(quitting)})
        heard: list[float] = []

        def forward(signum: int, frame: FrameType | None) -> None:
            if heard:
                return  # Locust is stopping already
            heard.append(time.monotonic())
            with contextlib.suppress(OSError):
                marker.touch()  # before any signal: Locust labels what it writes on its way out

        # (no KeyboardInterrupt here, which would leave the wait before the run is labelled)
        previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            signalled = False
            while True:
                try:
                    code = proc.wait(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if (heard and not signalled and time.monotonic() - heard[0] >= QUIT_GRACE_S
                        and not quitting.exists()):
                    signalled = True
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        return 130 if marker.exists() else code
