"""Fixtures every test may use, and the test tiers.

The default run (``python -m pytest``) is the fast tier: unit tests, and integration tests against
``loadgen sim`` and loadgen's other in-process servers, in parallel. Tests marked ``engines``
(a real engine), ``browser`` (headless Chromium), ``locust`` (Locust's processes) or ``slow`` (a
benchmark, a search or a big input, minutes of it) run when asked for with ``-m``, or when named
by their node id. Every Python process a test starts watches what it runs (``tests/launches``):
a test that starts an engine, a browser or Locust without its mark fails, naming what it
started.

Tests run side by side, in any worker and beside another run of the suite on the same machine,
except those marked ``alone`` and those that busy a core on purpose (``cpu_hog``): each of them
waits until no other test runs anywhere on the machine, and none starts while it runs (a lock
file in the temporary directory, shared by every run of the suite there).

A test marked ``timing`` checks measured times against the simulator's or an engine's known ones;
where it fails it runs once more, and the run's summary lists it as a rerun.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import replace
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import settings

from loadgen.scenario.serve import Serve, SimOptions
from loadgen.servers.cpus import split_cores, usable_cores
from loadgen.servers.launch import LaunchedServer, group_members, sim_spec

TIERS = ("engines", "browser", "locust", "slow")
LAUNCHES = Path(__file__).with_name("launches")


def _launches() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tests_launches", LAUNCHES / "sitecustomize.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


launches = _launches()

# property tests keep no example database in the checkout (two runs of the suite, or its workers,
# would share it); a failure prints the blob that reproduces it instead
settings.register_profile("loadgen", database=None, print_blob=True)
settings.load_profile("loadgen")


def pytest_configure(config: pytest.Config) -> None:
    # each pytest process (each xdist worker) notes its own tests' launches in a folder of its own
    notes = tempfile.mkdtemp(prefix="loadgen-test-launches-")
    config.stash[_NOTES] = Path(notes)
    os.environ[launches.NOTES_ENV] = notes
    os.environ[launches.MARKS_ENV] = ""
    paths = [str(LAUNCHES), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    launches.install()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: two workers a core, as most tests wait on the simulator's clock (one worker a
    core left the cores idle half the time); the tests a busy machine would disturb run alone.
    The engines tier: one worker. The engines it starts take every core but the client's, so two
    at once would only take turns on them (and each worker would start its own shared engine)."""
    if re.search(r"(?<!not )\bengines\b", config.option.markexpr or ""):
        return 1
    return 2 * len(os.sched_getaffinity(0))


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport, sched: object) -> None:
    """A worker that died in a test: that test counts as run in the alone phase, or the other
    workers would wait out ``ALONE_PHASE_S`` for it. While the alone tests run no other test
    does, so a crash then is one of theirs; after it, the count no longer matters."""
    config = getattr(sched, "config", None)
    if config is not None:
        with alone_phase(config).open("ab") as done:
            done.write(b".")


def pytest_unconfigure(config: pytest.Config) -> None:
    notes = config.stash.get(_NOTES, None)
    if notes is not None:
        shutil.rmtree(notes, ignore_errors=True)
    if not hasattr(config, "workerinput"):
        alone_phase(config).unlink(missing_ok=True)


_NOTES = pytest.StashKey[Path]()


def runs_alone(item: pytest.Item) -> bool:
    return item.get_closest_marker("alone") is not None or "cpu_hog" in getattr(item, "fixturenames", ())


