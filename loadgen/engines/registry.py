"""The engines loadgen launches: the default one first (of a ``serve:`` block or ``loadgen serve``
that names a model and no backend), then the cross-engine table's.

Adding an engine is a module that declares its ``ENGINE`` (see ``loadgen.engines.engine``)
and one line in ``MODULES``; nothing else changes.
"""

from __future__ import annotations

import importlib

from loadgen.engines.engine import Engine
from loadgen.errors import UsageError
from loadgen.results.cellstatus import ServerInfo

# one line per engine: the module that declares it
MODULES: tuple[str, ...] = (
    "loadgen.engines.vllm",
    "loadgen.engines.transformers",
    "loadgen.engines.ctranslate2",
    "loadgen.engines.llamacpp",
    "loadgen.engines.exllamav2",
    "loadgen.engines.mlc",
    "loadgen.engines.sglang",
    "loadgen.engines.tgi",
)


def _declared(module: str) -> Engine:
    engine = getattr(importlib.import_module(module), "ENGINE", None)
    if not isinstance(engine, Engine):
        raise TypeError(f"{module} declares no ENGINE (a loadgen.engines.engine.Engine)")
    return engine


ENGINES: tuple[Engine, ...] = tuple(_declared(m) for m in MODULES)

# engines of the cross-engine table that loadgen cannot launch: name -> (hardware, why)
NOT_LAUNCHABLE: dict[str, tuple[str, str]] = {
    "gpt-fast": ("NVIDIA GPU",
                 "no server and no package: a set of scripts per model (generate.py); loadgen cannot launch or "
                 "measure it"),
}

DEFAULT: Engine = ENGINES[0]

REGISTRY: dict[str, Engine] = {e.name: e for e in ENGINES}
_BY_NAME: dict[str, Engine] = {n.lower(): e for e in ENGINES for n in e.names}
SIM = "sim"  # loadgen's own simulator, which a serve: block starts without a model


def engine_named(name: str | None, what: str = "--backend") -> Engine:
    """The engine a ``--backend`` / ``serve.backend`` value names (None: the default engine);
    ``what`` names the flag or key in the error."""
    if name is None:
        return DEFAULT
    engine = _BY_NAME.get(name.lower())
    if engine is None:
        raise UsageError(f"{what} {name!r}: choose one of {', '.join(REGISTRY)} (see `loadgen engines`)")
    return engine


def backend_of(backend: str | None) -> str:
    """A serve: block's backend as the tables name it: ``sim``, or an engine's own name."""
    return SIM if backend == SIM else engine_named(backend).name


def engine_of_server(server: ServerInfo) -> Engine | None:
    """The engine a cell's server description names, or None (the simulator, a given URL)."""
    return _BY_NAME.get(server.backend.lower()) if server.backend else None
