"""Token times from the kernel: a client kept busy cannot move them.

The simulator sends each request's role delta at once, its first token 50 ms later and the
second 10 ms after that. The client busy-waits 30 ms after every read (the test hook that
starves it), so the second token, which arrives while it is busy, is handled 20 ms late: the
kernel's receive stamp still gives ITL 10 ms, the loop's clock 30 ms; the 20 ms is the
client's delay, measured per read and reported."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.load import sse
from loadgen.load.connection import STARVE_ENV
from loadgen.results.records import RequestRecord, read_records
from tests.conftest import StartSim
from tests.helpers.simtruth import sim_metrics

pytestmark = pytest.mark.timing


def run(base_url: str, tmp_path: Path, clock: str, name: str) -> tuple[list[RequestRecord], dict, dict, str]:
    out = tmp_path / name
    result = CliRunner().invoke(app, [
        "run", "--base-url", base_url, "--num-prompts", "4", "--input-len", "8", "--output-len", "2",
        "--set", f"load.clock={clock}", "--set", "load.warmup_requests=0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = [r for r in read_records(out / "records.jsonl") if not r.warmup]
    (cell,) = orjson.loads((out / "summary.json").read_bytes())["cells"]
    provenance = orjson.loads((out / "provenance.json").read_bytes())
    return records, cell, provenance, " ".join(result.output.split())


def itl_ms(r: RequestRecord) -> float:
    assert r.chunk_offsets_s
    assert len(r.chunk_offsets_s) == 2
    return (r.chunk_offsets_s[1] - r.chunk_offsets_s[0]) * 1e3


@pytest.mark.alone
def test_a_busy_client_keeps_the_true_itl_with_kernel_stamps_and_not_without(
    start_sim: StartSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    base_url = start_sim(ttft_ms=50, itl_ms=10)
    monkeypatch.setenv(STARVE_ENV, "30")
    stamped, cell, provenance, output = run(base_url, tmp_path, "kernel", "kernel")
    # the simulator's own lateness on a busy machine moves the truth itself: allowed for
    late_ms = sim_metrics(base_url)["loadgen_sim_chunk_lateness_seconds_max"] * 1e3
    assert provenance["client_clock"] == {"clock": "kernel", "why_not_kernel": None}
    assert provenance["chunk_reader"] == sse.CHUNK_READER  # (compiled where a compiler built it)
    for r in stamped:
        assert itl_ms(r) == pytest.approx(10, abs=1 + late_ms)  # when the second token's bytes arrived
        assert r.ttft_s == pytest.approx(0.050, abs=0.003 + late_ms / 1e3)
        assert r.client_delay_s is not None
        # handled 30 ms after the first token's read, 20 after it came; more where that read was
        # itself late (the client woken 5 ms late once in the alone phase of the whole suite),
        # never more than the 30 ms hold after it
        assert 17 - late_ms < r.client_delay_s * 1e3 < 33 + late_ms
    client = cell["client"]
    assert client["clock"] == "kernel"
    # every read is handled within the 30 ms the client is held after the read before it (the
    # end of a body, sent after its last token, comes in a read of its own on a busy machine)
    assert 17 - late_ms < client["client_delay_ms"]["max"] < 33 + late_ms
    loop, cell_loop, provenance_loop, _ = run(base_url, tmp_path, "loop", "loop")
    assert provenance_loop["client_clock"] == {"clock": "loop", "why_not_kernel": "load.clock: loop"}
    for r in loop:
        assert itl_ms(r) == pytest.approx(30, abs=3)  # when the busy client got to it
        assert r.client_delay_s is None
    assert cell_loop["client"]["clock"] == "loop"
    assert cell_loop["client"]["client_delay_ms"] is None


@pytest.mark.alone
def test_an_idle_client_says_its_reads_were_handled_at_once(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=2)
    records, cell, _, output = run(base_url, tmp_path, "auto", "auto")  # the default: the kernel's, on Linux
    assert cell["client"]["clock"] == "kernel"
    assert all(r.client_delay_s is not None for r in records)
    assert cell["client"]["client_delay_ms"]["p50"] < 5  # (an idle client handles a read at once)
    assert "self-check ok: the client kept up" in output
    assert "reads kernel-timed, handled p99" in output


def test_kernel_stamps_are_refused_where_the_kernel_cannot_stamp_the_bytes(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, [
        "run", "--base-url", "https://127.0.0.1:9/v1", "--set", "load.clock=kernel", "--out", str(tmp_path / "r")])
    assert result.exit_code == 2, result.output
    assert "load.clock kernel: the target is https" in " ".join(result.output.split())


def test_reads_that_carried_several_tokens_are_counted_and_said(
    start_sim: StartSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Tokens 5 ms apart to a client busy 30 ms after each read: several arrive while it is busy
    and TCP hands them over in one read, which the records and the self-check count."""
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    monkeypatch.setenv(STARVE_ENV, "30")
    out = tmp_path / "merged"
    result = CliRunner().invoke(app, [
        "run", "--base-url", base_url, "--num-prompts", "2", "--input-len", "8", "--output-len", "12",
        "--set", "load.warmup_requests=0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    records = [r for r in read_records(out / "records.jsonl") if not r.warmup]
    for r in records:
        assert r.coalesced_reads >= 1
        assert len(r.chunk_offsets_s) == 12
        # tokens of one read share its time: zero gaps
        assert sum(b == a for a, b in zip(r.chunk_offsets_s, r.chunk_offsets_s[1:], strict=False)) >= 1
    (cell,) = orjson.loads((out / "summary.json").read_bytes())["cells"]
    assert cell["client"]["coalesced_reads"] == sum(r.coalesced_reads for r in records)
    assert "of reads carried several tokens" in " ".join(result.output.split())
