"""Waits that say where they are: a beat every few seconds, and the phase an engine log names."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from loadgen.errors import LaunchError
from loadgen.servers import heartbeat
from loadgen.servers.heartbeat import Heartbeat, phase, run_step, size_text, start_key, tree_bytes

VLLM_LOG = """\
(APIServer pid=852) INFO 11-24 20:39:09 [api_utils.py:286] non-default args: {'host': '127.0.0.1'}
(EngineCore pid=864) INFO 11-24 20:39:17 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config
(Worker pid=873) INFO 11-24 20:39:25 [cpu_model_runner.py:68] Starting to load model /root/tiny...
(Worker pid=873) INFO 11-24 20:39:26 [default_loader.py:291] Loading weights took 0.03 seconds
(EngineCore pid=864) INFO 11-24 20:39:40 [backends.py:700] Compiling a graph for dynamic shape takes 9.1 s
(EngineCore pid=864) INFO 11-24 20:39:44 [kv_cache_utils.py:1316] GPU KV cache size: 29,104 tokens
(APIServer pid=852) INFO:     Uvicorn running on http://127.0.0.1:49163 (Press CTRL+C to quit)
"""


@pytest.mark.parametrize(("upto", "expected"), [
    (1, "initialising"), (2, "initialising"), (3, "loading the weights"), (4, "loading the weights"),
    (5, "compiling and warming up"), (6, "sizing the KV cache"), (7, "starting its HTTP server"),
])
def test_the_phase_is_the_newest_line_that_names_one(upto: int, expected: str) -> None:
    assert phase("\n".join(VLLM_LOG.splitlines()[:upto])) == expected


# vLLM's CPU build starting the tiny model with --enforce-eager (its own log, shortened)
VLLM_CPU_LOG = """\
(APIServer pid=4974) INFO 11-29 02:50:18 [api_utils.py:286] non-default args: {'enable_auto_tool_choice': True}
(APIServer pid=4974) WARNING 11-29 02:50:19 [vllm.py:1703] Enforce eager set, disabling torch.compile, CUDAGraphs
(Worker pid=4995) INFO 11-29 02:50:48 [cpu_model_runner.py:68] Starting to load model /root/tiny-qwen2-v1...
(Worker pid=4995) INFO 11-29 02:50:48 [base_loader.py:82] Initializing model took 0.211347 seconds
(EngineCore pid=4986) INFO 11-29 02:50:50 [utils.py:347] Using LBHNC KV cache layout.
(EngineCore pid=4986) INFO 11-29 02:50:53 [core.py:402] init engine (profile, create kv cache, warmup model) took 2.94 s
(APIServer pid=4974) INFO 11-29 02:50:54 [entry.py:140] Starting vLLM server on http://127.0.0.1:44393
"""


@pytest.mark.parametrize(("upto", "expected"), [
    (1, "initialising"), (2, "initialising"), (3, "loading the weights"), (4, "loading the weights"),
    (5, "sizing the KV cache"), (6, "sizing the KV cache"), (7, "starting its HTTP server"),
])
def test_a_step_that_is_over_or_switched_off_names_no_phase(upto: int, expected: str) -> None:
    """The label moves on as the engine does: a disabled compile is not compiling, a finished
    step ("... took 0.21 seconds") does not turn it back."""
    assert phase("\n".join(VLLM_CPU_LOG.splitlines()[:upto])) == expected


def test_a_log_that_names_no_phase_has_none() -> None:
    assert phase("warnings.warn(\n  something") is None


def test_a_heartbeat_beats_while_open_and_stops_when_closed() -> None:
    said: list[str] = []
    with Heartbeat(said.append, "installing", lambda: ", 1.0 MiB written", every_s=0.05):
        time.sleep(0.28)
    count = len(said)
    time.sleep(0.15)
    assert len(said) == count  # nothing after the close
    assert count >= 3
    assert said[0].startswith("installing: ")
    assert said[0].endswith(" s, 1.0 MiB written")


def test_run_step_says_what_it_does_and_fails_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heartbeat, "EVERY_S", 0.05)
    said: list[str] = []
    script = f"import pathlib, time; p = pathlib.Path({str(tmp_path / 'f')!r}); p.write_bytes(b'x' * 4096); time.sleep(0.3)"
    run_step(said.append, [sys.executable, "-c", script], "writing a file", grows=tmp_path)
    assert said[0] == "writing a file ..."
    assert any(line.startswith("writing a file: ") and line.endswith("4 KiB written") for line in said[1:]), said
    with pytest.raises(LaunchError, match="^setup x: `.*` exited with status 3$"):
        run_step(said.append, [sys.executable, "-c", "raise SystemExit(3)"], "failing", fail="setup x")


def test_sizes_and_start_keys() -> None:
    assert size_text(512) == "512 B"
    assert size_text(3.5 * 2**30) == "3.5 GiB"
    assert tree_bytes(Path("/no/such/dir")) == 0
    # the port changes at every launch; the key of the engine's command line does not
    assert start_key(["vllm", "--model", "m", "--port", "41234"]) == start_key(["vllm", "--model", "m", "--port", "5"])
    assert start_key(["vllm", "--port=5", "--model", "m"]) == "vllm --model m"


def test_a_quiet_step_shows_its_output_only_when_it_fails(capfd: pytest.CaptureFixture[str]) -> None:
    """vLLM's import check warns that Triton has no CPU backend: not the user's business where the
    check passes, the whole story where it fails."""
    said: list[str] = []
    warn = "import sys; print(\"Triton is installed, but doesn't include CPU backend\", file=sys.stderr)"
    run_step(said.append, [sys.executable, "-c", warn], "checking that vLLM imports", quiet=True)
    assert capfd.readouterr() == ("", "")
    assert said == ["checking that vLLM imports ..."]
    with pytest.raises(LaunchError, match="exited with status 3") as err:
        run_step(said.append, [sys.executable, "-c", warn + "; raise SystemExit(3)"], "checking", quiet=True)
    assert "Triton is installed" in err.value.log_tail
