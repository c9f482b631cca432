"""Engine name -> the function that turns an ``EngineSpec`` into its command line and
environment (a plain dict, one entry per engine family module)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from loadgen.servers.ctranslate2 import ctranslate2_command
from loadgen.servers.exllamav2 import exllamav2_command
from loadgen.servers.launch import LaunchSpec
from loadgen.servers.llamacpp import llamacpp_command
from loadgen.servers.mlc import mlc_command
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
    "ctranslate2": ctranslate2_command,
    "mlc": mlc_command,
    "exllamav2": exllamav2_command,
}


def launch_spec(spec: EngineSpec) -> LaunchSpec:
    return replace(BUILDERS[spec.backend](spec), cpus=spec.cpus)
