"""The client's health verdict of a cell (``ClientHealth``), from its ``client`` samples and records.

The summary adds send lag (``sent_at - scheduled_at``) from the records of rate-driven cells
(a closed loop has no schedule to lag behind). Everything comes from the run directory, so
``loadgen report`` reproduces the verdict "client-bound".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from loadgen.results.readings import ClientReading, Hog
from loadgen.results.records import RequestRecord
from loadgen.results.samples import Sample

# beyond these the run is reported client-bound
LOOP_LAG_P99_MS = 5.0
SEND_LAG_P99_MS = 5.0
CPU_SHARE = 0.90
# a lagging loop while the client used less than this share of a core: starved, not saturated
STARVED_SHARE = 0.5
# ... and only if the kernel says its loop's thread waited on a run queue for over this share of
# the time (10 ms a second: another process held its core); an idle client waits well under
# 1 ms a second, one sharing its core with a busy process 200 to 400 ms
QUEUED_SHARE = 0.01


@dataclass(frozen=True, slots=True)
class Spread:
    """p50, p99 and the largest of a delay, ms."""

    p50: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True)
class ClientHealth:
    """The ``client`` entry of a cell in ``summary.json``: was the client, not the server, the limit?"""

    verdict: str  # ok | saturated | starved | lagging
    hogs: tuple[Hog, ...]
    workers: int
    loop_lag_ms: Spread | None
    send_lag_ms: Spread | None  # open loops only: a closed loop has no schedule to lag behind
    cpu_s: float
    cpu_share_max: float
    reads: int
    read_us_mean: float | None
    client_bound: bool
    reasons: tuple[str, ...]
    advice: str | None
    # what timed the answers' bytes: "kernel" (receive stamps: the client's delay, measured per
    # read, is not in the figures) or "loop" (the event loop's clock, when it got to the socket)
    clock: str = "loop"
    client_delay_ms: Spread | None = None  # kernel clock: how long after arriving reads were handled
    # the most, over the client's processes, that its loop's thread waited for a core, ms a
    # second (the kernel's scheduler statistics; None where the kernel does not say)
    queued_ms_per_s: float | None = None
    # reads that carried more than one token-bearing event (their tokens share one time)
    coalesced_reads: int = 0

    @property
    def coalesced(self) -> str | None:
        """The reads that carried several tokens, when they were over 1% of the reads: those tokens
        share one time, so the gaps before them read long and the gaps between them zero."""
        if not self.reads or self.coalesced_reads / self.reads <= 0.01:
            return None
        return (f"{self.coalesced_reads / self.reads:.1%} of reads carried several tokens (TCP merged them before "
                "the client read them): those tokens share one time, on any clock")

    @property
    def effect(self) -> str:
        """What the client's lag did to the cell's figures."""
        if self.clock == "kernel" and self.client_delay_ms is not None:
            said = (f"kernel receive stamps kept the client's delay out of its TTFT / ITL (the loop's clock "
                    f"would have added up to {self.client_delay_ms.p99:.1f} ms at p99, {self.client_delay_ms.max:.1f} "
                    "ms at most)")
        else:
            said = "its TTFT / ITL include the client's own delay"
        return said if self.coalesced is None else f"{said}; {self.coalesced}"

    @property
    def warning(self) -> str | None:
        """The self-check's verdict as a cell's warning, where the client was not ok."""
        if not self.client_bound:
            return None
        what = {"starved": "the client was starved", "saturated": "the client was saturated (client-bound)"}.get(
            self.verdict, "the client lagged")
        return f"{what} ({'; '.join(self.reasons)}): {self.effect}; {self.advice}"

    def to_dict(self) -> dict[str, object]:
        out = asdict(self)
        out["hogs"], out["reasons"] = [asdict(h) for h in self.hogs], list(self.reasons)
        if self.queued_ms_per_s is None:  # not measured (not Linux, or a run directory from before)
            del out["queued_ms_per_s"]
        out["thresholds"] = {"loop_lag_p99_ms": LOOP_LAG_P99_MS, "send_lag_p99_ms": SEND_LAG_P99_MS,
                             "cpu_share": CPU_SHARE}
        return out

    @classmethod
    def from_dict(cls, data: object) -> ClientHealth | None:
        if not isinstance(data, dict):
            return None

        def spread(d: object) -> Spread | None:
            return Spread(float(d["p50"]), float(d["p99"]), float(d["max"])) if isinstance(d, dict) else None

        return cls(
            verdict=str(data.get("verdict") or ("lagging" if data.get("client_bound") else "ok")),
            hogs=tuple(Hog.from_dict(h) for h in data.get("hogs") or ()),
            workers=int(data.get("workers", 1)), loop_lag_ms=spread(data.get("loop_lag_ms")),
            send_lag_ms=spread(data.get("send_lag_ms")), cpu_s=float(data.get("cpu_s", 0.0)),
            cpu_share_max=float(data.get("cpu_share_max", 0.0)), reads=int(data.get("reads", 0)),
            read_us_mean=data.get("read_us_mean"), client_bound=bool(data.get("client_bound")),
            reasons=tuple(data.get("reasons") or ()), advice=data.get("advice"), clock=str(data.get("clock", "loop")),
            client_delay_ms=spread(data.get("client_delay_ms")), coalesced_reads=int(data.get("coalesced_reads", 0)),
            queued_ms_per_s=None if data.get("queued_ms_per_s") is None else float(data["queued_ms_per_s"]),
        )


def _hogs(readings: list[ClientReading]) -> tuple[Hog, ...]:
    """The processes seen on the client's cores while it was starved, busiest first."""
    seen: dict[int, Hog] = {}
    for s in readings:
        for hog in s.hogs or ():
            if hog.pid not in seen or hog.cpu_share > seen[hog.pid].cpu_share:
                seen[hog.pid] = hog
    return tuple(sorted(seen.values(), key=lambda h: -h.cpu_share)[:3])


