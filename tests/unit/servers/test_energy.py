"""Energy counters with fakes of NVML and of Linux powercap, and the energy of a cell from them
(by hand); on a machine with neither, each figure is absent with its reason."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from loadgen.results.readings import EnergyReading
from loadgen.results.samples import Sample, summarize_energy
from loadgen.servers.energy import cpu_energy, gpu_energy, read_energy


class FakeNvmlError(Exception):
    pass


def fake_nvml(counters: list[int | None]) -> SimpleNamespace:
    """NVML as pynvml exposes it, with each GPU's energy counter in mJ (None: not supported)."""
    def energy(handle: int) -> int:
        value = counters[handle]
        if value is None:
            raise FakeNvmlError("Not Supported")
        return value

    return SimpleNamespace(NVMLError=FakeNvmlError, nvmlDeviceGetCount=lambda: len(counters),
                           nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetTotalEnergyConsumption=energy)


def powercap(root: Path, packages: dict[str, tuple[int, int]]) -> Path:
    for i, (name, (energy, top)) in enumerate(packages.items()):
        d = root / f"intel-rapl:{i}"
        d.mkdir(parents=True)
        (d / "name").write_text(name + "\n")
        (d / "energy_uj").write_text(f"{energy}\n")
        (d / "max_energy_range_uj").write_text(f"{top}\n")
        sub = root / f"intel-rapl:{i}:0"  # a core domain inside the package: not counted twice
        sub.mkdir()
        (sub / "energy_uj").write_text("5\n")
    return root


def test_counters_from_fakes(tmp_path: Path) -> None:
    assert gpu_energy(fake_nvml([1000, 2500])) == ({"0": 1000, "1": 2500}, None)
    counters, why = gpu_energy(fake_nvml([1000, None]))
    assert counters is None
    assert "GPU 1 gives no energy counter" in (why or "")
    assert gpu_energy(None) == (None, "no NVIDIA GPU visible through NVML")
    root = powercap(tmp_path / "powercap", {"package-0": (7_000_000, 262_143_328_850)})
    assert cpu_energy(root) == ({"package-0": 7_000_000}, {"package-0": 262_143_328_850}, None)
    none, _, why = cpu_energy(tmp_path / "absent")
    assert none is None
    assert "no CPU energy counter" in (why or "")


def test_a_cells_energy_by_hand() -> None:
    # 10 s apart: GPU 1 (the engine's) went from 5,000,000 to 8,000,000 mJ = 3,000 J, 300 W, and
    # 1,500 output tokens: 2 J each; GPU 0 (not the engine's) is left out; the CPU package's
    # counter wrapped at 1,000,000,000 µJ: 900,000,000 -> 100,000,000 is 200 J, 20 W
    first = EnergyReading(100.0, {"0": 1, "1": 5_000_000}, None, {"package-0": 900_000_000},
                          {"package-0": 1_000_000_000})
    last = EnergyReading(110.0, {"0": 9_999_999, "1": 8_000_000}, None, {"package-0": 100_000_000},
                         {"package-0": 1_000_000_000})
    e = summarize_energy([Sample(0, 0.0, first), Sample(0, 10.0, last)], ["1"], 1500)
    assert e is not None
    assert (e.seconds, e.gpu_energy_j, e.gpu_avg_power_w, e.gpu_j_per_output_token) == (10.0, 3000.0, 300.0, 2.0)
    assert (e.cpu_energy_j, e.cpu_avg_power_w) == (200.0, 20.0)
    assert e.gpus == ("1",)


def test_without_counters_each_figure_is_absent_with_its_reason() -> None:
    first = EnergyReading(1.0, None, "no NVIDIA GPU visible through NVML", None, {}, "no /sys/class/powercap")
    last = EnergyReading(3.0, None, "no NVIDIA GPU visible through NVML", None, {}, "no /sys/class/powercap")
    e = summarize_energy([Sample(0, 0.0, first), Sample(0, 2.0, last)], None, 100)
    assert e is not None
    assert e.gpu_energy_j is None
    assert e.cpu_energy_j is None
    assert e.to_dict() == {"seconds": 2.0, "gpu_reason": "no NVIDIA GPU visible through NVML",
                           "cpu_reason": "no /sys/class/powercap"}
    # this machine: whatever it has, a figure is there or its reason is, never neither
    now = read_energy()
    assert (now.gpu_mj is None) == (now.gpu_reason is not None)
    assert (now.cpu_uj is None) == (now.cpu_reason is not None)


@pytest.mark.parametrize("engine_gpus", [None, []])
def test_unknown_engine_gpus_give_a_reason(engine_gpus: list[str] | None) -> None:
    a, b = EnergyReading(0.0, {"0": 0}), EnergyReading(1.0, {"0": 1000})
    e = summarize_energy([Sample(0, 0.0, a), Sample(0, 1.0, b)], engine_gpus, 10)
    assert e is not None
    assert e.gpu_energy_j is None
    assert "its GPUs are not known" in (e.gpu_reason or "")
