"""Matrix expansion: axes, blocks, exclude, overrides, list values under serve:, kind defaults, errors."""

from __future__ import annotations

import pytest

from loadgen.errors import ScenarioError
from loadgen.load.serving import group_cells
from loadgen.scenario.loader import parse_scenario
from loadgen.scenario.matrix import expand_cells


def test_axes_expand_in_file_order_with_exclude_and_overrides() -> None:
    sc = parse_scenario({
        "serve": {"backend": "vllm", "model": "qwen2-7b"},
        "matrix": {
            "quant": ["bf16", "awq"], "input_tokens": [1, 6144],
            "exclude": [{"quant": "awq", "input_tokens": 1}],
            "overrides": [{"when": {"input_tokens": 6144}, "set": {"tp": 2, "note": "long"}}],
        },
    })
    cells = expand_cells(sc)
    got = [(c.point.serve.quant, c.input_tokens, c.point.serve.tp, c.point.note) for c in cells]
    assert got == [("bf16", 1, None, ""), ("bf16", 6144, 2, "long"), ("awq", 6144, 2, "long")]
    assert cells[1].params()["quant"] == "bf16"


def test_blocks_concatenate_and_lists_under_serve_are_axes() -> None:
    sc = parse_scenario({
        "serve": {"backend": ["vllm", "transformers"], "model": "tiny"},
        "workload": {"input_tokens": [16, 32]},
        "matrix": [{"note": "a"}, {"note": ["b", "c"]}],
    })
    cells = expand_cells(sc)
    assert [(c.point.serve.backend, c.point.note, c.input_tokens) for c in cells][:4] == [
        ("vllm", "a", 16), ("vllm", "a", 32), ("transformers", "a", 16), ("transformers", "a", 32),
    ]  # each block varies the serve: lists too
    assert len(cells) == 2 * 3 * 2


def test_cells_sharing_an_engine_are_grouped_once_each() -> None:
    sc = parse_scenario({
        "serve": {"model": "qwen2-7b"},
        "matrix": {"input_tokens": [1, 2], "quant": ["bf16", "awq"]},
    })
    groups = group_cells(expand_cells(sc), launched=True)
    assert [[c.index for c in g] for g in groups] == [[0, 2], [1, 3]]
    assert group_cells(expand_cells(sc), launched=False) == [expand_cells(sc)]


def test_single_stream_defaults_and_batch_one_rule() -> None:
    sc = parse_scenario({"kind": "single-stream", "target": {"base_url": "http://x/v1"}})
    assert (sc.workload.num_prompts, sc.workload.output_tokens, sc.load.concurrency) == (3, (2048,), (1,))
    with pytest.raises(ScenarioError, match="batch 1"):
        parse_scenario({"kind": "single-stream", "load": {"concurrency": 4}}, "s.yaml")
    throughput = parse_scenario({"kind": "throughput"})
    assert throughput.load.concurrency == (None,)  # unlimited, normalised once when read
    assert throughput.model_dump(mode="json")["load"]["concurrency"] == "unlimited"  # and written so
    assert parse_scenario({"load": {"concurrency": [4, "unlimited"]}}).load.concurrency == (4, None)


def test_a_bad_point_names_the_point_and_field() -> None:
    sc = parse_scenario({"serve": {"model": "qwen2-7b"}, "matrix": {"tp": [1, 0]}}, "m.yaml")
    with pytest.raises(ScenarioError, match=r"m.yaml \(matrix point tp=0\): serve.tp -> "):
        expand_cells(sc, "m.yaml")


def test_unknown_axis_and_rule_key_are_rejected() -> None:
    with pytest.raises(ScenarioError, match="matrix.colour: unknown axis"):
        parse_scenario({"matrix": {"colour": [1]}}, "m.yaml")
    with pytest.raises(ScenarioError, match="'model' in exclude/overrides is not an axis"):
        parse_scenario({"matrix": {"quant": ["bf16"], "exclude": [{"model": "x"}]}}, "m.yaml")
