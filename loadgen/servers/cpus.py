"""Cores for an engine and for the client that measures it, when both run on one host.

A CPU engine takes every core it is given, and a client that shares a core with it waits for
it: its timestamps then carry the engine's work, not the network's. So when loadgen launches a
CPU engine (or its simulator) here, the engine gets the cores ``split_cores`` gives it and
loadgen's own process the rest; for a server it did not launch, ``listener_cores`` finds the
process listening on the port and the client takes the cores that process may not use.
"""

from __future__ import annotations

import os

import psutil

from loadgen.errors import UsageError


def usable_cores() -> tuple[int, ...]:
    return tuple(sorted(os.sched_getaffinity(0)))


def split_cores(
    available: tuple[int, ...], client: int | tuple[int, ...] | None
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(engine cores, client cores): the client gets ``client`` (a count taken from the
    highest cores, or core ids), 1 core by default, the engine the rest; None when fewer
    than two cores are available."""
    if isinstance(client, tuple):
        missing = [c for c in client if c not in available]
        if missing:
            raise UsageError(f"load.client_cpus: core {missing[0]} is not available here (cores {list(available)})")
        engine = tuple(c for c in available if c not in client)
        if not engine:
            raise UsageError("load.client_cpus: leaves no core for the engine; give the client fewer cores")
        return engine, tuple(sorted(client))
    if len(available) < 2:
        return None
    n = 1 if client is None else client
    if n >= len(available):
        raise UsageError(
            f"load.client_cpus: {n} of {len(available)} cores leaves none for the engine; give the client fewer"
        )
    return available[:-n], available[-n:]


def listener_cores(port: int) -> tuple[int, tuple[int, ...]] | None:
    """(pid, its cores) of the process listening on ``port`` on this host, when it can be seen."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in conns:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                return conn.pid, tuple(sorted(psutil.Process(conn.pid).cpu_affinity() or ()))
            except (psutil.Error, OSError):
                return None
    return None


def pin(pid: int, cores: tuple[int, ...]) -> None:
    """Pin a process (0: this one) to ``cores``; threads and children started later inherit it."""
    os.sched_setaffinity(pid, cores)


def cores_text(cores: tuple[int, ...]) -> str:
    """``0-3,6`` for (0, 1, 2, 3, 6): the form taskset and vLLM's thread binding read."""
    parts: list[str] = []
    start = prev = None
    for c in sorted(cores):
        if start is None:
            start = prev = c
        elif prev is not None and c == prev + 1:
            prev = c
        else:
            parts.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = c
    if start is not None:
        parts.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ",".join(parts)


def engine_cores(option: str) -> tuple[int, ...]:
    """``loadgen serve --cpus``: ``auto`` (every core but the last, left to the client), ``all``
    (no pinning), or core ids such as ``0-2,5``."""
    if option == "all":
        return ()
    if option == "auto":
        split = split_cores(usable_cores(), None)
        return split[0] if split else ()
    cores: list[int] = []
    try:
        for part in option.split(","):
            lo, _, hi = part.partition("-")
            cores += range(int(lo), int(hi or lo) + 1)
    except ValueError:
        raise UsageError(f"--cpus {option!r}: give auto, all, or core ids such as 0-2,5") from None
    missing = [c for c in cores if c not in usable_cores()]
    if not cores or missing:
        raise UsageError(f"--cpus {option!r}: core {missing[0] if missing else '?'} is not available here")
    return tuple(sorted(set(cores)))
