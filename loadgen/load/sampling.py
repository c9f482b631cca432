"""Taking probe samples while a cell runs: GPU memory of the engine's process tree (NVML,
in a thread) and the server's ``/metrics`` (scraped on the event loop). Their summaries are
in ``loadgen.results.samples``."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

import httpx
import orjson
import psutil

from loadgen.engines.registry import ENGINES
from loadgen.errors import TargetError
from loadgen.load.sidecall import side_call, side_client
from loadgen.results.readings import GpuReading, Reading, Scrape
from loadgen.results.samples import MetricNames, parse_metrics
from loadgen.servers.energy import read_energy
from loadgen.servers.gpus import nvml


def process_tree(pid: int) -> set[int]:
    try:
        root = psutil.Process(pid)
        return {pid, *(p.pid for p in root.children(recursive=True))}
    except psutil.Error:
        return {pid}


def gpu_sample(pids: set[int]) -> GpuReading | None:
    """Memory held by ``pids`` on each GPU and each GPU's used memory, in bytes; None without NVML."""
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
        return GpuReading(held, used)


class GpuSampler:
    """A thread sampling GPU memory of a process tree every ``interval_s`` while a cell runs,
    and the machine's energy counters at the cell's start and end."""

    def __init__(self, pid: int, emit: Callable[[Reading], None], interval_s: float = 0.2) -> None:
        self.pid, self.emit, self.interval_s = pid, emit, interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)

    def start(self) -> None:
        self.emit(read_energy())
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
        self.emit(read_energy())


METRICS_S = 5.0  # a scrape is taken once a second: one that takes longer is given up

# every engine's metric names, and loadgen's own
KNOWN = MetricNames.of(*(e.metrics for e in ENGINES))


class MetricsScraper:
    """Scrapes a server's ``/metrics`` (beside ``base_url``'s ``/v1``); a server without one
    (404, not Prometheus text) is scraped once and then left alone."""

    def __init__(self, base_url: str, interval_s: float = 1.0, *, verify: bool = True) -> None:
        root = base_url.rstrip("/").removesuffix("/v1")
        self.root = root
        self.url = root + "/metrics"
        self.reset_url = root + "/reset_peak_memory"
        self.interval_s = interval_s
        self.enabled = True
        self.has_peak: bool | None = None
        self._http = side_client(verify=verify)

    async def __aenter__(self) -> MetricsScraper:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._http.aclose()

    async def scrape(self) -> Scrape | None:
        if not self.enabled:
            return None
        try:
            status, body = await side_call(self._http, "GET", self.url, what="the server's /metrics",
                                           total_s=METRICS_S)
            values = parse_metrics(body.decode(errors="replace"), KNOWN) if status == 200 else None
        except (httpx.HTTPError, ValueError):
            values = None
        if values is None or values.empty:
            self.enabled = False
            return None
        self.has_peak = "engine_peak_allocated_bytes" in values.gauges
        return values

    async def scrape_once(self, emit: Callable[[Reading], None]) -> None:
        if (values := await self.scrape()) is not None:
            emit(values)

    async def run(self, emit: Callable[[Reading], None], *, first_done: bool = False) -> None:
        """Scrape every ``interval_s``; ``first_done``: the caller already took the first scrape."""
        while self.enabled:
            if first_done:
                first_done = False
            else:
                await self.scrape_once(emit)
            await asyncio.sleep(self.interval_s)

    async def wait_idle(self, timeout_s: float = 60.0) -> None:
        """Until the server reports no request running or waiting (a search's probe then starts
        on a server done with the one before, whose cancelled requests it may still be
        finishing); at once for a server that reports neither."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while (values := await self.scrape()) is not None and loop.time() < deadline:
            gauges = values.gauges
            if "running" not in gauges and "waiting" not in gauges:
                return
            if gauges.get("running", 0) + gauges.get("waiting", 0) <= 0:
                return
            await asyncio.sleep(0.1)

    async def reset_peak(self) -> None:
        """Start a new peak-memory window on an engine that reports one (loadgen's transformers engine)."""
        if self.has_peak is None:
            await self.scrape()
        if self.has_peak:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                await side_call(self._http, "POST", self.reset_url, what="the peak-memory reset", total_s=METRICS_S)

    async def reset_prefix_cache(self) -> str:
        """Empty the server's prefix cache (vLLM ``POST /reset_prefix_cache``, SGLang ``POST
        /flush_cache``); returns what was called. vLLM refuses while blocks are held, so a
        refusal is retried for up to 5 s."""
        for path in ("/reset_prefix_cache", "/flush_cache"):
            for _ in range(20):
                try:
                    status, body = await side_call(self._http, "POST", self.root + path, what=f"POST {path}")
                except (httpx.HTTPError, ValueError) as exc:
                    raise TargetError(f"load.reset_cache: POST {self.root}{path} failed ({exc})") from exc
                if status in (404, 405):
                    break
                if status >= 400:
                    text = body[:200].decode(errors="replace")
                    raise TargetError(f"load.reset_cache: POST {path}: HTTP {status} {text}")
                with contextlib.suppress(ValueError):
                    if isinstance(answer := orjson.loads(body), dict) and answer.get("success") is False:
                        await asyncio.sleep(0.25)
                        continue
                return f"POST {path}"
            else:
                raise TargetError(f"load.reset_cache: POST {path} kept answering success=false for 5 s")
        raise TargetError(
            "load.reset_cache: the target has no prefix-cache reset (vLLM: POST /reset_prefix_cache, which needs "
            "VLLM_SERVER_DEV_MODE=1 in the engine's environment, set when loadgen launches it; SGLang: POST "
            "/flush_cache); drop load.reset_cache, or launch the engine with it"
        )
