"""loadgen: load testing and benchmarking for OpenAI-compatible LLM inference servers.

The public API is what this module exports; ``tests/unit/test_exported_members.py`` pins it.
"""

from __future__ import annotations

__version__ = "0.1.0"

from loadgen.errors import (
    AbortedError,
    LaunchError,
    LoadgenError,
    RunDirError,
    ScenarioError,
    ServerError,
    TargetError,
    UsageError,
)
from loadgen.matrix import Cell, expand_cells
from loadgen.metrics import distribution, summarize
from loadgen.records import RequestRecord, read_records
from loadgen.rundir import rebuild_summary
from loadgen.runner import RunResult, execute
from loadgen.scenario import Scenario, load_scenario
from loadgen.schedule import build_schedule
from loadgen.sim import SimConfig
from loadgen.sse import SSEParser

__all__ = [
    "AbortedError",
    "Cell",
    "LaunchError",
    "LoadgenError",
    "RequestRecord",
    "RunDirError",
    "RunResult",
    "SSEParser",
    "Scenario",
    "ScenarioError",
    "ServerError",
    "SimConfig",
    "TargetError",
    "UsageError",
    "__version__",
    "build_schedule",
    "distribution",
    "execute",
    "expand_cells",
    "load_scenario",
    "read_records",
    "rebuild_summary",
    "summarize",
]
