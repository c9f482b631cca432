from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadgen.engines.preflight import check_models
from loadgen.engines.registry import engine_named
from loadgen.errors import ScenarioError
from loadgen.scenario.loader import load_scenario, parse_scenario
from loadgen.scenario.matrix import expand_cells, search_lines

SCENARIOS = sorted((Path(__file__).parents[3] / "scenarios").glob("*.yaml"))


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def error_of(tmp_path: Path, text: str, overrides: list[str] | None = None) -> str:
    with pytest.raises(ScenarioError) as exc:
        load_scenario(write(tmp_path, text), overrides)
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def test_unknown_key_names_file_field_and_allowed_keys(tmp_path: Path) -> None:
    msg = error_of(tmp_path, "workload: {num_promts: 5}\n")
    assert msg.startswith(f"{tmp_path / 's.yaml'}: workload.num_promts -> unknown key")
    assert "num_prompts" in msg


def test_wrong_type_and_negative_count(tmp_path: Path) -> None:
    assert "workload.num_prompts -> " in error_of(tmp_path, "workload: {num_prompts: ten}\n")
    msg = error_of(tmp_path, "load: {concurrency: -4}\n")
    assert "load.concurrency -> must be a positive integer or 'unlimited'" in msg
    assert "(got -4)" in msg
    assert "workload.output_tokens" in error_of(tmp_path, "workload: {output_tokens: [8, 0]}\n")


def test_bad_url_yaml_and_missing_files(tmp_path: Path) -> None:
    assert "base_url must start with http://" in error_of(tmp_path, "target: {base_url: localhost:8000}\n")
    assert "not valid YAML at line 2" in error_of(tmp_path, "a: 1\n  b: 2\n")
    assert "workload.prompt.file -> no such file" in error_of(tmp_path, "workload: {prompt: {file: p.jsonl}}\n")
    with pytest.raises(ScenarioError, match=r"cannot read the scenario file \(No such file or directory\)"):
        load_scenario(tmp_path / "absent.yaml")
    # what may never end is not read: a device, a FIFO (it would wait for a writer), as the scenario
    # or as a file it names
    os.mkfifo(tmp_path / "fifo.yaml")
    for endless in (Path("/dev/zero"), tmp_path / "fifo.yaml"):
        with pytest.raises(ScenarioError, match=r"not a plain file \(a FIFO or a device may never end\); give the "
                                                r"scenario file as a file"):
            load_scenario(endless)
    assert "workload.tools.file -> /dev/zero: not a plain file" in error_of(
        tmp_path, "target: {api: chat}\nworkload: {tools: {file: /dev/zero}}\n")
    (tmp_path / "tools.json").write_bytes(b"[" + b" " * (17 << 20) + b"]")
    assert "tools.json: 17.0 MiB, over the 16 MiB a tools file may be" in error_of(
        tmp_path, "target: {api: chat}\nworkload: {tools: {file: tools.json}}\n")
    (tmp_path / "big.yaml").write_bytes(b"#" * (17 << 20))
    with pytest.raises(ScenarioError, match=r"big.yaml: 17.0 MiB, over the 16 MiB a scenario file may be"):
        load_scenario(tmp_path / "big.yaml")


def test_overrides_parse_yaml_values_and_create_sections(tmp_path: Path) -> None:
    sc = load_scenario(write(tmp_path, "name: x\n"), ["load.concurrency=[1, 8]", "slo.ttft_ms=200", "load.rate=2.5"])
    assert sc.load.concurrency == (1, 8)
    assert sc.slo is not None
    assert sc.slo.ttft_ms == 200
    assert sc.load.rate == (2.5,)
    assert "--set 'oops'" in error_of(tmp_path, "name: x\n", ["oops"])
    assert "load.concurency -> unknown key" in error_of(tmp_path, "name: x\n", ["load.concurency=3"])


def test_sweeps_expand_to_the_cartesian_product_in_file_order() -> None:
    sc = parse_scenario({
        "workload": {"input_tokens": [16, 32], "output_tokens": 8},
        "load": {"concurrency": [1, "unlimited"], "rate": [None, 4]},
    })
    cells = expand_cells(sc)
    assert len(cells) == 8
    assert [(c.input_tokens, c.concurrency, c.rate) for c in cells[:4]] == [
        (16, 1, None), (16, 1, 4.0), (16, None, None), (16, None, 4.0),
    ]
    assert cells[2].params()["concurrency"] == "unlimited"
    assert [c.index for c in cells] == list(range(8))


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_every_shipped_scenario_loads(path: Path) -> None:
    sc = load_scenario(path)
    assert expand_cells(sc) or search_lines(sc)


def test_serve_block_names_an_engine(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "serve: {model: qwen2-57b, tp: 2, gpus: [2, 3], extra_args: [--seed, '1']}\n"))
    assert s.serve is not None
    assert (s.serve.backend, s.serve.gpus, s.serve.tp, s.serve.extra_args) == (None, "2,3", 2, ("--seed", "1"))
    assert engine_named(s.serve.backend).name == "vllm"  # a model without a backend: the default engine
    assert load_scenario(write(tmp_path, "serve: {sim: {ttft_ms: 5}}\n")).serve.backend == "sim"  # type: ignore[union-attr]
    assert "serve -> backend transformers needs a model" in error_of(tmp_path, "serve: {backend: transformers}\n")
    assert "serve -> the simulator takes no model" in error_of(tmp_path, "serve: {backend: sim, model: tiny}\n")
    # engine names are the engines' own: checked with the models, before anything is launched
    with pytest.raises(ScenarioError, match="s.yaml: serve.backend 'trt': choose one of vllm"):
        check_models(load_scenario(write(tmp_path, "serve: {backend: trt, model: tiny}\n")), "s.yaml")
    # an engine-specific key on an engine that takes no such option, named as the file writes it
    with pytest.raises(ScenarioError, match=r"s.yaml: serve.slots -> vLLM \(vllm\) has no such option; the "
                                            "engines that take it: llamacpp, exllamav2, mlc"):
        check_models(load_scenario(write(tmp_path, "serve: {backend: vllm, model: tiny, slots: 4}\n")), "s.yaml")
    check_models(load_scenario(write(tmp_path, "serve: {backend: llamacpp, model: tiny, slots: 4}\n")), "s.yaml")
    assert "serve.attn -> " in error_of(tmp_path, "serve: {model: tiny, backend: transformers, attn: fa3}\n")
