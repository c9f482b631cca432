from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from loadgen.scenario.serve import Serve, SimOptions
from loadgen.servers.cpus import split_cores, usable_cores
from loadgen.servers.launch import LaunchedServer, group_members, sim_spec

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
