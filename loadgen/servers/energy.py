"""Energy counters of this machine: each NVIDIA GPU's total energy since its driver loaded (NVML,
millijoules) and each CPU package's (Linux powercap, the RAPL ``intel-rapl:N`` domains, in
microjoules, wrapping at ``max_energy_range_uj``). A counter that cannot be read is absent, and
the reading says why; it is never taken as zero."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from loadgen.results.readings import EnergyReading
from loadgen.servers.gpus import nvml

POWERCAP = Path("/sys/class/powercap")


def gpu_energy(nv: Any) -> tuple[dict[str, int] | None, str | None]:
    """Each GPU's energy counter in mJ (by index), or why there is none."""
    if nv is None:
        return None, "no NVIDIA GPU visible through NVML"
    out: dict[str, int] = {}
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            out[str(i)] = int(nv.nvmlDeviceGetTotalEnergyConsumption(nv.nvmlDeviceGetHandleByIndex(i)))
        except nv.NVMLError as exc:
            return None, f"GPU {i} gives no energy counter through NVML ({exc})"
    return (out, None) if out else (None, "no NVIDIA GPU visible through NVML")


def cpu_energy(root: Path = POWERCAP) -> tuple[dict[str, int] | None, dict[str, int], str | None]:
    """Each CPU package's energy counter in µJ and its range (by domain name), or why there is none."""
    if not root.is_dir():
        return None, {}, f"no {root} (Linux powercap): no CPU energy counter on this machine"
    packages = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
    if not packages:
        return None, {}, f"no RAPL package domain under {root}"
    counters: dict[str, int] = {}
    ranges: dict[str, int] = {}
    for p in packages:
        try:
            name = (p / "name").read_text().strip() if (p / "name").exists() else p.name
            counters[name] = int((p / "energy_uj").read_text())
            ranges[name] = int((p / "max_energy_range_uj").read_text())
        except PermissionError:
            return None, {}, f"{p / 'energy_uj'} is not readable by this user (root only since Linux 5.10)"
        except (OSError, ValueError) as exc:
            return None, {}, f"{p / 'energy_uj'}: {exc}"
    return counters, ranges, None


def read_energy(root: Path = POWERCAP) -> EnergyReading:
    """The machine's energy counters now."""
    with nvml() as nv:
        gpu, gpu_reason = gpu_energy(nv)
    cpu, ranges, cpu_reason = cpu_energy(root)
    return EnergyReading(time.monotonic(), gpu, gpu_reason, cpu, ranges, cpu_reason)
