"""SGLang's command line (``python -m sglang.launch_server`` on this interpreter), with
Prometheus metrics on."""

from __future__ import annotations

import sys

from loadgen.servers.launch import LaunchSpec
from loadgen.servers.spec import EngineSpec
from loadgen.servers.vllm import SGLANG_FLAGS, vllm_like


def sglang_command(spec: EngineSpec) -> LaunchSpec:
    head = [
        sys.executable, "-m", "sglang.launch_server", "--model-path", spec.model.checkpoint,
        "--host", spec.host, "--port", str(spec.port), "--served-model-name", spec.served_name,
        "--tp", str(spec.tp),
    ]
    # --enable-cache-report: each answer's usage says how many prompt tokens came from the cache
    argv = vllm_like(spec, head, SGLANG_FLAGS, ("--enable-metrics", "--enable-cache-report"))
    return LaunchSpec(tuple(argv), spec.host, spec.port, spec.env, spec.ready_timeout_s, "sglang")
