"""Datasets: ShareGPT with vLLM's sampling rules, JSONL rows, length distributions, traces."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import numpy as np
import pytest

from loadgen.errors import ScenarioError
from loadgen.scenario.shapes import Dataset, Lengths
from loadgen.workload import datasets
from loadgen.workload.lengths import draw, read_histogram
from loadgen.workload.trace import read_trace


def words(n: int, tag: str = "w") -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


def write_sharegpt(path: Path, entries: list[object]) -> Path:
    path.write_text(json.dumps(entries))
    return path


def test_sharegpt_follows_vllms_order_filters_and_lengths(tmp_path: Path) -> None:
    entries: list[object] = [
        {"id": "a", "conversations": [{"from": "human", "value": words(10, "a")}, {"from": "gpt", "value": words(20)}]},
        {"id": "short", "conversations": [{"from": "human", "value": "hi"}]},  # one turn: dropped, counted
        {"id": "tiny", "conversations": [{"from": "human", "value": "x y"}, {"from": "gpt", "value": words(9)}]},
        {"id": "long", "conversations": [{"from": "human", "value": words(1100)}, {"from": "gpt", "value": "a b c d"}]},
        {"id": "b", "conversations": [{"from": "human", "value": words(30, "b")}, {"from": "gpt", "value": words(5)}]},
        {"id": "c", "conversations": [{"from": "human", "value": words(7, "c")}, {"from": "gpt", "value": words(3)}]},
        {"id": "empty", "conversations": []},
    ]
    path = write_sharegpt(tmp_path / "sg.json", entries)
    loaded = datasets.sharegpt(Dataset(kind="sharegpt", path=path), 2, seed=3, counter=datasets.word_count)
    # vLLM: drop < 2 turns, shuffle with random.seed(seed), take pairs in order passing the filters
    pairs = [e for e in entries if isinstance(e, dict) and len(e["conversations"]) >= 2]
    random.Random(3).shuffle(pairs)
    expected = []
    for e in pairs:
        p, a = (len(e["conversations"][i]["value"].split()) for i in (0, 1))
        if p >= 4 and a >= 4 and p <= 1024 and p + a <= 2048:
            expected.append((e["conversations"][0]["value"], a))
    assert [(s.prompt.text, s.output_tokens) for s in loaded.samples] == expected[:2]
    assert any("2 conversations with fewer than two turns" in n for n in loaded.notes)


def test_sharegpt_fixed_output_length_skips_the_answer_filter_and_tops_up(tmp_path: Path) -> None:
    entries = [{"id": "a", "conversations": [{"from": "human", "value": words(8)}, {"from": "gpt", "value": "ok"}]}]
    path = write_sharegpt(tmp_path / "sg.json", entries)
    loaded = datasets.sharegpt(
        Dataset(kind="sharegpt", path=path, output_tokens=50, shuffle=False), 3, seed=0, counter=datasets.word_count,
    )
    assert [s.output_tokens for s in loaded.samples] == [50, 50, 50]
    assert any("drawn again" in n for n in loaded.notes)


@pytest.mark.parametrize(("content", "message"), [
    ('[{"id": "a", "conversations": [', "not valid JSON"),
    ('{"id": "a"}', "a JSON list"),
    ('[{"id": "x7"}]', "record 0 (id x7): has no 'conversations'"),
    ('[{"id": 1, "conversations": [{"from": "human"}, {"from": "gpt", "value": "a"}]}]', "string 'value'"),
])
def test_malformed_sharegpt_is_one_line_naming_the_record(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ScenarioError, match=re.escape(message)) as info:
        datasets.sharegpt(Dataset(kind="sharegpt", path=path), 5, 0, datasets.word_count)
    assert "\n" not in str(info.value)
    assert str(path) in str(info.value)


def test_skip_invalid_counts_what_it_skipped(tmp_path: Path) -> None:
    good = {"id": "g", "conversations": [{"from": "human", "value": words(6)}, {"from": "gpt", "value": words(6)}]}
    path = write_sharegpt(tmp_path / "sg.json", [{"id": "x"}, 5, good])
    loaded = datasets.sharegpt(Dataset(kind="sharegpt", path=path, skip_invalid=True), 1, 0, datasets.word_count)
    assert len(loaded.samples) == 1
    assert "2 malformed records skipped" in loaded.notes


def test_jsonl_rows_carry_their_own_output_length(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    rows = [{"prompt": "a b c", "output_tokens": 7}, {"messages": [{"role": "user", "content": "hi"}]},
            {"prompt_token_ids": [5, 6, 7, 8]}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    loaded = datasets.jsonl(Dataset(kind="jsonl", path=path), 10, 0)
    assert [s.output_tokens for s in loaded.samples] == [7, None, None]
    assert loaded.samples[2].prompt.input_tokens == 4
    path.write_text('{"prompt": "a", "output_tokens": 0}\n')
    with pytest.raises(ScenarioError, match=r"p.jsonl: line 1: output_tokens must be a positive integer"):
        datasets.jsonl(Dataset(kind="jsonl", path=path), 10, 0)


def test_uniform_lengths_stay_in_vllms_range_and_repeat_with_the_seed() -> None:
    dist = Lengths(kind="uniform", range_ratio=0.25)
    draws = [draw(dist, 100, np.random.default_rng((9, i))) for i in range(2000)]
    assert min(draws) == math.floor(100 * 0.75)
    assert max(draws) == math.ceil(100 * 1.25)
    assert draws == [draw(dist, 100, np.random.default_rng((9, i))) for i in range(2000)]


def test_normal_and_lognormal_lengths_are_clipped_and_centred() -> None:
    normal = Lengths(kind="normal", stdev=50, min=60, max=140)
    n = [draw(normal, 100, np.random.default_rng(i)) for i in range(4000)]
    assert min(n) >= 60
    assert max(n) <= 140
    assert abs(np.mean(n) - 100) < 3
    lognormal = Lengths(kind="lognormal", sigma=0.5)
    m = [draw(lognormal, 200, np.random.default_rng(i)) for i in range(4000)]
    assert abs(np.median(m) - 200) < 12  # the median of a lognormal around n is n


def test_histogram_lengths_follow_the_file(tmp_path: Path) -> None:
    path = tmp_path / "h.csv"
    path.write_text("length,weight\n10,1\n20,3\n")
    dist = Lengths(kind="histogram", file=path)
    d = [draw(dist, 999, np.random.default_rng(i)) for i in range(4000)]
    assert set(d) == {10, 20}
    assert abs(d.count(20) / len(d) - 0.75) < 0.03
    path.write_text("10,1\n20,x\n")
    read_histogram.cache_clear()
    with pytest.raises(ScenarioError, match=r"h.csv:2: expected 'length,weight'"):
        read_histogram(path)


def test_trace_rows_are_offsets_from_the_first_scaled_by_the_speedup(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n'
        '{"timestamp": 3000, "input_length": 100, "output_length": 6}\n'
    )
    rows = read_trace(path, speedup=2.0)
    assert [r.offset_s for r in rows] == [0.0, 1.0]
    assert rows[0].hash_ids == (1, 2)
    path.write_text('{"timestamp": 1, "input_length": 0, "output_length": 5}\n')
    with pytest.raises(ScenarioError, match=r"t.jsonl:1: input_length must be an integer from 1 to 10,000,000 \(got 0\)"):
        read_trace(path)
