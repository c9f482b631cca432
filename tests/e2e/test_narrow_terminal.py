"""A user's terminal at 80 and 120 columns: no figure cut, folded or ellipsised, no line wider
than the terminal, every alias and install command whole."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest

from loadgen.engines.catalogue import load_catalogue
from loadgen.engines.listing import engines
from tests.conftest import StartSim
from tests.helpers.terminal import in_terminal


def _lines_fit(text: str, columns: int) -> None:
    assert "…" not in text
    wide = [line for line in text.splitlines() if len(line) > columns]
    assert not wide, wide[:3]


@pytest.mark.parametrize("columns", [80, 120])
def test_a_sweep_prints_every_figure_whole(start_sim: StartSim, tmp_path: Path, columns: int) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=2)
    path = tmp_path / "sweep.yaml"
    path.write_text("name: sweep\nworkload: {num_prompts: 24, input_tokens: [16, 2048], output_tokens: 16}\n"
                    "load: {concurrency: [1, 4, 32], warmup_requests: 0}\nslo: {ttft_ms: 200}\n")
    code, ran = in_terminal(["run", str(path), "--base-url", base_url, "--out", str(tmp_path / "run")], columns)
    assert code == 0, ran
    code, report = in_terminal(["report", str(tmp_path / "run")], columns)
    assert code == 0, report
    # the live bar, repainted in place, drops what does not fit and cuts nothing
    assert "…" not in ran
    # (at 80 columns without the words "p50/p99")
    assert re.search(r"\d+/24 +[\d,]+ tok/s TTFT (p50/p99 )?[\d.,]+/[\d.,]+ ms errors 0", ran), ran[-2000:]
    for text in (ran[ran.index("[1] input"):], report):
        _lines_fit(text, columns)
    cells = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())["cells"]
    tokens = set(re.findall(r"[\d,]+\.\d+|[\d,]+", report))
    for cell in cells:
        m = cell["metrics"]
        # the sweep's figures, each whole on one line (a folded one would be two tokens)
        for figure in (f"{m['output_throughput']:,.1f}", f"{m['total_token_throughput']:,.1f}",
                       f"{m['request_throughput']:,.3f}", f"{m['e2e_s']['p99'] * 1e3:.2f}"):
            assert figure in tokens, (figure, report[-3000:])


@pytest.mark.slow
def test_200000_prompts_at_80_columns_say_they_are_being_made_and_keep_their_count(
        start_sim: StartSim, tmp_path: Path) -> None:
    """The big input: making 200,000 requests takes seconds before the first is sent; the terminal
    says so as it goes, and then the bar keeps its whole count; Ctrl-C keeps what was measured."""
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    out = tmp_path / "run"
    code, ran = in_terminal(["run", "--base-url", base_url, "--num-prompts", "200000", "--concurrency", "64",
                             "--out", str(out)], 80, timeout=300,
                            interrupt_on=re.compile(r"c=64 +[1-9]\d{3,}/200000 "))
    assert code == 130, ran[-2000:]
    made = [int(n) for n in re.findall(r"cell 1/1: making requests +(\d+)/200000", ran)]
    assert made, ran[:2000]
    assert made == sorted(made)
    assert made[-1] < 200_000
    assert re.search(r"cell 1/1 c=64 +\d+/200000 +[\d,]+ tok/s TTFT [\d.,]+/[\d.,]+ ms errors 0", ran), ran[-2000:]
    _lines_fit(ran[ran.index("[1] input"):], 80)
    assert "…" not in ran
    assert "interrupted" in ran
    records = (out / "records.jsonl").read_bytes().splitlines()
    assert len(records) >= 1000


@pytest.mark.parametrize("columns", [80, 120])
def test_models_and_engines_show_what_users_type_whole(columns: int) -> None:
    code, text = in_terminal(["models"], columns)
    assert code == 0, text
    _lines_fit(text, columns)
    words = set(text.split())
    for alias, entry in load_catalogue().items():
        assert alias in words, alias
        assert entry.hub in words, entry.hub
    code, text = in_terminal(["engines"], columns)
    assert code == 0, text
    _lines_fit(text, columns)
    flat = " ".join(text.split())
    for e in engines():
        assert " ".join(e.install.split()) in flat, e.install
