from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadgen.engines.vllm import vllm_cpu_python


@pytest.fixture(scope="module")
def vllm_cpu() -> None:
    if not Path(vllm_cpu_python()).exists():
        message = "vLLM's CPU build is not installed (loadgen setup vllm-cpu)"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run must install it")
        pytest.skip(message)
