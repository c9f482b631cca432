"""Capacity searches against the simulator, whose capacity is the known answer.

With ``max_seqs`` 24, ITL 10 ms and +0.5 ms per other request served, a closed loop of C
streams at ITL 10 + 0.5 (C - 1) ms: TPOT 20.0 ms at 21, 20.5 at 22. With TPOT p99 <= 20.25 ms
the answer is 21 and TPOT binds. With ``max_seqs`` 8 and no per-stream cost, a ninth stream
waits a whole request (50 + 15 x 10 = 200 ms) for a slot: TTFT binds at 9. Open loop, 4 slots
each busy 50 + 19 x 10 = 240 ms serve at most 4 / 0.24 = 16.7 requests/s.

Answers of 16 tokens: TPOT is a per-token figure, so longer answers would only lengthen each
probe (the low-concurrency probes of a search from 1 are most of its time).
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen.load.run import execute
from loadgen.report.capacity import write_capacity_plots
from loadgen.results.records import read_records
from loadgen.results.rundir import rebuild_summary
from loadgen.scenario.loader import parse_scenario
from tests.conftest import CpuHog, StartSim

pytestmark = [pytest.mark.slow, pytest.mark.timing]


def search_scenario(base_url: str, search: dict[str, Any], *, prompts: int, output: int,
                    **load: Any) -> dict[str, Any]:
    return {
        "name": "capacity",
        "target": {"base_url": base_url},
        "workload": {"num_prompts": prompts, "input_tokens": 32, "output_tokens": output},
        "load": {"warmup_requests": 1, "search": search, **load},
    }


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # the IHDR chunk comes first
    return width, height


@pytest.mark.parametrize(("hog", "lowest", "step_ms"), [(None, 1, 0.5), ("server", 16, 1.0)],
                         ids=["quiet", "cpu-hog-on-the-server-core"])
def test_tpot_binds_at_22_and_the_answer_is_21(start_sim: StartSim, cpu_hog: CpuHog, tmp_path: Path,
                                               hog: str | None, lowest: int, step_ms: float) -> None:
    """From 1 on a quiet machine; from 16 with a busy program on the server's core (the probes
    below 16 are far from the boundary, and the busy core is what is checked). Each stream beside
    C - 1 others adds ``step_ms`` to TPOT, and the SLO lies half a step above 21's: a busy core put
    21's TPOT p99 0.2 to 0.3 ms above its truth, so there the steps are 1 ms."""
    if hog is not None:
        cpu_hog(hog)
    base_url = start_sim(max_seqs=24, itl_per_seq_us=step_ms * 1000)

    def truth(streams: int) -> float:  # the simulator's TPOT (ms) with every stream beside streams - 1 others
        return 10 + step_ms * (streams - 1)

    slo_ms = truth(21) + step_ms / 2
    slo = {"ttft_ms": {"p99": 300}, "tpot_ms": {"p99": slo_ms}}
    sc = parse_scenario(search_scenario(base_url, {"by": "concurrency", "min": lowest, "max": 256, "slo": slo},
                                        prompts=42, output=16))
    result = execute(sc, tmp_path / "run")
    cap = result.summary.to_dict()["capacity"]

    assert cap["max_meeting_slo"] == 21
    assert cap["binds_at"] == 22
    assert cap["limiting_slo"] == ["tpot_ms.p99"]
    assert cap["complete"] is True
    probes = {p["value"]: p for p in cap["probes"]}
    assert [p["value"] for p in cap["probes"]] == [v for v in [1, 2, 4, 8, 16, 32, 24, 20, 22, 21] if v >= lowest]
    assert len(cap["probes"]) <= 12
    # the simulator's truth, within 0.15 ms and half the simulator's own mean lateness on this
    # machine at the time (a busy server core makes its chunks late, and a p99 of TPOT sees the
    # latest of them)
    sim = dict(line.split() for line in httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False)
               .text.splitlines() if line and line[0] != "#")
    late_ms = float(sim["loadgen_sim_chunk_lateness_seconds_sum"]) / float(sim["loadgen_sim_chunk_lateness_seconds_count"]) * 1e3
    tol = 0.15 + 0.5 * late_ms
    assert truth(21) <= probes[21]["figures"]["tpot_ms.p99"] <= slo_ms
    assert truth(22) - 0.2 <= probes[22]["figures"]["tpot_ms.p99"] <= truth(22) + 0.1 + tol
    assert probes[16]["figures"]["tpot_ms.p99"] == pytest.approx(truth(16), abs=tol)
    if lowest == 1:
        assert probes[1]["figures"]["tpot_ms.p99"] == pytest.approx(10.0, abs=tol)
    assert all(p["figures"]["ttft_ms.p99"] < 300 for v, p in probes.items() if v <= 24)
    binding = probes[22]["figures"]["tpot_ms.p99"]
    assert cap["answer"].startswith(f"max concurrency meeting the SLOs: 21; TPOT p99 binds at 22 ({binding:.2f} ms > "
                                    f"{slo_ms:g} ms)")
    # a closed loop of 21 streams each 50 + 15 x TPOT(21) ms long
    assert cap["request_throughput"] == pytest.approx(21 / (0.050 + 15 * truth(21) / 1e3), rel=0.05)
    # every probe is a cell of its own with fresh prompts, numbered in the order it ran
    cells = result.summary.cells
    assert [c.cell for c in cells] == list(range(len(probes)))
    assert [c.params["concurrency"] for c in cells] == [p["value"] for p in cap["probes"]]

    # re-derived from the run directory alone
    again = rebuild_summary(tmp_path / "run").to_dict()["capacity"]
    assert again == cap

    # the plot: one panel per objective and one of throughput, at 4.2 x 3.8 inches and 110 dpi each
    (plot,) = write_capacity_plots(result.summary, tmp_path / "run")
    panels = len(cap["probes"][0]["figures"]) + 1
    assert panels == 3
    assert png_size(plot) == (round(4.2 * panels * 110), round(3.8 * 110))


