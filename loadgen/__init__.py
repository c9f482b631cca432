"""loadgen: load testing and benchmarking for OpenAI-compatible LLM inference servers.

Importing the package loads nothing but this module: each command imports the stages it
needs (see "Architecture" in README.md). ``__version__`` is the installed distribution's.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("loadgen")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__"]
