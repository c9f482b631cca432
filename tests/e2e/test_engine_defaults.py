"""Every CPU engine's default command line (`loadgen serve tiny --backend B`, no other flag) is
one its own argument parser takes: the default quantization, dtype and threads are valid values
of the engine's command line. Each command line is the one `--dry-run` prints."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from loadgen.engines.vllm import vllm_cpu_python
from tests.e2e.test_engines import ROOT

VLLM_PARSE = """
import sys
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
except ImportError:  # the module's older home
    from vllm.entrypoints.openai.cli_args import make_arg_parser, validate_parsed_serve_args
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
validate_parsed_serve_args(args)
print("parsed", args.dtype, args.max_model_len)
"""


def default_argv(backend: str) -> list[str]:
    """The engine's command as `loadgen serve tiny --backend BACKEND --dry-run` prints it, without
    the environment and the core pinning in front of it."""
    proc = subprocess.run([sys.executable, "-m", "loadgen", "serve", "tiny", "--backend", backend, "--dry-run"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    words = shlex.split(proc.stdout.strip())
    while "=" in words[0]:
        words.pop(0)
    if words[0] == "taskset":
        words = words[3:]
    return words


@pytest.mark.parametrize("backend", ["ctranslate2", "transformers"])
def test_loadgens_own_engines_take_their_default_command_line(backend: str) -> None:
    from loadgen.servers import ct2serve, hfserve

    argv = default_argv(backend)
    assert argv[1:3] == ["-m", f"loadgen.servers.{'ct2serve' if backend == 'ctranslate2' else 'hfserve'}"]
    parser = ct2serve.parser() if backend == "ctranslate2" else hfserve.parser()
    args = parser.parse_args(argv[3:])  # exits 2 on a value the engine refuses
    if backend == "ctranslate2":
        assert args.compute_type == "default"  # no --quant: the model's own precision


@pytest.mark.engines
def test_vllm_takes_its_default_command_line(vllm_cpu: None) -> None:
    argv = default_argv("vllm")
    assert argv[0] == str(vllm_cpu_python())
    assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    proc = subprocess.run([argv[0], "-c", VLLM_PARSE, *argv[3:]], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "parsed auto 4096"


@pytest.mark.engines
def test_llamacpp_takes_its_default_command_line(llamacpp_built: None, tmp_path: Path) -> None:
    argv = default_argv("llamacpp")
    # the same arguments with a model that is not there: llama-server parses them all, then
    # fails to load the model (an argument it refuses ends it before, with its usage)
    argv[argv.index("-m") + 1] = str(tmp_path / "absent.gguf")
    argv[argv.index("--port") + 1] = "0"
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    said = proc.stdout + proc.stderr
    assert "failed to load model" in said, said[-3000:]
    assert "invalid argument" not in said
    assert "error while handling argument" not in said