# alone: a busy client sends a stream's next request late, the server runs fewer streams than
# the probe's, and their ITL drops (a probe of 17 read 36.30 ms, 1.6% under its truth, beside
# Locust's processes in CI): the margins cover the jitter's spread, not a starved client's
@pytest.mark.alone
def test_ten_searches_on_a_jittered_server_agree_within_a_step_and_their_margins_cover_the_spread(
        start_sim: StartSim, tmp_path: Path) -> None:
    """Each request's ITL is (20 + 1.0 (C - 1)) x f ms, f drawn from N(1, 0.02): TPOT p90 is
    that x 1.026, 35.9 ms at 16 streams and 36.9 at 17. Against TPOT p90 <= 36.4 ms the truth
    is 16, half a millisecond from either side; each search's probes draw their own requests'
    speeds."""
    base_url = start_sim(ttft_ms=20.0, itl_ms=20.0, max_seqs=24, itl_per_seq_us=1000, jitter=0.02, jitter_seed=7)
    slo = {"tpot_ms": {"p90": 36.4}}
    answers, ranges = [], []
    for i in range(10):
        # probes 14, 18, 16, 17: the boundary bracketed in four
        sc = parse_scenario(search_scenario(base_url, {"by": "concurrency", "min": 14, "max": 18, "slo": slo},
                                            prompts=64, output=16))
        cap = execute(sc, tmp_path / f"run{i}").summary.to_dict()["capacity"]
        assert cap["complete"] is True
        assert cap["margin"].startswith("margin: ")
        answers.append(cap["max_meeting_slo"])
        ranges.append(tuple(cap["likely"]))
        print(f"search {i + 1}: {cap['max_meeting_slo']:g}, likely {cap['likely']}; {cap['margin']}")
    assert max(answers) - min(answers) <= 1, answers
    assert set(answers) <= {15, 16, 17}, answers  # within a step of the truth
    # every search's stated range holds every answer the ten gave
    for low, high in ranges:
        assert low <= min(answers), (ranges, answers)
        assert high >= max(answers), (ranges, answers)


def test_rate_search_finds_the_analytic_capacity(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(max_seqs=4)
    sc = parse_scenario(search_scenario(
        base_url, {"by": "rate", "min": 8, "max": 64, "slo": {"ttft_ms": {"p99": 150}}}, prompts=80, output=20,
        arrival="constant",
    ))
    result = execute(sc, tmp_path / "run")
    cap = result.summary.to_dict()["capacity"]
    analytic = 4 / (0.050 + 19 * 0.010)
    assert cap["max_meeting_slo"] == pytest.approx(analytic, rel=0.10)
    assert cap["binds_at"] / cap["max_meeting_slo"] <= 1.05
    assert cap["limiting_slo"] in (["ttft_ms.p99"], ["queue"])
    # the probe stopped over capacity left nothing behind: the server is idle once the run ends
    metrics = httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False).text
    assert "loadgen_sim_requests_waiting 0.0" in metrics
    assert "loadgen_sim_requests_running 0.0" in metrics


