"""The launcher scripts in the top-level servers/ are exactly what `loadgen serve ... --script`
writes for the command on their second line, so they never drift from loadgen's own launches."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

SERVERS = Path(__file__).resolve().parents[3] / "servers"
SCRIPTS = sorted(SERVERS.glob("*.sh"))


def regenerate(command: str) -> str:
    argv = shlex.split(command)
    assert argv[:2] == ["loadgen", "serve"]
    assert "--script" not in argv
    env = {k: v for k, v in os.environ.items() if k not in ("LOADGEN_LLAMA_SERVER", "LOADGEN_VLLM_PYTHON")}
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", *argv[1:], "--script"], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_reference_configurations_have_scripts() -> None:
    names = {p.stem for p in SCRIPTS}
    for family in ("vllm", "sglang", "tgi", "llamacpp", "transformers"):
        assert any(n.startswith(family + "-") for n in names), family
    assert "vllm-qwen2-57b-tp2" in names


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.stem)
def test_script_is_what_serve_writes(script: Path) -> None:
    text = script.read_text()
    lines = text.splitlines()
    assert lines[0] == "#!/usr/bin/env bash"
    assert os.access(script, os.X_OK)
    assert regenerate(lines[1].removeprefix("# ")) == text


def test_script_pins_gpus_and_parallelism() -> None:
    text = (SERVERS / "vllm-qwen2-57b-tp2.sh").read_text()
    assert "export CUDA_VISIBLE_DEVICES=0,1\n" in text
    exec_line = next(line for line in text.splitlines() if line.startswith("exec "))
    argv = shlex.split(exec_line)
    assert argv[1:3] == ["vllm", "serve"]
    assert argv[argv.index("--tensor-parallel-size") + 1] == "2"
    assert argv[-1] == "$@"  # extra engine arguments pass through


def test_script_runs_as_written(tmp_path: Path) -> None:
    """The script executes its engine with its environment: a stand-in `vllm` on PATH records both."""
    fake = tmp_path / "vllm"
    fake.write_text('#!/usr/bin/env bash\necho "$CUDA_VISIBLE_DEVICES|$*"\n')
    fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["bash", str(SERVERS / "vllm-qwen2-57b-tp2.sh"), "--seed", "1"], capture_output=True, text=True, env=env,
        check=True,
    )
    devices, args = done.stdout.strip().split("|")
    assert devices == "0,1"
    assert args.startswith("serve Qwen/Qwen2-57B-A14B-Instruct ")
    assert args.endswith(" --seed 1")


def test_a_line_break_in_an_argument_stays_inside_the_comment(tmp_path: Path) -> None:
    # the served name is any text: a line break in it must not end the `#` line and run the rest
    marker = tmp_path / "ran"
    name = f"m\ntouch {marker}\n"
    done = subprocess.run(
        [sys.executable, "-m", "loadgen", "serve", "tiny", "--backend", "vllm", "--served-model-name", name,
         "--script"], capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    script = tmp_path / "s.sh"
    script.write_text(done.stdout)
    assert done.stdout.splitlines()[1].startswith("# loadgen serve tiny")
    assert "\\ntouch" in done.stdout.splitlines()[1]
    fake = tmp_path / "bin"
    fake.mkdir()
    for program in ("vllm", "python", "python3"):  # whatever the script execs: a stand-in that says it ran
        (fake / program).write_text('#!/usr/bin/env bash\necho ran\n')
        (fake / program).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "PYTHON": str(fake / "python3")}
    subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env, timeout=60, check=False)
    assert not marker.exists()