@pytest.hookimpl(trylast=True)  # after -m and -k have chosen
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without ``-m``, the tiers' tests are left out, unless named by their node id. The tests
    that run alone go first, as a phase of their own (``alone_phase``)."""
    if not config.option.markexpr:
        named = [_node_id(config, arg) for arg in config.args if "::" in arg]
        keep: list[pytest.Item] = []
        left: list[pytest.Item] = []
        for item in items:
            tiered = any(item.get_closest_marker(tier) for tier in TIERS)
            explicit = any(item.nodeid == n or item.nodeid.startswith((n + "[", n + "::")) for n in named)
            (left if tiered and not explicit else keep).append(item)
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = keep
    items.sort(key=lambda item: not runs_alone(item))
    config.stash[_ALONE] = sum(map(runs_alone, items))
    if config.pluginmanager.hasplugin("rerunfailures"):
        for item in items:
            if item.get_closest_marker("timing"):
                item.add_marker(pytest.mark.flaky(reruns=TIMING_RERUNS))


# a check against the clock that failed runs once more (a shared machine's moment of contention
# is not the code's fault); the run's summary lists each rerun, and a second failure fails it
TIMING_RERUNS = 1


_ALONE = pytest.StashKey[int]()
ALONE_PHASE_S = 900.0  # the most a test waits for the alone phase (a worker that died in it)


def alone_phase(config: pytest.Config) -> Path:
    """Where this run's workers count the tests that ran alone: a file named for the run's main
    process, which removes it at the end."""
    run = os.getppid() if hasattr(config, "workerinput") else os.getpid()
    return Path(tempfile.gettempdir()) / f"loadgen-tests-{run}.alone"


_PHASE_DONE = pytest.StashKey[bool]()


def wait_for_alone_phase(config: pytest.Config) -> None:
    """In a worker, the tests that run alone, all of them, before any other: each would otherwise
    wait for the tests running at the time to end, and the cores idle while they drain. (One
    process runs them first anyway.)"""
    total = config.stash.get(_ALONE, 0)
    if not hasattr(config, "workerinput") or not total or config.stash.get(_PHASE_DONE, False):
        return
    phase, deadline = alone_phase(config), time.monotonic() + ALONE_PHASE_S
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if phase.stat().st_size >= total:
                break
        time.sleep(0.1)
    config.stash[_PHASE_DONE] = True


def _node_id(config: pytest.Config, arg: str) -> str:
    """``path::name`` as given on the command line, as a node id (its path from the rootdir)."""
    path, _, rest = arg.partition("::")
    with contextlib.suppress(ValueError):
        path = Path(path).resolve().relative_to(config.rootpath).as_posix()
    return f"{path}::{rest}"


MACHINE_LOCK = Path(tempfile.gettempdir()) / "loadgen-tests.lock"


@contextlib.contextmanager
def machine_share(alone: bool) -> Iterator[None]:
    """The machine shared with every other test running on it (of this run or another), or
    alone. A test that waits to run alone keeps new tests from starting (the turnstile), so it
    is never passed over."""
    try:
        turnstile = os.open(MACHINE_LOCK.with_suffix(".turnstile"), os.O_RDWR | os.O_CREAT, 0o666)
        main = os.open(MACHINE_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:  # another user's files: no coordination, as before
        yield
        return
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(main, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield
    finally:
        os.close(main)  # its lock goes with it
        os.close(turnstile)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, object]:
    alone = runs_alone(item)
    if not alone:
        wait_for_alone_phase(item.config)
    try:
        with machine_share(alone):
            return (yield)
    finally:
        if alone:
            with alone_phase(item.config).open("ab") as done:  # a byte a test: such appends never interleave
                done.write(b".")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    os.environ[launches.MARKS_ENV] = ",".join(m.name for m in item.iter_markers())
    for note in item.config.stash[_NOTES].iterdir():
        note.unlink(missing_ok=True)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    outcome = yield
    notes = sorted(item.config.stash[_NOTES].iterdir())
    if notes:
        lines = [n.read_text(encoding="utf-8", errors="replace").strip() for n in notes]
        mark = lines[0].split("\t", 1)[0]
        pytest.fail(f"this test started what the {mark!r} tier is for without @pytest.mark.{mark}: "
                    + "; ".join(line.split("\t", 1)[-1] for line in lines[:3]), pytrace=False)
    return outcome


StartSim = Callable[..., str]


@pytest.fixture
def start_sim(tmp_path: Path) -> Iterator[StartSim]:
    """Start ``loadgen sim`` as a real process on 127.0.0.1; returns its base URL."""
    servers: list[LaunchedServer] = []

    def start(ttft_ms: float = 50.0, itl_ms: float = 10.0, tokens_per_chunk: int = 1, port: int | None = None,
              **faults: object) -> str:
        serve = Serve(port=port, sim=SimOptions(ttft_ms=ttft_ms, itl_ms=itl_ms, tokens_per_chunk=tokens_per_chunk,
                                                **faults))
        # on cores of its own, as loadgen places the servers it launches: a client measuring it on
        # the same host finds it listening there and takes the other cores
        split = split_cores(usable_cores(), None)
        launch = replace(sim_spec(serve), cpus=split[0] if split else ())
        server = LaunchedServer(launch, tmp_path / f"sim{len(servers)}.log")
        servers.append(server)
        return server.start()

    yield start
    for server in servers:
        server.stop()


def live_group_members(pgid: int) -> list[int]:
    """PIDs still running in a process group; zombies (dead, not yet reaped by init) excluded."""
    return group_members(pgid)


CpuHog = Callable[[str], int]


@pytest.fixture
def cpu_hog() -> Iterator[CpuHog]:
    """Start another program that keeps a core busy for the rest of the test, as on a shared
    machine: ``"server"`` on the core a simulator started by ``start_sim`` gets, ``"client"`` on
    the client's, ``"any"`` wherever the scheduler puts it."""
    import subprocess
    import sys

    hogs: list[subprocess.Popen[bytes]] = []

    def start(where: str) -> int:
        """Start one; returns its pid."""
        split = split_cores(usable_cores(), None)
        pin = {"server": split[0], "client": split[1]}.get(where) if split else None
        prefix = ["taskset", "-c", ",".join(map(str, pin))] if pin else []
        hogs.append(subprocess.Popen([*prefix, sys.executable, "-c", "while True: pass"]))
        return hogs[-1].pid  # taskset runs the program in its own process

    try:
        yield start
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