def _stats(values: list[float]) -> Spread | None:
    if not values:
        return None
    a = np.asarray(values)
    return Spread(float(np.percentile(a, 50)), float(np.percentile(a, 99)), float(a.max()))


def client_health(
    samples: list[Sample], records: list[RequestRecord], rate_driven: bool
) -> ClientHealth | None:
    """The cell's verdict from its ``client`` samples (``probes.jsonl``); None when nothing was sampled."""
    values = [s.values for s in samples if isinstance(s.values, ClientReading)]
    if not values:
        return None
    lags = [x for s in values for x in s.loop_lag_ms]
    per_worker: dict[int, list[float]] = {}
    queued: dict[int, list[float]] = {}
    for s in values:
        acc = per_worker.setdefault(s.worker, [0.0, 0.0])
        acc[0] += s.cpu_s
        acc[1] += s.wall_s
        if s.queued_ms is not None:
            q = queued.setdefault(s.worker, [0.0, 0.0])
            q[0] += s.queued_ms
            q[1] += s.wall_s
    workers = len(per_worker)
    cpu_s = sum(c for c, _ in per_worker.values())
    share = max((c / w for c, w in per_worker.values() if w > 0), default=0.0)
    # known only where every process's samples carry it (a run directory from before has none)
    queued_per_s = (max((ms / w for ms, w in queued.values() if w > 0), default=0.0)
                    if queued and len(queued) == workers else None)
    # the kernel saw the loop's thread kept from its core (or cannot say)
    kept_waiting = queued_per_s is None or queued_per_s > QUEUED_SHARE * 1e3
    reads = sum(s.reads for s in values)
    read_ms = sum(s.read_ms for s in values)
    send = None
    if rate_driven:
        measured = [r for r in records if not r.warmup and r.sent_at is not None]
        send = _stats([(r.sent_at - r.scheduled_at - r.slot_wait_s) * 1e3 for r in measured])  # type: ignore[operator]
    loop = _stats(lags)
    # where the kernel stamped the reads, the client's delay is measured, not inferred from the loop
    stamped = [s for s in values if s.delay_max_ms is not None]
    delay = _stats([x for s in stamped for x in s.delay_ms])
    if delay is not None:
        delay = Spread(delay.p50, delay.p99, max(s.delay_max_ms or 0.0 for s in stamped))
    lag = delay if delay is not None else loop
    reasons = []
    lag_p99 = lag.p99 if lag is not None else 0.0
    late = lag_p99 > LOOP_LAG_P99_MS
    # kernel stamps keep the client's delay out of the figures: it limited the cell only if it
    # was busy (saturated) or kept from its core, not if it merely woke late
    if delay is not None and late and (share > CPU_SHARE or kept_waiting):
        reasons.append(f"client delay p99 {lag_p99:.1f} ms > {LOOP_LAG_P99_MS:g} ms")
    elif delay is None and late:
        reasons.append(f"event-loop lag p99 {lag_p99:.1f} ms > {LOOP_LAG_P99_MS:g} ms")
    if send is not None and send.p99 > SEND_LAG_P99_MS:
        reasons.append(f"send lag p99 {send.p99:.1f} ms > {SEND_LAG_P99_MS:g} ms")
    if share > CPU_SHARE:
        reasons.append(f"client CPU {share:.0%} of a core > {CPU_SHARE:.0%}")
    bound = bool(reasons)
    hogs = _hogs(values)
    verdict, advice = "ok", None
    if share > CPU_SHARE:
        verdict = "saturated"
        # behind, its reads carried several events each (TCP merged them), which made an event
        # cheaper than at full precision, one read each: the cores that needs are those seen
        # times the events a read carried (on 16 cores at C=1024, one saturated worker read
        # most events in twos and threes: two workers still lagged, four kept up)
        events = sum(len(r.chunk_offsets_s) for r in records if not r.warmup)
        per_read = events / reads if reads else 1.0
        more = max(workers + 1, math.ceil(workers * max(share, 1.0) * max(per_read, 1.0) / 0.6))
        advice = (f"the client, not the server, limited this cell: set load.workers: {more} "
                  "(or auto), or spread the load over hosts with loadgen locust --master")
    elif late and share < STARVED_SHARE and kept_waiting and bound:
        verdict = "starved"
        waited = "" if queued_per_s is None else f", and its thread waited {queued_per_s:.0f} ms a second for one"
        reasons.append(f"while the client itself used only {share:.0%} of a core{waited}")
        who = ", ".join(f"{h.name} (pid {h.pid}, {h.cpu_share:.0%} of a core)" for h in hogs)
        advice = (
            "another process held the client's core" + (f": {who}" if who else "")
            + "; keep it off the client's cores (loadgen pins the CPU engines it launches apart from the "
            "client; load.client_cpus chooses the client's), or free a core; more workers would only add "
            "to the contention"
        )
    elif bound and late and queued_per_s is not None and not kept_waiting:
        verdict = "lagging"
        advice = (f"the client's event loop fell behind, yet its thread waited only {queued_per_s:.1f} ms a "
                  "second for its core (the kernel's scheduler statistics): no process held it; the machine "
                  "woke it late (an idle virtual CPU) or the client paused; kernel receive stamps "
                  "(load.clock: kernel, on plain http) keep that out of the figures")
    elif bound:
        verdict = "lagging"
        advice = ("the client's event loop fell behind though no process was seen holding its core: "
                  "check the machine's load, or spread the load with load.workers")
    return ClientHealth(
        verdict=verdict, hogs=hogs, workers=workers, loop_lag_ms=loop, send_lag_ms=send, cpu_s=round(cpu_s, 3),
        cpu_share_max=round(share, 4), reads=reads, read_us_mean=round(read_ms * 1e3 / reads, 3) if reads else None,
        client_bound=bound, reasons=tuple(reasons), advice=advice, clock="kernel" if stamped else "loop",
        client_delay_ms=delay, coalesced_reads=sum(r.coalesced_reads for r in records if not r.warmup),
        queued_ms_per_s=None if queued_per_s is None else round(queued_per_s, 3),
    )
