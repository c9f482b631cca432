"""GPUs as NVML (nvidia-ml-py) sees them: what is there, what is busy, what a run ran on.

Indices are NVML's, which match ``CUDA_VISIBLE_DEVICES`` when ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
(loadgen sets it for every engine it launches).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from loadgen.errors import LaunchError

# memory a fresh context-free GPU may show as used (driver reservations); above it a GPU is busy
BUSY_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_total_bytes: int
    memory_used_bytes: int
    processes: int
    driver: str
    cuda_driver: str

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


@contextlib.contextmanager
def nvml() -> Iterator[Any]:
    try:
        import pynvml
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def probe() -> list[GpuInfo] | None:
    """Every GPU NVML reports; None where there is no NVIDIA driver (or no nvidia-ml-py)."""
    with nvml() as nv:
        if nv is None:
            return None
        driver = _text(nv.nvmlSystemGetDriverVersion())
        cuda = nv.nvmlSystemGetCudaDriverVersion()
        cuda_text = f"{cuda // 1000}.{cuda % 1000 // 10}"
        out = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            try:
                procs = len(nv.nvmlDeviceGetComputeRunningProcesses(h))
            except nv.NVMLError:
                procs = 0
            out.append(GpuInfo(
                index=i, name=_text(nv.nvmlDeviceGetName(h)), uuid=_text(nv.nvmlDeviceGetUUID(h)),
                memory_total_bytes=int(mem.total), memory_used_bytes=int(mem.used), processes=procs,
                driver=driver, cuda_driver=cuda_text,
            ))
        return out


def gpu_count() -> int:
    found = probe()
    return len(found) if found else 0


def check_gpus(indices: tuple[int, ...], *, force: bool = False) -> list[GpuInfo]:
    """The GPUs an engine is about to get: present, and idle unless ``force``."""
    found = probe()
    if found is None:
        raise LaunchError(
            "no NVIDIA GPU here (NVML is not available: no driver, or nvidia-ml-py missing); "
            "this engine needs GPUs: `loadgen serve ... --script` (or `--dry-run`) prints the launch to run on a "
            "GPU host; the tiny model runs on CPU (`loadgen serve tiny --device cpu`)"
        )
    by_index = {g.index: g for g in found}
    missing = [i for i in indices if i not in by_index]
    if missing:
        have = ", ".join(f"{g.index} ({g.name})" for g in found) or "none"
        raise LaunchError(f"--gpus: GPU {missing[0]} does not exist; this machine has {have}")
    chosen = [by_index[i] for i in indices]
    if not force:
        for g in chosen:
            if g.processes or g.memory_used_bytes > BUSY_BYTES:
                raise LaunchError(
                    f"GPU {g.index} ({g.name}) is in use: {g.memory_used_bytes / 2**30:.1f} GiB held by "
                    f"{g.processes} process(es); free it, choose others with --gpus, or pass --force"
                )
    return chosen
