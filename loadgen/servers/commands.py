"""Engine name -> the function that turns an ``EngineSpec`` into its command line and
environment (a plain dict, one entry per engine family module)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from loadgen.servers.launch import LaunchSpec
from loadgen.servers.llamacpp import llamacpp_command
from loadgen.servers.sglang import sglang_command
from loadgen.servers.spec import EngineSpec
from loadgen.servers.tgi import tgi_command
from loadgen.servers.transformers import transformers_command
from loadgen.servers.vllm import vllm_command

BUILDERS: dict[str, Callable[[EngineSpec], LaunchSpec]] = {
    "vllm": vllm_command,
    "sglang": sglang_command,
    "tgi": tgi_command,
    "transformers": transformers_command,
    "llamacpp": llamacpp_command,
}


def launch_spec(spec: EngineSpec) -> LaunchSpec:
    return replace(BUILDERS[spec.backend](spec), cpus=spec.cpus)
