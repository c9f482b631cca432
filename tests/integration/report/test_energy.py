"""Energy over a cell of an engine loadgen launched (the simulator): on a machine without NVIDIA
GPUs or readable RAPL counters, each figure is absent and says why, on the console too."""

from __future__ import annotations

from pathlib import Path

import orjson
from typer.testing import CliRunner

from loadgen.cli import app


def test_a_launched_engines_energy_is_measured_or_its_absence_explained(tmp_path: Path) -> None:
    path = tmp_path / "energy.yaml"
    path.write_text("name: energy\nserve: {backend: sim, sim: {ttft_ms: 5, itl_ms: 1}}\n"
                    "workload: {num_prompts: 8, input_tokens: 16, output_tokens: 8}\nload: {concurrency: 2}\n")
    result = CliRunner().invoke(app, ["run", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    (cell,) = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())["cells"]
    energy = cell["energy"]
    assert energy["seconds"] > 0
    # the simulator holds no GPU memory: whatever NVML says, its GPUs are not known
    assert "gpu_energy_j" not in energy
    assert energy["gpu_reason"]
    assert ("cpu_energy_j" in energy) != ("cpu_reason" in energy)
    if "cpu_energy_j" in energy:
        assert energy["cpu_energy_j"] >= 0
    assert "GPU energy not measured: " in result.output
    # the probes hold the two readings it came from
    lines = [orjson.loads(x) for x in (tmp_path / "run" / "probes.jsonl").read_text().splitlines()]
    assert [x["probe"] for x in lines].count("energy") == 2
