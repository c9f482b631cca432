"""Golden command lines of every engine of the cross-engine table, at each of its
quantizations, with GPU pinning and tensor parallelism (what `loadgen serve --dry-run` prints)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from loadgen.engines.build import build_spec, engine_options, launch_spec
from loadgen.engines.registry import REGISTRY
from loadgen.errors import UsageError
from loadgen.servers.launch import shell_line


@pytest.fixture(autouse=True)
def fixed_places(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LOADGEN_CACHE", "/cache")
    monkeypatch.setenv("LOADGEN_LLAMA_SERVER", "/opt/llama/llama-server")
    monkeypatch.setenv("LOADGEN_MLC_LLM", "/opt/mlc/mlc_llm")
    monkeypatch.setenv("LOADGEN_TABBYAPI", "/opt/tabbyAPI")
    monkeypatch.setenv("LOADGEN_TABBYAPI_PYTHON", "/opt/tabby/bin/python")


def line(model: str, **kw: object) -> str:
    cpus = kw.pop("cpus", ())
    return shell_line(launch_spec(build_spec(engine_options(model, **kw), cpus)))  # type: ignore[arg-type]


PY = shlex.quote(sys.executable)

GOLDEN = [
    # llama.cpp: the checkpoint converted and quantized into the cache, one GPU or split over two
    (("qwen2-7b",), {"backend": "llamacpp", "quant": "q4_k_m", "gpus": "1"},
     "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=1 /opt/llama/llama-server -m "
     "/cache/gguf/Qwen--Qwen2-7B-Instruct-q4_k_m.gguf --host 127.0.0.1 --port 8000 --alias qwen2-7b -np 16 "
     "-c 524288 --metrics -ngl 999"),
    (("qwen2-7b",), {"backend": "llamacpp", "quant": "q8_0", "gpus": "0,1"},
     "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 /opt/llama/llama-server -m "
     "/cache/gguf/Qwen--Qwen2-7B-Instruct-q8_0.gguf --host 127.0.0.1 --port 8000 --alias qwen2-7b -np 16 "
     "-c 524288 --metrics -ngl 999 --split-mode layer"),
    (("qwen2-7b",), {"backend": "llamacpp", "quant": "bf16", "gpus": "0", "slots": 4},
     "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 /opt/llama/llama-server -m "
     "/cache/gguf/Qwen--Qwen2-7B-Instruct-f16.gguf --host 127.0.0.1 --port 8000 --alias qwen2-7b -np 4 "
     "-c 131072 --metrics -ngl 999"),
    # CTranslate2: loadgen's engine, the compute type as quantization
    (("qwen2-7b",), {"backend": "ctranslate2", "quant": "int8_float16", "gpus": "2"},
     f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2 {PY} -m loadgen.servers.ct2serve --model "
     "/cache/ct2/Qwen--Qwen2-7B-Instruct --tokenizer Qwen/Qwen2-7B-Instruct --served-model-name qwen2-7b "
     "--host 127.0.0.1 --port 8000 --compute-type int8_float16 --device cuda --max-model-len 32768"),
    (("qwen2-7b",), {"backend": "ctranslate2", "quant": "bf16", "gpus": "0"},
     f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 {PY} -m loadgen.servers.ct2serve --model "
     "/cache/ct2/Qwen--Qwen2-7B-Instruct --tokenizer Qwen/Qwen2-7B-Instruct --served-model-name qwen2-7b "
     "--host 127.0.0.1 --port 8000 --compute-type bfloat16 --device cuda --max-model-len 32768"),
    # MLC LLM: mlc-ai's prebuilt weights of the format, tensor shards across the GPUs given
    (("qwen2-7b",), {"backend": "mlc", "quant": "q4f16_1", "gpus": "2,3"},
     "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=2,3 /opt/mlc/mlc_llm serve "
     "HF://mlc-ai/Qwen2-7B-Instruct-q4f16_1-MLC --device cuda --mode server --host 127.0.0.1 --port 8000 "
     "--overrides 'tensor_parallel_shards=2;max_num_sequence=16;context_window_size=32768'"),
    (("qwen2-7b",), {"backend": "mlc", "quant": "q0f16"},
     "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 /opt/mlc/mlc_llm serve "
     "HF://mlc-ai/Qwen2-7B-Instruct-q0f16-MLC --device cuda --mode server --host 127.0.0.1 --port 8000 "
     "--overrides 'tensor_parallel_shards=1;max_num_sequence=16;context_window_size=32768'"),
    # ExLlamaV2 through TabbyAPI: EXL2 at a bit rate, or the GPTQ checkpoint; tensor parallel on two GPUs
    (("qwen2-7b",), {"backend": "exllamav2", "quant": "exl2-4.65bpw", "gpus": "0,1"},
     "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0,1 /opt/tabby/bin/python /opt/tabbyAPI/main.py "
     "--host 127.0.0.1 --port 8000 --disable-auth true --model-dir /opt/tabbyAPI/models --model-name "
     "Qwen2-7B-Instruct-exl2-4.65bpw --backend exllamav2 --max-seq-len 32768 --max-batch-size 16 "
     "--tensor-parallel true"),
    (("qwen2-7b",), {"backend": "exllamav2", "quant": "gptq-int4", "gpus": "0"},
     "CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 /opt/tabby/bin/python /opt/tabbyAPI/main.py "
     "--host 127.0.0.1 --port 8000 --disable-auth true --model-dir /opt/tabbyAPI/models --model-name "
     "Qwen2-7B-Instruct-GPTQ-Int4 --backend exllamav2 --max-seq-len 32768 --max-batch-size 16"),
    # the transformers engine's reference rows
    (("qwen2-7b",), {"backend": "transformers", "quant": "bf16", "gpus": "0", "load_in": "8bit",
                     "attn": "flash_attention_2", "grad_mode": "no_grad"},
     f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 {PY} -m loadgen.servers.hfserve --model "
     "Qwen/Qwen2-7B-Instruct --served-model-name qwen2-7b --host 127.0.0.1 --port 8000 --device cuda "
     "--attn-implementation flash_attention_2 --max-model-len 32768 --dtype bfloat16 --load-in 8bit "
     "--grad-mode no_grad"),
    (("qwen2-7b",), {"backend": "transformers", "quant": "fp32", "gpus": "0", "attn": "eager"},
     f"CUDA_DEVICE_ORDER=PCI_BUS_ID CUDA_VISIBLE_DEVICES=0 {PY} -m loadgen.servers.hfserve --model "
     "Qwen/Qwen2-7B-Instruct --served-model-name qwen2-7b --host 127.0.0.1 --port 8000 --device cuda "
     "--attn-implementation eager --max-model-len 32768 --dtype float32"),
]


@pytest.mark.parametrize(("args", "kw", "expected"), GOLDEN, ids=lambda x: str(x)[:40] if isinstance(x, dict) else None)
def test_golden_command_lines(args: tuple[str], kw: dict[str, object], expected: str) -> None:
    assert line(*args, **kw) == expected


@pytest.mark.parametrize("backend", sorted(e.name for e in REGISTRY.values() if e.quants))
def test_every_engine_quantization_has_a_command_line(backend: str) -> None:
    for quant in REGISTRY[backend].quants:
        text = line("qwen2-7b", backend=backend, quant=quant, gpus="0")
        assert "CUDA_VISIBLE_DEVICES=0" in text
        if backend == "llamacpp":
            assert text.count(f"-{'f16' if quant == 'f16' else quant}.gguf") == 1
        elif backend == "ctranslate2":
            assert f"--compute-type {quant}" in text
        elif backend == "mlc":
            assert f"Qwen2-7B-Instruct-{quant}-MLC" in text
        elif backend == "transformers":
            assert f"--dtype {dict(fp32='float32', fp16='float16', bf16='bfloat16')[quant]}" in text
        else:
            assert f"Qwen2-7B-Instruct-{quant}" in text


def test_tiny_on_cpu_for_the_cpu_engines() -> None:
    text = line("tiny", backend="llamacpp", quant="q4_k_m", device="cpu", cpus=(0, 1))
    assert text.startswith("CUDA_VISIBLE_DEVICES='' taskset -c 0,1 /opt/llama/llama-server -m /cache/gguf/")
    assert text.endswith("-q4_k_m.gguf --host 127.0.0.1 --port 8000 --alias tiny -np 16 -c 65536 --metrics -t 2")
    text = line("tiny", backend="ctranslate2", quant="int8", device="cpu", cpus=(1,))
    assert "--compute-type int8 --device cpu --max-model-len 4096 --threads 1" in text


@pytest.mark.parametrize(("kw", "message"), [
    ({"backend": "mlc", "device": "cpu", "model": "tiny"}, "no CPU build"),
    ({"backend": "exllamav2", "device": "cpu", "model": "tiny"}, "no CPU build"),
    ({"backend": "llamacpp", "quant": "q4_k_m"}, None),
    ({"backend": "vllm", "quant": "q4_k_m"}, "choose one of bf16"),
    ({"backend": "llamacpp", "quant": "int8"}, "llamacpp's own: f16, q8_0"),
    ({"backend": "ctranslate2", "tp": 2}, "runs on one device"),
    ({"backend": "llamacpp", "quant": "awq"}, "llama.cpp quantizes GGUF files itself"),
    ({"backend": "vllm", "load_in": "8bit"}, "--load-in: vLLM .vllm. has no such option; the engines that take it: transformers"),
    ({"backend": "transformers", "load_in": "2bit"}, "--load-in '2bit': choose one of 8bit, 4bit"),
    ({"backend": "llamacpp", "kv_cache_dtype": "fp8"}, "--kv-cache-dtype: llama.cpp .llamacpp. has no such option; the engines that take it: vllm, sglang"),
])
def test_engine_options_that_do_not_fit_are_refused(kw: dict[str, object], message: str | None) -> None:
    model = str(kw.pop("model", "qwen2-7b"))
    if message is None:
        build_spec(engine_options(model, **kw))  # type: ignore[arg-type]
        return
    with pytest.raises(UsageError, match=message):
        launch_spec(build_spec(engine_options(model, **kw)))  # type: ignore[arg-type]
