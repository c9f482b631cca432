"""llama.cpp on this machine: ``loadgen setup llamacpp`` builds ``llama-server`` and
``llama-quantize`` from the llama.cpp source that ``llama-cpp-python``'s source distribution
vendors (a pinned release, from PyPI), with cmake, once, into loadgen's engine cache; and a
Hugging Face checkpoint (the tiny model included) becomes a GGUF file: converted to f16 with
the vendored ``convert_hf_to_gguf.py``, then quantized with ``llama-quantize``.

    ENGINES/llamacpp/
      bin/llama-server, bin/llama-quantize   static binaries
      src/                                   the vendored llama.cpp tree (converter, gguf-py)
      loadgen-setup.json                     the release built and the CPU it was built for
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from loadgen.errors import LaunchError
from loadgen.servers.tiny import cache_root

LLAMA_CPP_PYTHON_VERSION = "0.3.36"  # its sdist vendors the llama.cpp release loadgen builds
TOOLS = ("llama-server", "llama-quantize")
MARKER = "loadgen-setup.json"
# what llama-quantize makes of an f16 GGUF; f16 is the conversion itself
GGUF_QUANTS: tuple[str, ...] = ("f16", "q8_0", "q6_k", "q5_k_m", "q4_k_m", "q4_0")


def llamacpp_home() -> Path:
    return cache_root() / "engines" / "llamacpp"


def built_tool(name: str) -> Path:
    return llamacpp_home() / "bin" / name


def _cpu() -> str:
    """What a native build depends on: the machine and its CPU's feature flags."""
    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.machine()} {len(flags.split())} flags {hashlib.sha256(flags.encode()).hexdigest()[:12]}"


def is_set_up() -> bool:
    marker = llamacpp_home() / MARKER
    if not marker.is_file() or not all(built_tool(t).is_file() for t in TOOLS):
        return False
    data = json.loads(marker.read_text())
    return bool(data.get("version") == LLAMA_CPP_PYTHON_VERSION and data.get("cpu") == _cpu())


