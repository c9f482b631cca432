"""Probes beside the load: the server's Prometheus ``/metrics`` and GPU memory (NVML).

Both write raw samples to ``probes.jsonl`` (one JSON object per line, tagged with the cell),
and the summaries are computed from those lines alone, so ``loadgen report`` re-derives them:

- ``metrics``: every ``interval_s`` the engine's ``/metrics`` is scraped; gauges (running and
  waiting requests, KV-cache usage, the transformers engine's peak allocated memory),
  counters (preemptions, tokens) and histograms (server-side TTFT, TPOT / ITL, E2E).
- ``gpu``: NVML memory held on each GPU by the launched engine's process tree, and each
  GPU's used memory, every ``interval_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

PROBES = "probes.jsonl"
GIB = float(1 << 30)

# what loadgen reports -> the metric names engines use for it (vLLM v1 and v0, SGLang, TGI, loadgen)
GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "tgi_batch_current_size"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "tgi_queue_size"),
    "kv_cache_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"),
    "engine_peak_allocated_bytes": ("loadgen_engine_peak_allocated_bytes",),
}
COUNTERS: dict[str, tuple[str, ...]] = {
    "preemptions": ("vllm:num_preemptions", "vllm:num_preemptions_total"),
    "prompt_tokens": ("vllm:prompt_tokens", "sglang:prompt_tokens", "vllm:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens", "sglang:generation_tokens", "vllm:generation_tokens_total"),
}
HISTOGRAMS: dict[str, tuple[str, ...]] = {
    "ttft_s": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "tpot_s": ("vllm:request_time_per_output_token_seconds", "vllm:time_per_output_token_seconds",
               "sglang:time_per_output_token_seconds"),
    "itl_s": ("vllm:inter_token_latency_seconds", "sglang:inter_token_latency_seconds"),
    "e2e_s": ("vllm:e2e_request_latency_seconds", "sglang:e2e_request_latency_seconds"),
}


def parse_metrics(text: str) -> dict[str, Any]:
    """The metrics loadgen knows from a Prometheus text page, each summed over its label sets.

    Returns ``{"gauges": {name: v}, "counters": {name: v}, "histograms": {name: {"buckets":
    [[le, cumulative count], ...], "sum": s, "count": n}}}`` keyed by loadgen's names.
    """
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    buckets: dict[str, dict[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.endswith("_bucket"):
                le = float(s.labels.get("le", "inf"))
                per = buckets.setdefault(s.name.removesuffix("_bucket"), {})
                per[le] = per.get(le, 0.0) + s.value
            else:
                values[s.name] = values.get(s.name, 0.0) + s.value

    def first(names: tuple[str, ...], suffix: str = "") -> float | None:
        return next((values[n + suffix] for n in names if n + suffix in values), None)

    out: dict[str, Any] = {"gauges": {}, "counters": {}, "histograms": {}}
    for key, names in GAUGES.items():
        if (v := first(names)) is not None:
            out["gauges"][key] = v
    for key, names in COUNTERS.items():
        v = first(names, "_total") if first(names, "_total") is not None else first(names)
        if v is not None:
            out["counters"][key] = v
    for key, names in HISTOGRAMS.items():
        name = next((n for n in names if n in buckets), None)
        if name is not None:
            out["histograms"][key] = {
                "buckets": sorted(buckets[name].items()),
                "sum": values.get(name + "_sum", 0.0),
                "count": values.get(name + "_count", 0.0),
            }
    return out


def _le(le: float | None) -> float:
    """A bucket bound read back from JSON, where +Inf was written as null."""
    return math.inf if le is None else float(le)


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding q."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            if count == prev_count:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / (count - prev_count)
        prev_le, prev_count = le, count
    return prev_le


def summarize_server_metrics(samples: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One cell's server-side view from its scrapes: gauge peaks and means, counter and histogram
    increases over the cell (last scrape minus first)."""
    if not samples:
        return None
    first, last = samples[0]["values"], samples[-1]["values"]
    out: dict[str, Any] = {"scrapes": len(samples)}
    for key in GAUGES:
        seen = [s["values"]["gauges"][key] for s in samples if key in s["values"]["gauges"]]
        if seen:
            out[key] = {"max": max(seen), "mean": sum(seen) / len(seen)}
    for key in COUNTERS:
        if key in first["counters"] and key in last["counters"]:
            out[key] = last["counters"][key] - first["counters"][key]
    for key in HISTOGRAMS:
        a, b = first["histograms"].get(key), last["histograms"].get(key)
        if a is None or b is None:
            continue
        before = {_le(le): c for le, c in a["buckets"]}
        delta = [(_le(le), c - before.get(_le(le), 0.0)) for le, c in b["buckets"]]
        n = b["count"] - a["count"]
        if n <= 0:
            continue
        out[key] = {
            "count": n,
            "mean": (b["sum"] - a["sum"]) / n,
            "p50": histogram_quantile(0.5, delta),
            "p90": histogram_quantile(0.9, delta),
            "p99": histogram_quantile(0.99, delta),
        }
    return out


