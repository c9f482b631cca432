"""What one sample beside the load reads, by kind: a scrape of the server's ``/metrics``
(``Scrape``), the GPU memory of the engine's processes (``GpuReading``), and the client's own
figures over an interval (``ClientReading``). Each is the ``values`` of a ``probes.jsonl`` line.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from loadgen.data import Unchecked

# the kinds, as a line's "probe" names them
METRICS, GPU, CLIENT, ENGINE_CORES, ENERGY = "metrics", "gpu", "client", "engine_cores", "energy"


@dataclass(frozen=True, slots=True)
class Histogram:
    """A Prometheus histogram summed over its label sets: cumulative counts by upper bound
    (+Inf last), its sum and its count."""

    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass(frozen=True, slots=True)
class Scrape:
    """One scrape of a server's ``/metrics``, by loadgen's metric names."""

    gauges: dict[str, float] = field(default_factory=dict)
    counters: dict[str, float] = field(default_factory=dict)
    histograms: dict[str, Histogram] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.gauges or self.counters or self.histograms)

    def to_dict(self) -> dict[str, object]:
        return {
            "gauges": self.gauges, "counters": self.counters,
            "histograms": {k: {"buckets": [list(b) for b in h.buckets], "sum": h.sum, "count": h.count}
                           for k, h in self.histograms.items()},
        }

    @classmethod
    def from_dict(cls, data: Unchecked) -> Scrape:
        def le(bound: float | None) -> float:  # +Inf was written as null
            return math.inf if bound is None else float(bound)

        return cls(
            {k: float(v) for k, v in (data.get("gauges") or {}).items()},
            {k: float(v) for k, v in (data.get("counters") or {}).items()},
            {k: Histogram(tuple((le(b), float(c)) for b, c in h["buckets"]), float(h["sum"]), float(h["count"]))
             for k, h in (data.get("histograms") or {}).items()},
        )


@dataclass(frozen=True, slots=True)
class GpuReading:
    """Bytes the engine's process tree held on each GPU, and each GPU's used bytes (by index)."""

    held: dict[str, int]
    used: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, object]:
        return {"held": self.held, "used": self.used}

    @classmethod
    def from_dict(cls, data: Unchecked) -> GpuReading:
        return cls({k: int(v) for k, v in data["held"].items()},
                   {k: int(v) for k, v in (data.get("used") or {}).items()})


@dataclass(frozen=True, slots=True)
class Hog:
    """A process seen on the client's cores while it was starved (or on an engine's cores)."""

    pid: int
    name: str
    cpu_share: float

    @classmethod
    def from_dict(cls, data: Unchecked) -> Hog:
        return cls(int(data["pid"]), str(data["name"]), float(data["cpu_share"]))


@dataclass(frozen=True, slots=True)
class ClientReading:
    """One client process over an interval: its wall and CPU seconds, the socket reads it made
    and their time, how late its event loop ran each probe, and, when it was starved, the
    processes that held its cores."""

    worker: int
    wall_s: float
    cpu_s: float
    reads: int
    read_ms: float
    loop_lag_ms: tuple[float, ...]
    hogs: tuple[Hog, ...] | None = None  # only in the sample after a starved one
    # kernel-timed reads: the client's delay (handled minus arrived) of up to DELAYS_KEPT reads,
    # evenly taken, the longest of all, and how many reads there were
    delay_ms: tuple[float, ...] = ()
    delay_max_ms: float | None = None
    delayed_reads: int = 0
    # the kernel's scheduler statistics of the thread that runs the event loop: how long it
    # waited on a run queue, runnable but not running, over the interval (None where the
    # kernel does not say: not Linux)
    queued_ms: float | None = None

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        if self.hogs is None:
            del out["hogs"]
        if self.delay_max_ms is None:
            del out["delay_ms"], out["delay_max_ms"], out["delayed_reads"]
        if self.queued_ms is None:
            del out["queued_ms"]
        return out

    @classmethod
    def from_dict(cls, data: Unchecked) -> ClientReading:
        hogs = data.get("hogs")
        return cls(
            int(data.get("worker", 0)), float(data["wall_s"]), float(data["cpu_s"]), int(data.get("reads", 0)),
            float(data.get("read_ms", 0.0)), tuple(float(x) for x in data.get("loop_lag_ms") or ()),
            None if hogs is None else tuple(Hog.from_dict(h) for h in hogs),
            tuple(float(x) for x in data.get("delay_ms") or ()),
            None if data.get("delay_max_ms") is None else float(data["delay_max_ms"]),
            int(data.get("delayed_reads", 0)),
            None if data.get("queued_ms") is None else float(data["queued_ms"]),
        )


@dataclass(frozen=True, slots=True)
class EngineCoreReading:
    """The cores of an engine on this host over an interval: how busy they were (summed over the
    cores), the CPU seconds of the engine's own processes, and the other processes that may have
    run there, each with its estimated share of one core (its CPU split evenly over the cores it
    may use)."""

    wall_s: float
    cores: tuple[int, ...]
    busy_s: float
    engine_s: float
    others: tuple[Hog, ...] = ()

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["cores"] = list(self.cores)
        return out

    @classmethod
    def from_dict(cls, data: Unchecked) -> EngineCoreReading:
        return cls(float(data["wall_s"]), tuple(int(c) for c in data["cores"]), float(data["busy_s"]),
                   float(data["engine_s"]), tuple(Hog.from_dict(h) for h in data.get("others") or ()))


@dataclass(frozen=True, slots=True)
class EnergyReading:
    """Energy counters at one moment (``at_s``, a monotonic clock): each GPU's total energy in mJ
    (NVML) and each CPU package's in µJ with its wrap-around range (Linux powercap, RAPL); a
    counter that could not be read is None, with the reason."""

    at_s: float
    gpu_mj: dict[str, int] | None = None
    gpu_reason: str | None = None
    cpu_uj: dict[str, int] | None = None
    cpu_range_uj: dict[str, int] = field(default_factory=dict)
    cpu_reason: str | None = None

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Unchecked) -> EnergyReading:
        return cls(float(data["at_s"]), data.get("gpu_mj"), data.get("gpu_reason"), data.get("cpu_uj"),
                   dict(data.get("cpu_range_uj") or {}), data.get("cpu_reason"))


Reading = Scrape | GpuReading | ClientReading | EngineCoreReading | EnergyReading
_KINDS: dict[str, type[Scrape] | type[GpuReading] | type[ClientReading] | type[EngineCoreReading]
             | type[EnergyReading]] = {
    METRICS: Scrape, GPU: GpuReading, CLIENT: ClientReading, ENGINE_CORES: EngineCoreReading, ENERGY: EnergyReading,
}


def kind_of(reading: Reading) -> str:
    if isinstance(reading, EnergyReading):
        return ENERGY
    if isinstance(reading, EngineCoreReading):
        return ENGINE_CORES
    return METRICS if isinstance(reading, Scrape) else GPU if isinstance(reading, GpuReading) else CLIENT


def reading(kind: str, data: Unchecked) -> Reading:
    """A line's ``values`` read back by its kind (KeyError for a kind loadgen never writes)."""
    return _KINDS[kind].from_dict(data)
