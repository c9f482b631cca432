"""Which code reads each token's chunk: compiled where pip built it, Python where it did not (or
where LOADGEN_CHUNK_READER=python sets it aside); either way the run measures the same tokens,
and its provenance says which one ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

from loadgen.load import sse
from loadgen.results.records import read_records
from tests.conftest import StartSim


def run(base_url: str, out: Path, reader: str | None) -> tuple[dict, list[tuple]]:
    env = {k: v for k, v in os.environ.items() if k != sse.CHUNK_READER_ENV}
    if reader is not None:
        env[sse.CHUNK_READER_ENV] = reader
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", "--base-url", base_url, "--num-prompts", "6", "--input-len", "16",
         "--output-len", "12", "--concurrency", "3", "--out", str(out)],
        capture_output=True, text=True, timeout=300, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    provenance = orjson.loads((out / "provenance.json").read_bytes())
    counts = sorted((r.request_id, r.error, r.output_tokens, r.token_count_source, r.chunk_tokens)
                    for r in read_records(out / "records.jsonl") if not r.warmup and r.request_id >= 0)
    return provenance, counts


def test_the_python_reading_set_by_the_environment_measures_what_the_default_does(
    start_sim: StartSim, tmp_path: Path,
) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    default, counts = run(base_url, tmp_path / "default", None)
    assert default["chunk_reader"] == sse.CHUNK_READER  # compiled where built (as in CI), else python
    python, python_counts = run(base_url, tmp_path / "python", "python")
    assert python["chunk_reader"] == "python"
    assert python_counts == counts
    # every request complete, its 12 tokens counted from the server's usage, a chunk each
    assert len(counts) == 6
    assert {c[1:] for c in counts} == {(None, 12, "usage", (1,) * 12)}


def test_at_64_streams_every_token_is_read_once_in_order(start_sim: StartSim, tmp_path: Path) -> None:
    """64 streams of 64 tokens, 10 ms apart: whichever reading runs (the compiled one as built,
    under the sanitizers, or Python's), every answer is whole, each token counted once, its
    chunks' times in order. (How close their times come to the server's is the accuracy
    check's, in the fast tier.)"""
    base_url = start_sim(ttft_ms=50, itl_ms=10)
    proc = subprocess.run(
        [sys.executable, "-m", "loadgen", "run", "--base-url", base_url, "--num-prompts", "128", "--input-len", "16",
         "--output-len", "64", "--concurrency", "64", "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if not r.warmup and r.request_id >= 0]
    assert len(records) == 128
    for r in records:
        assert (r.error, r.output_tokens, sum(r.chunk_tokens)) == (None, 64, 64), r
        assert len(r.chunk_offsets_s) == len(r.chunk_tokens)
        assert list(r.chunk_offsets_s) == sorted(r.chunk_offsets_s), r.chunk_offsets_s