def process_tree(pid: int) -> set[int]:
    import psutil

    try:
        root = psutil.Process(pid)
        return {pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return {pid}


def gpu_sample(pids: set[int]) -> dict[str, Any] | None:
    """Memory held by ``pids`` on each GPU and each GPU's used memory, in bytes; None without NVML."""
    from loadgen.gpus import nvml

    with nvml() as nv:
        if nv is None:
            return None
        held: dict[str, int] = {}
        used: dict[str, int] = {}
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            used[str(i)] = int(nv.nvmlDeviceGetMemoryInfo(h).used)
            try:
                procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
            except nv.NVMLError:
                procs = []
            mine = sum(int(p.usedGpuMemory or 0) for p in procs if p.pid in pids)
            if mine:
                held[str(i)] = mine
        return {"held": held, "used": used}


def summarize_gpu(samples: list[dict[str, Any]], reason: str | None = None) -> dict[str, Any]:
    """Peak GiB the engine held per GPU and in total (the peak of the per-sample sum)."""
    if not samples:
        return {"available": False, "reason": reason or "no GPU samples"}
    per: dict[str, float] = {}
    total = 0.0
    for s in samples:
        held = s["values"]["held"]
        for gpu, b in held.items():
            per[gpu] = max(per.get(gpu, 0.0), b / GIB)
        total = max(total, sum(held.values()) / GIB)
    return {"available": True, "source": "nvml process tree", "peak_gib_per_gpu": per, "peak_gib_total": total}


class ProbeLog:
    """Appends probe samples to ``probes.jsonl`` (thread-safe; a line per sample, flushed)."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("ab")  # noqa: SIM115 - closed in close()
        self._lock = threading.Lock()
        self._by_cell: dict[int, dict[str, list[dict[str, Any]]]] = {}

    def write(self, cell: int, probe: str, values: dict[str, Any]) -> None:
        sample = {"cell": cell, "probe": probe, "wall": time.time(), "values": values}
        line = orjson.dumps(sample) + b"\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            self._by_cell.setdefault(cell, {}).setdefault(probe, []).append(sample)

    def samples(self, cell: int) -> dict[str, list[dict[str, Any]]]:
        """What this log wrote for ``cell`` (the same lines ``read_probes`` gives back), without re-reading the file."""
        with self._lock:
            return {k: list(v) for k, v in self._by_cell.get(cell, {}).items()}

    def close(self) -> None:
        self._file.close()


def read_probes(path: Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Samples by cell and probe; a last line cut short by a crash is skipped."""
    out: dict[int, dict[str, list[dict[str, Any]]]] = {}
    if not path.is_file():
        return out
    with path.open("rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            s = orjson.loads(line)
            out.setdefault(s["cell"], {}).setdefault(s["probe"], []).append(s)
    return out


class GpuSampler:
    """A thread sampling GPU memory of a process tree every ``interval_s`` while a cell runs."""

    def __init__(self, pid: int, emit: Callable[[dict[str, Any]], None], interval_s: float = 0.2) -> None:
        self.pid, self.emit, self.interval_s = pid, emit, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        pids = process_tree(self.pid)
        n = 0
        while True:
            if n % 25 == 0:  # engines spawn workers after start; refresh the tree now and then
                pids = process_tree(self.pid)
            sample = gpu_sample(pids)
            if sample is None:
                return
            self.emit(sample)
            n += 1
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class MetricsScraper:
    """Scrapes a server's ``/metrics`` (beside ``base_url``'s ``/v1``); a server without one
    (404, not Prometheus text) is scraped once and then left alone."""

    def __init__(self, base_url: str, interval_s: float = 1.0) -> None:
        root = base_url.rstrip("/").removesuffix("/v1")
        self.url = root + "/metrics"
        self.reset_url = root + "/reset_peak_memory"
        self.interval_s = interval_s
        self.enabled = True
        self.has_peak: bool | None = None
        self._http = httpx.AsyncClient(timeout=5.0, trust_env=False)

    async def __aenter__(self) -> MetricsScraper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def scrape(self) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        try:
            resp = await self._http.get(self.url)
            values = parse_metrics(resp.text) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            values = None
        if values is None or not any(values.values()):
            self.enabled = False
            return None
        self.has_peak = "engine_peak_allocated_bytes" in values["gauges"]
        return values

    async def scrape_once(self, emit: Callable[[dict[str, Any]], None]) -> None:
        if (values := await self.scrape()) is not None:
            emit(values)

    async def run(self, emit: Callable[[dict[str, Any]], None], *, first_done: bool = False) -> None:
        """Scrape every ``interval_s``; ``first_done``: the caller already took the first scrape."""
        while self.enabled:
            if first_done:
                first_done = False
            else:
                await self.scrape_once(emit)
            await asyncio.sleep(self.interval_s)

    async def reset_peak(self) -> None:
        """Start a new peak-memory window on an engine that reports one (loadgen's transformers engine)."""
        if self.has_peak is None:
            await self.scrape()
        if self.has_peak:
            with contextlib.suppress(httpx.HTTPError):
                await self._http.post(self.reset_url)
