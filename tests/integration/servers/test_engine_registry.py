"""Adding an engine is one module and one registry line: a made-up engine, added to a copy of
the package with nothing else changed, is listed by `loadgen engines`, launched by `loadgen
serve` and by a scenario, and named in the comparison table."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson

import loadgen

PACKAGE = Path(loadgen.__file__).resolve().parent

# the made-up engine: loadgen's simulator, launched as an engine would be
FAKE = '''
import sys

from loadgen.engines.engine import Engine
from loadgen.engines.spec import EngineSpec
from loadgen.servers.launch import LaunchSpec


def command(spec: EngineSpec) -> LaunchSpec:
    argv = (sys.executable, "-m", "loadgen", "sim", "--host", spec.host, "--port", str(spec.port),
            "--model", spec.served_name, "--ttft-ms", "5", "--itl-ms", "1", *spec.extra_args)
    return LaunchSpec(argv, spec.host, spec.port, spec.env, spec.ready_timeout_s)


ENGINE = Engine(
    name="fakeserve", label="Fake Serve", command=command, hardware="anything", install="nothing to install",
    installed=lambda: (True, "always"), cpu=True, quants=("fake4",),
    metrics={"running": ("loadgen_sim_requests_running",)},
)
'''


def copy_with_fake_engine(tmp_path: Path) -> Path:
    root = tmp_path / "pkg"
    shutil.copytree(PACKAGE, root / "loadgen", ignore=shutil.ignore_patterns("__pycache__"))
    (root / "loadgen" / "engines" / "fakeserve.py").write_text(FAKE)
    registry = root / "loadgen" / "engines" / "registry.py"
    text = registry.read_text()
    anchor = '    "loadgen.engines.vllm",\n'
    assert anchor in text
    registry.write_text(text.replace(anchor, anchor + '    "loadgen.engines.fakeserve",\n'))
    # exactly two files differ from the installed package: the new module and the registry
    changed = {p.relative_to(root / "loadgen").as_posix() for p in (root / "loadgen").rglob("*.py")
               if not (PACKAGE / p.relative_to(root / "loadgen")).is_file()
               or (PACKAGE / p.relative_to(root / "loadgen")).read_bytes() != p.read_bytes()}
    assert changed == {"engines/fakeserve.py", "engines/registry.py"}
    return root


def run(root: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300, check=False)


def test_a_made_up_engine_needs_one_module_and_one_registry_line(tmp_path: Path) -> None:
    root = copy_with_fake_engine(tmp_path)
    listed = run(root, "engines", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    row = next(line for line in listed.stdout.splitlines() if "fakeserve" in line)
    assert "Fake Serve" in row
    assert "yes: always" in row
    dry = run(root, "serve", "tiny", "--backend", "fakeserve", "--quant", "fake4", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "-m loadgen sim --host 127.0.0.1 --port 8000 --model tiny" in dry.stdout
    assert "fakeserve" in run(root, "serve", "--help", cwd=tmp_path).stdout
    scenario = tmp_path / "fake.yaml"
    scenario.write_text(
        "name: fake\nserve: {model: tiny, backend: fakeserve}\ntarget: {api: completions, model: auto}\n"
        "workload: {num_prompts: 6, input_tokens: 8, output_tokens: 4}\nload: {concurrency: 2}\n"
    )
    done = run(root, "run", str(scenario), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    table = run(root, "report", str(tmp_path / "run"), "--table", "compare", "--format", "csv", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    assert "Fake Serve" in table.stdout
    records = [orjson.loads(line) for line in (tmp_path / "run" / "records.jsonl").read_text().splitlines()]
    measured = [r for r in records if not r["warmup"]]
    assert len(measured) == 6
    assert all(r["error"] is None and r["output_tokens"] == 4 for r in measured)
    summary = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())
    assert summary["cells"][0]["server"]["backend"] == "fakeserve"
