"""A cell's warnings wherever its figures are shown: a program spinning on the simulator's core
during the run starves the engine; the console said so while it ran, and report.md, report.html
(beside the cell), ``loadgen report`` and its llm-d export say it again from the run directory
alone."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import orjson

from tests.conftest import CpuHog, StartSim
from tests.helpers.runs import run, scenario

ROOT = Path(__file__).parents[3]


def test_the_engine_starved_is_said_in_every_report(start_sim: StartSim, cpu_hog: CpuHog, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    hog = cpu_hog("server")
    body = scenario(base_url, 1, concurrency=2)
    body["workload"].update(num_prompts=30, output_tokens=24)
    run_dir, stderr = run(tmp_path, "hogged", body)
    (warning,) = [w for w in orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["warnings"]
                  if w.startswith("the engine was starved")]
    assert f"(pid {hog})" in warning
    said = " ".join(warning.split())
    assert said in " ".join(stderr.split())  # the run's console
    assert f"**Warning**: {warning}" in (run_dir / "report.md").read_text()
    report = subprocess.run([sys.executable, "-m", "loadgen", "report", str(run_dir), "--html"],
                            capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert report.returncode == 0, report.stderr
    page = (run_dir / "report.html").read_text()
    cells = page.split("<h2>Cells</h2>", 1)[1].split("<h2>Provenance</h2>", 1)[0]
    assert f"(pid {hog})" in cells
    assert '<p class="warning"><strong>Warning</strong>: the engine was starved' in cells
    # the provenance as text, never a Python mapping
    provenance = page.split("<h2>Provenance</h2>", 1)[1]
    assert not re.search(r"\{&#x27;|\{'", provenance), provenance[:500]
    llmd = subprocess.run([sys.executable, "-m", "loadgen", "report", str(run_dir), "--format", "llmd"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert llmd.returncode == 0, llmd.stderr
    (benchmark,) = orjson.loads(llmd.stdout)
    assert f"; warnings: {warning}" in benchmark["run"]["description"]  # llm-d's report, where it has room
    console = subprocess.run([sys.executable, "-m", "loadgen", "report", str(run_dir)], capture_output=True,
                             text=True, timeout=120, cwd=ROOT, check=False, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert console.returncode == 0, console.stderr
    assert "warning: the engine was starved" in " ".join(console.stdout.split())