RESUMABLE = """
name: resumable
serve: {{backend: sim, sim: {{max_seqs: 8}}}}
workload: {{num_prompts: 40, input_tokens: 32, output_tokens: 16}}
load:
  search: {{by: concurrency, max: 64, slo: {{ttft_ms: {{p99: 150}}, tpot_ms: {{p99: 50}}}}}}
"""


def finished_probes(run_dir: Path) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in (run_dir / "cells.jsonl").read_text().splitlines()]
    return [x for x in lines if x["status"] == "done"]


def test_an_interrupted_search_resumes_from_its_finished_probes(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(RESUMABLE.format())
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "loadgen", "run", str(path), "--out", str(run_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                            env={**os.environ, "COLUMNS": "150"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(finished_probes(run_dir) if (run_dir / "cells.jsonl").exists()
                                              else []) < 3:
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()[-2000:]
    before = finished_probes(run_dir)
    assert 3 <= len(before) < 8
    kept = {x["cell"] for x in before}
    records_before = [r for r in read_records(run_dir / "records.jsonl") if r.cell in kept]

    done = subprocess.run([*cmd[:5], "--resume", str(run_dir)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    cap = json.loads((run_dir / "summary.json").read_text())["capacity"]
    # 1, 2, 4, 8 meet; 16 breaks TTFT (a ninth stream waits 200 ms for a slot); 12, 10, 9 too
    assert [p["value"] for p in cap["probes"]] == [1, 2, 4, 8, 16, 12, 10, 9]
    assert cap["max_meeting_slo"] == 8
    assert cap["binds_at"] == 9
    assert cap["limiting_slo"] == ["ttft_ms.p99"]
    probes = {p["value"]: p for p in cap["probes"]}
    # the queued stream waits for a slot: 200 ms, plus its own 50 ms to the first token
    assert probes[9]["figures"]["ttft_ms.p99"] == pytest.approx(250, abs=15)
    assert probes[8]["figures"]["ttft_ms.p99"] < 60
    # the probes finished before the stop were not measured again: same cells, same records
    assert [p["cell"] for p in cap["probes"]][:len(before)] == [x["cell"] for x in before]
    after = [r for r in read_records(run_dir / "records.jsonl") if r.cell in kept]
    assert after == records_before
    assert "max concurrency meeting the SLOs: 8; TTFT p99 binds at 9" in done.stdout


def test_a_search_per_matrix_point_gives_the_comparison_in_slo_terms(tmp_path: Path) -> None:
    from loadgen.report.capacity import capacity_table
    from loadgen.report.tables import render

    sc = parse_scenario({
        "name": "per-point",
        "serve": {"backend": "sim"},
        "matrix": {"serve.sim.max_seqs": [4, 8]},
        "workload": {"num_prompts": 32, "input_tokens": 32, "output_tokens": 16},
        "load": {"search": {"by": "concurrency", "min": 2, "max": 32, "slo": {"ttft_ms": {"p99": 150}}}},
    })
    summary = execute(sc, tmp_path / "run").summary
    caps = summary.to_dict()["capacity"]
    assert [c["labels"]["serve.sim.max_seqs"] for c in caps] == [4, 8]
    # each engine's slots are its capacity: one stream more waits 50 + 15 x 10 = 200 ms for a slot
    assert [(c["max_meeting_slo"], c["binds_at"]) for c in caps] == [(4, 5), (8, 9)]
    csv_rows = render(capacity_table(summary), "csv").splitlines()
    assert csv_rows[0].split(",")[3:7] == ["serve.sim.max_seqs", "Input Length", "Output Length",
                                           "Max Concurrency at SLO"]
    assert [r.split(",")[3] + ":" + r.split(",")[6] for r in csv_rows[1:]] == ["4:4", "8:8"]
    assert [r.split(",")[-1] for r in csv_rows[1:]] == ["TTFT p99 at 5", "TTFT p99 at 9"]
