"""``Engine``: everything loadgen knows about one engine it launches, declared in one place.

Each engine module (``loadgen.engines.vllm``, ...) declares one ``ENGINE`` and
``loadgen.engines.registry`` lists them. Everything engine-specific that the rest of loadgen
needs is a field here: the names users write, the options and quantizations it takes, its
command line, container image and one-time setup, what it needs before launch, readiness, the
names of its Prometheus metrics, and how the published tables describe it.
"""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from loadgen.engines.spec import EngineSpec
    from loadgen.results.cellstatus import ServerInfo
    from loadgen.servers.launch import LaunchSpec

Echo = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Image:
    """An engine's official container image and how its server starts inside it."""

    name: str
    env: str  # the environment variable that overrides the image (also in docker/*.yaml)
    head: tuple[str, ...]  # the command that replaces the launch's first `replaces` words
    replaces: int  # how many leading words of the host command line `head` replaces
    hf_cache: str  # where the image expects the Hugging Face cache
    port: int  # the port the server listens on inside the container
    host_flag: str = "--host"
    ipc_host: bool = False  # PyTorch workers share tensors through the host's shared memory


def nothing_missing(spec: EngineSpec, launch: LaunchSpec) -> str | None:
    return None


def missing_modules(*modules: str) -> list[str]:
    """The Python packages among ``modules`` this interpreter cannot import."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def modules_installed(*modules: str) -> tuple[bool, str]:
    """``Engine.installed`` of an engine that is a Python package (or needs some)."""
    missing = missing_modules(*modules)
    return not missing, "installed" if not missing else f"missing {', '.join(missing)}"


def program_installed(exe: str, what: str) -> tuple[bool, str]:
    """``Engine.installed`` of an engine that is a program: a path, or a name on PATH."""
    found = shutil.which(exe) or (exe if Path(exe).is_file() else None)
    return (True, found) if found else (False, what)


@dataclass(frozen=True, slots=True)
class Setup:
    """``loadgen setup NAME``: a one-time install of the engine on this machine."""

    name: str
    run: Callable[[Echo], object]
    what: str  # one line for the help: what it installs


@dataclass(frozen=True, slots=True)
class Engine:
    name: str  # the --backend / serve.backend value
    label: str  # the engine as people write it (the cross-engine table's Software column)
    command: Callable[[EngineSpec], LaunchSpec]  # its command line and environment
    hardware: str  # what it runs on, in words (`loadgen engines`)
    install: str  # how to install it, in words
    installed: Callable[[], tuple[bool, str]]  # installed here?, and what was found or is missing
    aliases: tuple[str, ...] = ()  # other names users write for it (`--backend llama.cpp`)
    table_label: str = ""  # the word of the speed tables' titles, when not `label`
    about: str = ""  # added to the label where loadgen says what it launched, e.g. "(TabbyAPI)"
    cpu: bool = False  # runs on CPU as well as on NVIDIA GPUs
    # quantizations the engine makes itself from the full-precision checkpoint (or its own
    # checkpoint format); the catalogue's published ones (bf16, gptq-int4, awq, ...) apply to all
    quants: tuple[str, ...] = ()
    # the engine options it takes beyond the common ones (names of ``EngineOptions`` fields)
    options: tuple[str, ...] = ()
    # why it cannot start here (a missing program or package), or None
    missing: Callable[[EngineSpec, LaunchSpec], str | None] = nothing_missing
    # work before the launch: converting the checkpoint to the engine's format
    prepare: Callable[[EngineSpec, LaunchSpec, Echo], None] | None = None
    setup: Setup | None = None
    image: Callable[[EngineSpec], Image | None] = lambda spec: None
    # answered 200 in turn once it is ready
    ready_paths: tuple[str, ...] = ("/health", "/v1/models")
    # loadgen's metric name (running, waiting, kv_cache_usage, ttft_s, ...) -> the engine's names
    metrics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    preallocates: bool = False  # on GPUs it takes its KV cache up front (memory says little)
    # the transformers engine reports its own peak allocation: the memory the documents measure
    reports_peak_memory: bool = False
    # the environment that lets it serve POST /reset_prefix_cache (between cells)
    reset_cache_env: Mapping[str, str] = field(default_factory=dict)
    # the cross-engine comparison's Settings lines for the options a cell's server ran with
    settings: Callable[[ServerInfo], list[str]] = lambda server: []
    uses_eager: bool = False  # it runs the settings preset's eager mode (no CUDA graphs)

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def word(self) -> str:
        return self.table_label or self.label
