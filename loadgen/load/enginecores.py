"""Whether the engine had its cores to itself while a cell ran: when loadgen knows the cores of
an engine on this host (it launched it there, or found the listening process pinned to them),
a thread samples, once a second, how busy those cores were, how much of that was the engine's
own processes, and which other processes may have run there. ``loadgen.results.enginecores``
turns the samples into the cell's verdict."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psutil

from loadgen.load.sampling import process_tree
from loadgen.results.readings import EngineCoreReading, Hog, Reading

INTERVAL_S = 1.0


def _busy_s(cores: tuple[int, ...]) -> float:
    """CPU seconds the cores spent on anything but idling, since boot, summed over them."""
    times = psutil.cpu_times(percpu=True)
    return sum(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
               + getattr(t, "steal", 0.0) for i, t in enumerate(times) if i in cores)


def _cpu(cores: set[int]) -> dict[int, tuple[float, float, str]]:
    """Every process that may run on ``cores``: (CPU seconds, the share of its cores that are
    among them, name)."""
    out: dict[int, tuple[float, float, str]] = {}
    for proc in psutil.process_iter(["name", "cpu_times", "cpu_affinity"]):
        info = proc.info
        times, affinity = info.get("cpu_times"), info.get("cpu_affinity")
        if times is None or not affinity:
            continue
        on = len(cores.intersection(affinity))
        if on:
            out[proc.pid] = (times.user + times.system, on / len(affinity), str(info.get("name") or "?"))
    return out


class EngineCoreSampler:
    """Samples the engine's cores every second while a cell runs; ``emit`` gets each reading."""

    def __init__(self, engine_pid: int, cores: tuple[int, ...], emit: Callable[[Reading], None],
                 interval_s: float = INTERVAL_S) -> None:
        self.engine_pid, self.cores, self.emit, self.interval_s = engine_pid, cores, emit, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="engine-cores", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        cores = set(self.cores)
        engine = process_tree(self.engine_pid)
        before, busy0, t0 = _cpu(cores), _busy_s(self.cores), time.perf_counter()
        n = 0
        while True:
            stopped = self._stop.wait(self.interval_s)  # at the stop, the part of a second since the last
            n += 1
            if n % 10 == 0:  # an engine starts workers as it goes
                engine = process_tree(self.engine_pid)
            after, busy1, t1 = _cpu(cores), _busy_s(self.cores), time.perf_counter()
            wall = t1 - t0
            engine_s = sum(cpu - before[pid][0] for pid, (cpu, _, _) in after.items()
                           if pid in engine and pid in before)
            others = sorted(
                ((cpu - before[pid][0]) * share / wall, pid, name)
                for pid, (cpu, share, name) in after.items() if pid not in engine and pid in before
            )[::-1][:3]
            if wall >= 0.05:
                self.emit(EngineCoreReading(
                    round(wall, 6), self.cores, round(max(busy1 - busy0, 0.0), 6), round(max(engine_s, 0.0), 6),
                    tuple(Hog(pid, name, round(share, 3)) for share, pid, name in others if share >= 0.01),
                ))
            if stopped:
                return
            before, busy0, t0 = after, busy1, t1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
