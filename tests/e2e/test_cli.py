"""The CLI as a user runs it: real processes, real loopback servers, exit codes, run directories."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from loadgen.results.records import read_records
from loadgen.servers.launch import free_port
from tests.conftest import StartSim
from tests.helpers.rundirs import wait_for_records

ROOT = Path(__file__).parents[2]


def loadgen(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "loadgen", *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT
    )


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "scenario.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("workload: {num_prompts: 10, colour: red}\n", "workload.colour -> unknown key"),
        ("workload: {num_prompts: many}\n", "workload.num_prompts -> Input should be a valid integer"),
        ("load: {concurrency: -2}\n", "load.concurrency -> must be a positive integer"),
    ],
)
def test_bad_scenario_is_one_line_exit_2(tmp_path: Path, text: str, field: str) -> None:
    path = write(tmp_path, text)
    proc = loadgen("run", str(path), "--out", str(tmp_path / "run"))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert str(path) in lines[0]
    assert field in lines[0]
    assert "Traceback" not in proc.stderr


def test_run_then_report_rederives_the_same_summary(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=4)
    path = write(tmp_path, "name: t\nworkload: {num_prompts: 10, input_tokens: 16, output_tokens: 8}\n"
                           "load: {concurrency: [1, 4]}\nslo: {ttft_ms: 100}\n")
    run_dir = tmp_path / "run"
    proc = loadgen("run", str(path), "--base-url", base_url, "--out", str(run_dir))
    assert proc.returncode == 0, proc.stderr
    assert "TTFT" in proc.stdout
    assert "ITL" in proc.stdout
    assert "sweep" in proc.stdout
    for name in ("records.jsonl", "summary.json", "scenario.resolved.yaml", "provenance.json", "report.md"):
        assert (run_dir / name).is_file(), name
    stored = orjson.loads((run_dir / "summary.json").read_bytes())
    assert [c["params"]["concurrency"] for c in stored["cells"]] == [1, 4]
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    assert provenance["server_models"]["data"][0]["id"] == "loadgen-sim"
    assert provenance["model"] == "loadgen-sim"
    assert isinstance(provenance["seed"], int)  # drawn for this run, and recorded
    assert stored["seed"] == provenance["seed"]

    proc = loadgen("report", str(run_dir), "--format", "json")
    assert proc.returncode == 0, proc.stderr
    assert orjson.loads(proc.stdout) == stored
    proc = loadgen("report", str(run_dir))
    assert proc.returncode == 0
    assert "TTFT" in proc.stdout

    proc = loadgen("run", str(path), "--base-url", base_url, "--out", str(run_dir))
    assert proc.returncode == 2
    assert "already holds a run" in proc.stderr


def table_rows(text: str, title: str) -> list[list[str]]:
    """The numbered rows of the table titled ``title`` in a console (rich) or Markdown table."""
    lines = text[text.index(title):].splitlines()
    rows = [[c.strip() for c in line.replace("│", "|").strip("| ").split("|")] for line in lines[1:12]]
    return [r for r in rows if r and r[0].isdigit()]


def test_per_turn_and_per_stage_figures_are_shown_wherever_the_run_is_read(start_sim: StartSim,
                                                                            tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=2, itl_ms=0.5)
    path = write(tmp_path, "name: turns\nworkload: {num_prompts: 4, input_tokens: 16, output_tokens: 8,\n"
                           "  multi_turn: {turns: 3}}\ntarget: {api: chat}\nload: {concurrency: 2}\n")
    run_dir = tmp_path / "run"
    env = {**os.environ, "COLUMNS": "80"}  # a narrow terminal
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--base-url", base_url, "--out",
                           str(run_dir)], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert proc.returncode == 0, proc.stderr

    def turn_rows(text: str) -> list[list[str]]:
        return table_rows(text, "per turn (ms)")

    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    turns = summary["cells"][0]["metrics"]["turns"]
    expected = [[str(t["turn"] + 1), str(t["completed"])] for t in turns]
    assert expected == [["1", "4"], ["2", "4"], ["3", "4"]]
    assert [r[:2] for r in turn_rows(proc.stdout)] == expected
    assert "…" not in proc.stdout
    assert [r[:2] for r in turn_rows((run_dir / "report.md").read_text())] == expected
    report = loadgen("report", str(run_dir))
    assert report.returncode == 0, report.stderr
    assert [r[:2] for r in turn_rows(report.stdout)] == expected
    html = loadgen("report", str(run_dir), "--html")
    assert html.returncode == 0, html.stderr
    assert '<table class="breakdown"><caption>[1] per turn (ms)</caption>' in (run_dir / "report.html").read_text()

    # a staged load: a table per stage, its requests as the stages sent them (10 at 20/s, 10 at 40/s)
    staged = write(tmp_path, "name: staged\nworkload: {num_prompts: 10, input_tokens: 8, output_tokens: 2}\n"
                             "load: {arrival: constant, stages: [{duration_s: 0.5, rate: 20}, "
                             "{duration_s: 0.25, rate: 40}]}\n")
    proc = loadgen("run", str(staged), "--base-url", base_url, "--out", str(tmp_path / "staged"))
    assert proc.returncode == 0, proc.stderr
    assert [r[:2] for r in table_rows(proc.stdout, "per stage (ms)")] == [["1", "10"], ["2", "10"]]


def test_sigint_mid_run_keeps_every_measured_record(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=10)
    path = write(tmp_path, "workload: {num_prompts: 400, input_tokens: 16, output_tokens: 50}\n"
                           "load: {concurrency: 4, warmup_requests: 0}\n")
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "run", str(path), "--base-url", base_url, "--out", str(run_dir)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    records = run_dir / "records.jsonl"
    wait_for_records(run_dir, 2000, timeout_s=30)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    lines = records.read_bytes().splitlines()
    assert all(orjson.loads(line) for line in lines)
    recs = [r for r in read_records(records) if not r.warmup]  # the calibration probes aside
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    m = summary["cells"][0]["metrics"]
    assert summary["interrupted"] is True
    assert 0 < m["completed"] < 400
    # every request that was sent is on disk: completed ones and those cut by the stop
    assert m["completed"] + m["cancelled"] + m["failed"] == len(recs)
    assert m["cancelled"] <= 4
    assert m["failed"] == 0


def test_unreachable_server(tmp_path: Path) -> None:
    port = free_port()
    path = write(tmp_path, "workload: {num_prompts: 3, input_tokens: 4, output_tokens: 4}\n")
    proc = loadgen("run", str(path), "--base-url", f"http://127.0.0.1:{port}/v1", "--out", str(tmp_path / "a"))
    assert proc.returncode == 3
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "cannot list models" in proc.stderr

    # with the model named, no lookup and no warmup: every request is recorded as a connect
    # failure, and a run in which nothing completed says so with exit 3
    proc = loadgen("run", str(path), "--base-url", f"http://127.0.0.1:{port}/v1", "--out", str(tmp_path / "b"),
                   "--set", "target.model=m", "--set", "load.warmup_requests=0")
    assert proc.returncode == 3, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: no cell completed a request")
    m = orjson.loads((tmp_path / "b" / "summary.json").read_bytes())["cells"][0]["metrics"]
    assert m["failures_by_class"] == {"connect": 3}
    assert m["completed"] == 0


def test_sim_scenario_launches_and_stops_the_simulator(tmp_path: Path) -> None:
    run_dir = tmp_path / "qs"
    proc = loadgen("run", "scenarios/sim.yaml", "--out", str(run_dir), "--set", "workload.num_prompts=6",
                   "--set", "workload.output_tokens=8")
    assert proc.returncode == 0, proc.stderr
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert [c["metrics"]["completed"] for c in summary["cells"]] == [6, 6]
    provenance = orjson.loads((run_dir / "provenance.json").read_bytes())
    argv = provenance["server"]["argv"]
    port = argv[argv.index("--port") + 1]
    # the launched simulator is gone: nothing answers on its port and no such process lives
    out = subprocess.run(["pgrep", "-f", f"loadgen sim .*--port {port}"], capture_output=True, text=True)
    assert out.stdout.strip() == "", out.stdout
    assert (run_dir / "server.log").is_file()


def test_sim_rejects_bad_options() -> None:
    proc = loadgen("sim", "--itl-ms", "-1")
    assert proc.returncode == 2
    assert "--itl-ms" in proc.stderr


def test_serve_dry_run_prints_the_exact_command() -> None:
    proc = loadgen("serve", "qwen2-72b", "--quant", "gptq-int4", "--setting", "2", "--gpus", "3", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=3 vllm serve Qwen/Qwen2-72B-Instruct-GPTQ-Int4 --host 127.0.0.1 --port 8000 "
        "--served-model-name qwen2-72b --enable-prompt-tokens-details --tensor-parallel-size 1 --dtype auto "
        "--gpu-memory-utilization 1.0 --max-model-len 4096 --enforce-eager"
    )
    proc = loadgen("serve", "qwen2-57b", "--tp", "2", "--dry-run", "--", "--seed", "7")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 vllm serve Qwen/Qwen2-57B-A14B-Instruct ")
    assert "--tensor-parallel-size 2" in proc.stdout
    assert proc.stdout.strip().endswith("--seed 7")


def test_serve_refuses_inconsistent_placement_in_one_line() -> None:
    proc = loadgen("serve", "qwen2-57b", "--tp", "3", "--gpus", "0,1", "--dry-run")
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "--tp 3 --gpus 0,1" in proc.stderr


def test_models_lists_the_catalogue() -> None:
    proc = loadgen("models")
    assert proc.returncode == 0
    for alias in ("qwen2-57b", "qwen2.5-72b", "qwen1.5-moe-a2.7b"):
        assert alias in proc.stdout
    # the generated tiny model needs no GPU (it listed one); a 72B model in bf16 takes two
    rows = {line.split("│")[1].strip(): line.split("│")[-2].strip() for line in proc.stdout.splitlines()
            if line.count("│") > 2}
    assert rows["tiny"] == "CPU"
    assert rows["qwen1.5-72b"] == "2/2/1/1"


def test_serve_refuses_a_busy_port_with_exit_3() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = loadgen("serve", "qwen2.5-7b", "--port", str(port))
    assert proc.returncode == 3
    assert f"port {port} on 127.0.0.1 is already in use" in proc.stderr
    assert "Traceback" not in proc.stderr
