"""Every file in scenarios/ loads and expands; the table scenarios expand to the cells of the
reference tables they reproduce (same models, quantizations, input lengths, GPU counts)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from loadgen.load.serving import engine_spec, spec_summary
from loadgen.report.layouts import QUANT_LABELS, model_label
from loadgen.scenario.loader import load_scenario
from loadgen.scenario.matrix import expand_cells, search_lines
from tests.helpers.reference import document, grid_tables, parse_grid, speed_tables

SCENARIOS = Path(__file__).resolve().parents[3] / "scenarios"


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_scenario_loads_and_expands(path: Path) -> None:
    scenario = load_scenario(path)
    cells = expand_cells(scenario)
    assert cells or search_lines(scenario)  # a search's probes come as it goes
    assert [c.index for c in cells] == list(range(len(cells)))


def scenario_rows(name: str) -> set[tuple[str, int, str, str]]:
    rows = set()
    for cell in expand_cells(load_scenario(SCENARIOS / name)):
        assert cell.point is not None
        s = spec_summary(engine_spec(cell.point))
        rows.add((model_label(s), cell.input_tokens, QUANT_LABELS[str(s.quant)], str(s.gpu_count)))
    return rows


def reference_rows(doc: str, engine: str) -> set[tuple[str, int, str, str]]:
    return {
        (r[0], int(r[1]), r[2], r[3])
        for title, _, parsed in speed_tables(doc)
        if title.endswith(f"({engine})")
        for r in parsed.filled_rows(2)
    }


@pytest.mark.parametrize(
    ("scenario", "doc", "engine"),
    [
        ("qwen2-speed-vllm.yaml", "000", "vLLM"),
        ("qwen2-speed-transformers.yaml", "000", "Transformer"),
        ("qwen2.5-speed-vllm.yaml", "001", "vLLM"),
        ("qwen2.5-speed-transformers.yaml", "001", "Transformer"),
    ],
)
def test_speed_scenarios_expand_to_the_reference_cells(scenario: str, doc: str, engine: str) -> None:
    want = reference_rows(doc, engine)
    got = scenario_rows(scenario)
    assert len(want) > 50
    assert got == want, (sorted(got - want)[:5], sorted(want - got)[:5])


@pytest.mark.parametrize("prompts", [100, 1000])
def test_throughput_scenarios_expand_to_the_reference_rows(prompts: int) -> None:
    [text] = [x for _, x in grid_tables(document("000")) if "QPS" in x]
    want = {(r[0], r[1], int(r[2])) for r in parse_grid(text).cells if int(r[2]) == prompts}
    got = set()
    for cell in expand_cells(load_scenario(SCENARIOS / f"throughput-{prompts}.yaml")):
        assert cell.point is not None
        s = spec_summary(engine_spec(cell.point))
        assert (cell.input_tokens, cell.output_tokens, cell.concurrency, cell.rate) == (1000, 100, None, None)
        assert s.tp == 2
        got.add((model_label(s), QUANT_LABELS[str(s.quant)], cell.point.workload.num_prompts))
    assert got == want


def test_quant_compare_measures_the_documents_checkpoints() -> None:
    text = document("003")
    want = set(re.findall(r"Namespace\(.*?model='([^']+)'.*?quantization=(None|'\w+')", text))
    got = set()
    for cell in expand_cells(load_scenario(SCENARIOS / "quant-compare.yaml")):
        assert cell.point is not None
        assert cell.point.serve is not None
        assert (cell.input_tokens, cell.output_tokens, cell.point.workload.num_prompts) == (100, 250, 1000)
        args = cell.point.serve.extra_args
        quant = f"'{args[args.index('--quantization') + 1]}'" if "--quantization" in args else "None"
        got.add((cell.point.serve.model, quant))
    assert len(want) == 7
    assert got == want


def test_engine_compare_covers_the_documents_engines_and_baseline() -> None:
    cells = expand_cells(load_scenario(SCENARIOS / "engine-compare.yaml"))
    configs = [(c.point.serve.backend, c.point.serve.quant, c.point.serve.tp) for c in cells if c.point and c.point.serve]
    assert configs[0] == ("transformers", "fp32", None)  # the baseline row comes first
    text = document("004")
    for software, engine in (("HF Transformers", "transformers"), ("vLLM", "vllm"), ("llama.cpp", "llamacpp")):
        assert f"| {software}" in text
        assert any(e == engine for e, _, _ in configs)
    assert {tp for e, _, tp in configs if e == "vllm"} == {1, 2}
