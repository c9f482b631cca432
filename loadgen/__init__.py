"""loadgen: load testing and benchmarking for OpenAI-compatible LLM inference servers.

Importing the package loads nothing but this module: each command imports the stages it
needs (see "Architecture" in README.md). ``__version__`` is the installed distribution's, read
when first asked for (the package itself imports nothing, so that a Ctrl-C as the command
starts finds the entry's guard in place).
"""

from __future__ import annotations

__all__ = ["__version__"]


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module 'loadgen' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("loadgen")
    except PackageNotFoundError:  # a source tree that was never installed
        found = "0+unknown"
    globals()["__version__"] = found
    return found
