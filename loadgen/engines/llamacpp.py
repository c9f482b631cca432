"""llama.cpp: ``llama-server`` (``$LOADGEN_LLAMA_SERVER``, else the one on ``PATH``, else the one
``loadgen setup llamacpp`` built) on a ``.gguf`` file: as given, or the checkpoint converted
(f16) and quantized (q8_0, q4_k_m, ...) into loadgen's cache.

``loadgen setup llamacpp`` builds ``llama-server`` and ``llama-quantize`` from the llama.cpp
source that ``llama-cpp-python``'s source distribution vendors (a pinned release, from PyPI),
with cmake, once, into loadgen's engine cache; a Hugging Face checkpoint (the tiny model
included) becomes a GGUF file: converted to f16 with the vendored ``convert_hf_to_gguf.py``,
then quantized with ``llama-quantize``.

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
from pathlib import Path

from loadgen.engines.engine import Echo, Engine, Setup, missing_modules, program_installed
from loadgen.engines.spec import EngineSpec
from loadgen.errors import LaunchError, UsageError
from loadgen.servers.heartbeat import Heartbeat, size_text
from loadgen.servers.launch import LaunchSpec
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


def setup_llamacpp(echo: Echo, *, jobs: int | None = None) -> Path:
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


# what the converter imports: torch and transformers (loadgen[transformers]), and more
CONVERTER_IMPORTS = ("torch", "transformers")
CONVERTER_NEEDS = ("sentencepiece",)


def _converter_needs(echo: Echo) -> None:
    """The converter's own Python needs, into this interpreter (the ``llamacpp`` extra has them)."""
    missing = [m for m in CONVERTER_NEEDS if subprocess.run([sys.executable, "-c", f"import {m}"],
                                                             capture_output=True).returncode]
    if missing:
        _run(echo, sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *missing)


def _run(echo: Echo, *argv: str, progress: bool = False) -> None:
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


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def ensure_gguf(checkpoint: str, out: Path, quant: str, echo: Echo, *,
                pre_tokenizer: str | None = None) -> Path:
    """``out``: the checkpoint as a GGUF file of ``quant`` (f16, or quantized from the f16 one)."""
    if out.is_file():
        return out
    if not is_set_up():
        raise LaunchError("llama.cpp is not built here: run `loadgen setup llamacpp` (once, a few minutes)")
    out.parent.mkdir(parents=True, exist_ok=True)
    f16 = out.with_name(out.name.rsplit("-", 1)[0] + "-f16.gguf")
    if not f16.is_file():
        for module in missing_modules(*CONVERTER_IMPORTS, *CONVERTER_NEEDS):
            raise LaunchError(f"converting {checkpoint} to GGUF needs {module}: pip install 'loadgen[llamacpp]'")
        echo(f"converting {checkpoint} to GGUF (f16): {f16}")
        tmp = f16.with_suffix(f".{os.getpid()}.part")  # apart from a concurrent conversion
        with Heartbeat(echo, "converting to GGUF", lambda: f", {size_text(_size(tmp))} written"):
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
        tmp = out.with_suffix(f".{os.getpid()}.part")  # apart from a concurrent conversion
        with Heartbeat(echo, f"quantizing to {quant}", lambda: f", {size_text(_size(tmp))} written"):
            proc = subprocess.run([str(built_tool("llama-quantize")), str(f16), str(tmp), quant.upper()],
                                  capture_output=True, text=True)
        if proc.returncode != 0:
            raise LaunchError(f"llama-quantize could not make {quant} (status {proc.returncode})", proc.stderr[-3000:])
        tmp.replace(out)
    return out


def gguf_path(spec: EngineSpec) -> str:
    """A ``.gguf`` file as given, else the conversion of the Hugging Face checkpoint in the cache."""
    ckpt = spec.model.checkpoint
    if ckpt.endswith(".gguf"):
        return ckpt
    stem = Path(ckpt).name if Path(ckpt).is_absolute() else ckpt.replace("/", "--")
    kind = gguf_kind(spec)
    return str(cache_root() / "gguf" / f"{stem}-{kind}.gguf")


def gguf_kind(spec: EngineSpec) -> str:
    """The GGUF type a quantization names (full precision: f16, as the reference tables' rows)."""
    q = spec.model.quant
    if q in ("bf16", "fp16", "auto", "f16", "fp32"):
        return "f16"
    if q.startswith(("gptq", "awq", "fp8")):
        raise UsageError(f"--quant {q}: llama.cpp quantizes GGUF files itself; use f16, q8_0, q6_k, q5_k_m, "
                         "q4_k_m or q4_0")
    return q


def llama_server() -> str:
    built = built_tool("llama-server")
    return (os.environ.get("LOADGEN_LLAMA_SERVER") or shutil.which("llama-server")
            or str(built))


def command(spec: EngineSpec) -> LaunchSpec:
    """``llama-server`` with ``-np`` parallel slots, each of the full context, and ``--metrics``."""
    if spec.pp > 1:
        raise UsageError("--pp: llama.cpp splits layers over the GPUs given; use --gpus only")
    server = llama_server()
    length = spec.setting.max_model_len
    argv = [
        server, "-m", gguf_path(spec), "--host", spec.host, "--port", str(spec.port), "--alias", spec.served_name,
        "-np", str(spec.slots), "-c", str(length * spec.slots), "--metrics",
    ]
    if spec.cpus:
        argv += ["-t", str(len(spec.cpus))]  # one thread per core it was given
    if spec.device == "cuda":
        argv += ["-ngl", "999"]
        if len(spec.gpus) > 1:
            argv += ["--split-mode", "layer"]
    return LaunchSpec((*argv, *spec.extra_args), spec.host, spec.port, spec.env, spec.ready_timeout_s)


def missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    exe = launch.argv[0]
    if shutil.which(exe) is None and not Path(exe).is_file():
        return f"{exe!r} is not on PATH: run `loadgen setup llamacpp` (builds it once), or set LOADGEN_LLAMA_SERVER"
    return None


def prepare(spec: EngineSpec, launch: LaunchSpec, echo: Echo) -> None:
    """The GGUF file the command names: converted and quantized from a local checkpoint once."""
    gguf = Path(launch.argv[launch.argv.index("-m") + 1])
    if gguf.is_file():
        return
    if not Path(spec.model.checkpoint).is_dir():
        raise LaunchError(
            f"llama.cpp needs a GGUF file and {gguf} does not exist: pass a .gguf file or a local "
            "checkpoint directory as MODEL (loadgen converts it)"
        )
    # the tiny model's tokenizer splits words as GPT-2's byte-level BPE does
    generated = spec.model.entry is not None and spec.model.entry.generated
    ensure_gguf(spec.model.checkpoint, gguf, gguf.stem.rsplit("-", 1)[1], echo,
                pre_tokenizer="gpt-2" if generated else None)


def installed() -> tuple[bool, str]:
    ok, found = program_installed(llama_server(), "llama-server not built")
    return ok, found


ENGINE = Engine(
    name="llamacpp", label="llama.cpp", aliases=("llama.cpp",), command=command,
    hardware="CPU (built here); CUDA builds by hand (LOADGEN_LLAMA_SERVER)", install="loadgen setup llamacpp",
    installed=installed, missing=missing, prepare=prepare, cpu=True, quants=GGUF_QUANTS, options=("slots",),
    setup=Setup("llamacpp", setup_llamacpp, "llama.cpp built from source"),
    metrics={"running": ("llamacpp:requests_processing",), "waiting": ("llamacpp:requests_deferred",)},
)
