"""The hints of a run that cannot go on: the keys that move a GPU scenario to CPU, flags said
as the scenario keys that set them, an engine's last error line, a checkpoint's availability."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadgen.engines.hub import cached, unavailable
from loadgen.engines.nogpu import cpu_sets, gpu_engines
from loadgen.engines.registry import ENGINES
from loadgen.load.serving import as_keys
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.schema import Scenario
from loadgen.servers.launch import last_error

CPU_ENGINE = next(e.name for e in ENGINES if e.cpu)
GPU_ONLY = next(e.name for e in ENGINES if not e.cpu and "sim" not in e.name)


def scenario(data: dict[str, object], sets: list[str] | None = None) -> Scenario:
    return parse_scenario({"name": "s", **data}, "s.yaml", sets)


def test_a_matrix_over_models_on_two_gpus_moves_to_cpu_by_narrowing_the_axis() -> None:
    sc = scenario({"serve": {"backend": CPU_ENGINE, "tp": 2}, "matrix": {"model": ["qwen2-7b", "qwen2-57b"]}})
    assert gpu_engines(sc, "s.yaml") == [f"{CPU_ENGINE} qwen2-7b on 2 GPUs", f"{CPU_ENGINE} qwen2-57b on 2 GPUs"]
    sets = cpu_sets(sc)
    # (and no limit between bytes: a request queued on a CPU engine waits minutes for its first)
    assert sets == ["serve.device=cpu", "matrix.model=[tiny]", "serve.tp=1", "target.timeouts.between_tokens_s=null"]
    assert gpu_engines(scenario({"serve": {"backend": CPU_ENGINE, "tp": 2}, "matrix": {"model": ["qwen2-7b"]}},
                                sets), "s.yaml") == []


def test_an_engine_without_a_cpu_build_and_a_quantization_are_replaced_too() -> None:
    sc = scenario({"serve": {"backend": GPU_ONLY, "model": "qwen2-7b", "quant": "awq", "gpus": "0"}})
    sets = cpu_sets(sc)
    assert sets == ["serve.device=cpu", f"serve.backend={CPU_ENGINE}", "serve.model=tiny", "serve.gpus=null",
                    "serve.quant=null", "target.timeouts.between_tokens_s=null"]
    kept = scenario({"serve": {"backend": GPU_ONLY, "model": "qwen2-7b"}, "target": {"timeouts": {"between_tokens_s": 30}}})
    assert not [s for s in cpu_sets(kept) if s.startswith("target.")]  # a limit the user set is theirs
    moved = scenario({"serve": {"backend": GPU_ONLY, "model": "qwen2-7b", "quant": "awq", "gpus": "0"}}, sets)
    assert gpu_engines(moved, "s.yaml") == []


def test_the_simulator_and_skippable_points_need_no_gpu() -> None:
    assert gpu_engines(scenario({}), "s.yaml") == []
    skippable = scenario({"serve": {"backend": CPU_ENGINE, "model": "qwen2-7b", "skip_unavailable": True}})
    assert gpu_engines(skippable, "s.yaml") == []


def test_flags_become_the_keys_run_takes_but_a_quoted_command_stays() -> None:
    assert as_keys("--device cpu: drop --gpus, --tp and --pp") == "serve.device cpu: drop serve.gpus, serve.tp and serve.pp"
    assert as_keys("runs on CPU (`loadgen serve tiny --device cpu`)") == "runs on CPU (`loadgen serve tiny --device cpu`)"
    assert as_keys("--no-such-flag x") == "--no-such-flag x"


def test_the_last_error_line_of_an_engine_log_is_the_exception_not_its_frames() -> None:
    log = "\n".join([
        "INFO 11-24 loading model",
        "Traceback (most recent call last):",
        '  File "/x/y.py", line 3, in <module>',
        "    raise OSError(...)",
        "OSError: We couldn't connect to 'https://huggingface.co' to load the files",
        "",
    ])
    assert last_error(log) == "OSError: We couldn't connect to 'https://huggingface.co' to load the files"
    assert last_error("INFO all good\nINFO ready") is None
    assert last_error("ERROR " + "x" * 400).endswith("…")


def test_a_cached_snapshot_or_a_local_path_is_available(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the hub is out of reach
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert not cached("org/model")
    why = unavailable("org/model")
    assert why is not None
    assert "not in the Hugging Face cache" in why
    snap = tmp_path / "models--org--model" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    assert unavailable("org/model") is not None  # an empty snapshot is not a download
    (snap / "config.json").write_text("{}")
    assert unavailable("org/model") is None
    assert unavailable(str(tmp_path)) is None
    assert unavailable("/no/such/dir") == "model /no/such/dir: no such file or directory, and not a hub id (ORG/NAME)"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert "HF_HUB_OFFLINE is set" in (unavailable("org/other") or "")
