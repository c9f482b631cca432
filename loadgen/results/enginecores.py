"""The engine's cores in a cell (``EngineCores``), from its ``engine_cores`` samples: the share
of their time the engine used, the share other processes took, and which. Only time that named
processes used counts as theirs: the kernel's own work on those cores (the network interrupts
of the load itself) is not another program. A cell whose engine's cores were taken by others for
more than ``STARVED_SHARE`` of their time was starved: its latencies are not the engine's
alone, and the warning names the processes."""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.data import Unchecked
from loadgen.results.readings import EngineCoreReading, Hog

# other processes' share of the engine's core time over which the engine was starved
STARVED_SHARE = 0.20


@dataclass(frozen=True, slots=True)
class EngineCores:
    cores: tuple[int, ...]
    engine_share: float  # of the cores' time, over the cell
    others_share: float
    others: tuple[Hog, ...]  # each with its share of one core, over the cell
    starved: bool

    def to_dict(self) -> dict[str, object]:
        return {
            "cores": list(self.cores), "engine_share": self.engine_share, "others_share": self.others_share,
            "others": [{"pid": h.pid, "name": h.name, "cpu_share": h.cpu_share} for h in self.others],
            "starved": self.starved, "starved_over": STARVED_SHARE,
        }

    @classmethod
    def from_dict(cls, data: Unchecked) -> EngineCores:
        return cls(tuple(int(c) for c in data["cores"]), float(data["engine_share"]), float(data["others_share"]),
                   tuple(Hog.from_dict(h) for h in data.get("others") or ()), bool(data["starved"]))

    def warning(self) -> str | None:
        if not self.starved:
            return None
        who = ", ".join(f"{h.name} (pid {h.pid}) {h.cpu_share:.0%} of a core" for h in self.others) or "unknown"
        n = len(self.cores)
        return (f"the engine was starved: other programs took {self.others_share:.0%} of its "
                f"core{'s' if n > 1 else ''} {','.join(map(str, self.cores))} ({who}); its latencies are not the "
                "engine's alone: stop them, or give the engine other cores")


def engine_cores(readings: list[EngineCoreReading]) -> EngineCores | None:
    """The cell's figures from its samples; None when its engine's cores were not watched."""
    if not readings:
        return None
    cores = readings[0].cores
    wall = sum(r.wall_s for r in readings)
    capacity = wall * len(cores)
    if capacity <= 0:
        return None
    engine = sum(r.engine_s for r in readings)
    others: dict[int, tuple[str, float]] = {}
    for r in readings:
        for h in r.others:
            name, cpu = others.get(h.pid, (h.name, 0.0))
            others[h.pid] = (name, cpu + h.cpu_share * r.wall_s)
    top = sorted(((cpu / wall, pid, name) for pid, (name, cpu) in others.items()), reverse=True)[:3]
    others_share = sum(cpu for _, cpu in others.values()) / capacity
    return EngineCores(
        cores, round(min(engine / capacity, 1.0), 4), round(min(others_share, 1.0), 4),
        tuple(Hog(pid, name, round(share, 3)) for share, pid, name in top if share >= 0.01),
        others_share > STARVED_SHARE,
    )