def setup_llamacpp(echo: Callable[[str], None], *, jobs: int | None = None) -> Path:
    """Build (or reuse) llama-server and llama-quantize; returns the directory holding them."""
    home = llamacpp_home()
    if is_set_up():
        echo(f"llama.cpp (llama-cpp-python {LLAMA_CPP_PYTHON_VERSION}'s source) already built in {home / 'bin'}")
        _converter_needs(echo)
        return home / "bin"
    home.mkdir(parents=True, exist_ok=True)
    cmake = shutil.which("cmake")
    if cmake is None:
        echo("cmake is not on PATH: installing it from PyPI")
        _run(echo, sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "cmake")
        cmake = shutil.which("cmake") or str(Path(sys.executable).parent / "cmake")
    if shutil.which("c++") is None and shutil.which("g++") is None:
        raise LaunchError("setup llamacpp: no C++ compiler on PATH; install one (Debian: apt-get install g++)")
    with tempfile.TemporaryDirectory(prefix="loadgen-llamacpp-") as tmp:
        work = Path(tmp)
        _run(echo, sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--no-deps",
             "--no-binary", ":all:", f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", "-d", str(work))
        sdist = next(work.glob("llama_cpp_python-*.tar.gz"))
        echo(f"unpacking llama.cpp from {sdist.name}")
        prefix = f"{sdist.name.removesuffix('.tar.gz')}/vendor/llama.cpp/"
        with tarfile.open(sdist) as tar:
            members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
            for m in members:
                m.name = m.name[len(prefix):]
            tar.extractall(work / "src", members=[m for m in members if m.name], filter="data")
        build = work / "build"
        _run(echo, cmake, "-S", str(work / "src"), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
             "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
             "-DLLAMA_BUILD_SERVER=ON", "-DGGML_NATIVE=ON", *(["-G", "Ninja"] if shutil.which("ninja") else []))
        n = jobs or max(os.cpu_count() or 1, 1)
        echo(f"building {' and '.join(TOOLS)} with {n} jobs (a few minutes, once)")
        _run(echo, cmake, "--build", str(build), "--config", "Release", "-j", str(n), "--target", *TOOLS,
             progress=True)
        (home / "bin").mkdir(exist_ok=True)
        for tool in TOOLS:
            shutil.copy2(build / "bin" / tool, home / "bin" / tool)
        if (home / "src").exists():
            shutil.rmtree(home / "src")
        keep = ("convert_hf_to_gguf.py", "conversion", "gguf-py", "LICENSE")
        for name in keep:
            src = work / "src" / name
            if src.is_dir():
                shutil.copytree(src, home / "src" / name)
            elif src.is_file():
                (home / "src").mkdir(exist_ok=True)
                shutil.copy2(src, home / "src" / name)
    _converter_needs(echo)
    (home / MARKER).write_text(json.dumps({"version": LLAMA_CPP_PYTHON_VERSION, "cpu": _cpu()}) + "\n")
    echo(f"llama.cpp ready: {home / 'bin'}")
    return home / "bin"


# what the converter imports besides torch and transformers (loadgen[transformers])
CONVERTER_NEEDS = ("sentencepiece",)


def _converter_needs(echo: Callable[[str], None]) -> None:
    """The converter's own Python needs, into this interpreter (the ``llamacpp`` extra has them)."""
    missing = [m for m in CONVERTER_NEEDS if subprocess.run([sys.executable, "-c", f"import {m}"],
                                                             capture_output=True).returncode]
    if missing:
        _run(echo, sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *missing)


def _run(echo: Callable[[str], None], *argv: str, progress: bool = False) -> None:
    """Run a build step; a build's progress lines (``[ 42%]``, ``[17/90]``) are passed on."""
    echo("$ " + " ".join(argv))
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = [*tail[-30:], line.rstrip()]
        if progress and line.startswith("["):
            echo(line.rstrip()[:160])
    if proc.wait() != 0:
        raise LaunchError(f"setup llamacpp: `{' '.join(argv[:3])} ...` exited with status {proc.returncode}",
                          "\n".join(tail))


# the converter checks the tokenizer's pre-tokenizer against a list of known models; the tiny
# model's locally trained tokenizer splits words as GPT-2's byte-level BPE does
_CONVERT = """
import sys
src = sys.argv.pop(1)
pre = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import conversion.base as base
if pre:
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
import runpy
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def ensure_gguf(checkpoint: str, out: Path, quant: str, echo: Callable[[str], None], *,
                pre_tokenizer: str | None = None) -> Path:
    """``out``: the checkpoint as a GGUF file of ``quant`` (f16, or quantized from the f16 one)."""
    if out.is_file():
        return out
    if not is_set_up():
        raise LaunchError("llama.cpp is not built here: run `loadgen setup llamacpp` (once, a few minutes)")
    out.parent.mkdir(parents=True, exist_ok=True)
    f16 = out.with_name(out.name.rsplit("-", 1)[0] + "-f16.gguf")
    if not f16.is_file():
        for module in ("torch", "transformers", *CONVERTER_NEEDS):
            if subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True).returncode:
                raise LaunchError(
                    f"converting {checkpoint} to GGUF needs {module}: pip install 'loadgen[llamacpp]'"
                )
        echo(f"converting {checkpoint} to GGUF (f16): {f16}")
        tmp = f16.with_suffix(".part")
        proc = subprocess.run(
            [sys.executable, "-c", _CONVERT, str(llamacpp_home() / "src"), pre_tokenizer or "", checkpoint,
             "--outfile", str(tmp), "--outtype", "f16"], capture_output=True, text=True,
        )
        if proc.returncode != 0:
            raise LaunchError(f"convert_hf_to_gguf.py could not convert {checkpoint} (status {proc.returncode})",
                              proc.stderr[-3000:])
        tmp.replace(f16)
    if quant != "f16":
        echo(f"quantizing to {quant}: {out}")
        tmp = out.with_suffix(".part")
        proc = subprocess.run([str(built_tool("llama-quantize")), str(f16), str(tmp), quant.upper()],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise LaunchError(f"llama-quantize could not make {quant} (status {proc.returncode})", proc.stderr[-3000:])
        tmp.replace(out)
    return out
