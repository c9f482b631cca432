"""The fault matrix: each fault ``loadgen sim`` injects, against loadgen's client. Every request
sent has its record (one sent again after a reset keeps one), each failure is in its class and
counted as the simulator counted the faults it injected, tokens received before a cut are kept,
and the run completes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen.load.run import execute
from loadgen.results.records import read_records
from loadgen.scenario.loader import parse_scenario
from tests.conftest import StartSim

PROMPTS, OUTPUT, HALF = 40, 16, 8
RATE = 0.3


def sim_counters(base_url: str) -> dict[str, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out


def run(base_url: str, tmp_path: Path, **target: Any) -> dict[str, Any]:
    sc = parse_scenario({
        "name": "faults",
        "target": {"base_url": base_url, "timeouts": {"between_tokens_s": 0.5}, **target},
        # token ids: no calibration probes to draw faults meant for the measured requests
        "workload": {"num_prompts": PROMPTS, "input_tokens": 32, "output_tokens": OUTPUT, "prompt": "token-ids"},
        "load": {"concurrency": 4, "warmup_requests": 0},
    })
    result = execute(sc, tmp_path / "run")
    assert not result.interrupted
    return result.summary.to_dict()["cells"][0]["metrics"]  # type: ignore[no-any-return]


# fault -> the class its requests must be recorded under (None: they succeed)
MATRIX: dict[str, str | None] = {
    "http_429": "http_status",
    "http_500": "http_status",
    "http_503": "http_status",
    "reset": "reset",
    "stream_cut": "stream_cut",
    "stall": "timeout",
    "malformed_json": "malformed",
    "missing_prefix": "malformed",
    "no_done": None,
    "usage_mismatch": None,
    "slow_ttft": None,
    "usage_huge": "usage_invalid",  # a billion tokens for a request that may have OUTPUT
    "wrong_types": "malformed",  # "choices": 5
    "overrun": "overrun",  # a stream past max_tokens, ended by the client
}


@pytest.mark.parametrize("fault", list(MATRIX))
def test_fault_matrix(fault: str, start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5, faults={fault: RATE}, fault_seed=7, slow_ttft_ms=300)
    metrics = run(base_url, tmp_path)
    sim = sim_counters(base_url)
    injected = int(sim[f'loadgen_sim_faults_total{{kind="{fault}"}}'])
    assert 0 < injected < PROMPTS  # the seeded draw hit some requests and spared others

    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    # every request the server saw has its record, and nothing else was sent but the requests
    # sent again: a kept-alive connection reset before any byte of the answer is retried once
    retried = sum(r.retries for r in records)
    assert len(records) + retried == PROMPTS + retried == int(sim["loadgen_sim_requests_total"])
    assert metrics["requests"] == PROMPTS
    assert metrics["connection_retries"] == retried
    assert retried == 0 or fault == "reset"
    injected -= retried  # a reset the retry got past is not a failure of the request
    expected = MATRIX[fault]
    failed = [r for r in records if not r.ok]
    if expected is None:
        assert metrics["failed"] == 0
        assert metrics["completed"] == PROMPTS
    else:
        assert metrics["failures_by_class"] == {expected: injected}
        assert metrics["completed"] == PROMPTS - injected
        assert {r.error for r in failed} == {expected}
    # throughput and latency come from the successful requests alone
    assert metrics["throughput_over"] == "successful requests"
    # (the server's usage is the count: a usage chunk claiming one more adds one per request)
    extra = injected if fault == "usage_mismatch" else 0
    assert metrics["output_tokens_total"] == (PROMPTS - len(failed)) * OUTPUT + extra

    if fault.startswith("http_"):
        assert {r.status for r in failed} == {int(fault[5:])}
        assert all("injected fault" in (r.error_detail or "") for r in failed)
    if fault == "reset":
        assert all(r.status is None and r.chunk_tokens_total == 0 for r in failed)
        assert retried > 0  # resets on kept-alive connections were sent again...
        # ...and a server that resets some connections is not one that closes them all
        assert "connections" not in json.loads((tmp_path / "run" / "provenance.json").read_text())
    if fault in ("stall", "malformed_json", "wrong_types"):
        # the tokens that arrived before the fault are kept on the record
        assert {r.chunk_tokens_total for r in failed} == {HALF}
        assert all(r.first_token_at is not None for r in failed)
    if fault == "stream_cut":
        assert all(1 <= r.chunk_tokens_total <= HALF for r in failed)
        assert sum(r.chunk_tokens_total == HALF for r in failed) >= len(failed) // 2
    if fault == "usage_mismatch":
        # the final usage claims one token more than the chunks carried: visible, per request
        assert metrics["chunk_token_discrepancy"] == {"requests": injected, "tokens": injected}
    if fault == "usage_huge":
        assert {r.chunk_tokens_total for r in failed} == {OUTPUT}
    if fault == "overrun":
        # ended at the first token beyond max_tokens and its margin, not when the server stopped
        assert {r.chunk_tokens_total for r in failed} == {OUTPUT + max(16, OUTPUT // 10)}
    if fault == "slow_ttft":
        slow = [r for r in records if (r.first_token_at or 0) - (r.sent_at or 0) > 0.3]
        assert len(slow) == injected


def test_a_crashed_server_leaves_every_request_accounted_for(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5, crash_after=10)
    metrics = run(base_url, tmp_path)
    records = list(read_records(tmp_path / "run" / "records.jsonl"))
    assert len(records) == PROMPTS
    classes = metrics["failures_by_class"]
    # the in-flight streams broke, everything after found the port closed
    assert set(classes) <= {"stream_cut", "reset", "connect"}
    # (a request that reaches the listener while the process is exiting is accepted by the
    # kernel and then reset, so some of the later ones are resets rather than refusals)
    assert classes["connect"] + classes.get("reset", 0) >= PROMPTS - 10 - 4
    assert classes.get("stream_cut", 0) <= 4
    assert metrics["completed"] <= 9
    assert metrics["completed"] + sum(classes.values()) == PROMPTS
    assert all(r.error is not None for r in records if (r.sent_at or 0) > max(
        (x.sent_at or 0) for x in records if x.ok) + 1)


def test_a_scenario_can_ask_the_simulator_for_faults(tmp_path: Path) -> None:
    sc = parse_scenario({
        "name": "faults",
        "serve": {"backend": "sim", "sim": {"ttft_ms": 10, "itl_ms": 2, "faults": {"http_503": 0.5}, "fault_seed": 1}},
        "workload": {"num_prompts": 20, "input_tokens": 16, "output_tokens": 8},
        "load": {"concurrency": 2, "warmup_requests": 0},
    })
    metrics = execute(sc, tmp_path / "run").summary.to_dict()["cells"][0]["metrics"]
    assert metrics["requests"] == 20
    assert set(metrics["failures_by_class"]) == {"http_status"}
    assert 0 < metrics["failures_by_class"]["http_status"] < 20


def test_abort_rule_ends_the_run_with_exit_4(start_sim: StartSim, tmp_path: Path) -> None:
    import subprocess
    import sys

    import orjson
    import yaml

    from loadgen.results.rundir import rebuild_summary

    base_url = start_sim(ttft_ms=20, itl_ms=5, faults={"http_503": 0.7}, fault_seed=3)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({
        "name": "abort",
        "target": {"base_url": base_url},
        "workload": {"num_prompts": 400, "input_tokens": 16, "output_tokens": 8},
        "load": {"concurrency": [2, 4], "warmup_requests": 0, "abort_on_error_rate": 0.5, "abort_min_requests": 10},
    }))
    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(run_dir)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 4, proc.stderr
    assert "aborted: " in proc.stderr
    assert "load.abort_on_error_rate 50%" in proc.stderr
    assert "Traceback" not in proc.stderr
    summary = orjson.loads((run_dir / "summary.json").read_bytes())
    assert summary["aborted"].endswith("(>= load.abort_on_error_rate 50%)") or "load.abort_on_error_rate" in summary["aborted"]
    # the first cell stopped early; the second never started
    (cell,) = summary["cells"]
    assert cell["status"] == "failed"
    assert cell["reason"].startswith("aborted: ")
    records = list(read_records(run_dir / "records.jsonl"))
    assert 10 <= len(records) < 400
    finished = [r for r in records if r.error != "cancelled"]
    failed = [r for r in finished if not r.ok]
    assert len(failed) / len(finished) >= 0.5 or len(finished) < 10
    assert rebuild_summary(run_dir).to_dict() == summary


@pytest.mark.parametrize(("timeouts", "detail", "tokens"), [
    ({"first_token_s": 0.1}, "first token", 0),  # every first token comes 300 ms late
    ({"total_s": 0.2}, "total", None),  # 20 ms + 63 x 5 ms of tokens cannot finish in 200 ms
])
def test_first_token_and_total_timeouts(
    timeouts: dict[str, float], detail: str, tokens: int | None, start_sim: StartSim, tmp_path: Path
) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5, faults={"slow_ttft": 1.0} if tokens == 0 else {}, slow_ttft_ms=300)
    sc = parse_scenario({
        "name": "timeouts",
        "target": {"base_url": base_url, "timeouts": timeouts},
        "workload": {"num_prompts": 8, "input_tokens": 16, "output_tokens": 64},
        "load": {"concurrency": 4, "warmup_requests": 0},
    })
    metrics = execute(sc, tmp_path / "run").summary.to_dict()["cells"][0]["metrics"]
    assert metrics["failures_by_class"] == {"timeout": 8}
    records = [r for r in read_records(tmp_path / "run" / "records.jsonl") if not r.warmup]  # calibration probes aside
    assert {r.error_detail for r in records} == {detail}
    if tokens == 0:
        assert all(r.chunk_tokens_total == 0 for r in records)
    else:  # cut at 200 ms: the tokens that came before are kept, not all 64
        assert all(20 <= r.chunk_tokens_total < 64 for r in records)
        assert all(0.19 <= (r.done_at or 0) - (r.sent_at or 0) < 0.3 for r in records)
