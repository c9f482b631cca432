"""The self-check flags a client that cannot keep up, and only then."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.conftest import StartSim
from tests.integration.load.test_workers import run, scenario


def test_a_starved_client_is_reported_client_bound(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    body = scenario(base_url, 1)
    body["workload"]["output_tokens"] = 64
    # every socket read costs 3 ms: 8 streams x 200 chunks/s need 4.8 s of CPU per second
    run_dir, stderr = run(tmp_path, "starved", body, env={"LOADGEN_TEST_CHUNK_DELAY_MS": "3"})
    client = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["client"]
    assert client["client_bound"] is True
    assert client["loop_lag_ms"]["p99"] > 5
    assert client["cpu_share_max"] > 0.9
    assert any(r.startswith("event-loop lag p99") for r in client["reasons"])
    assert client["read_us_mean"] >= 3000
    assert "load.workers: 2" in client["advice"]
    assert "was client-bound (event-loop lag p99" in stderr
    assert "load.workers" in stderr


def test_a_light_run_is_not_flagged(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=20, itl_ms=5)
    body = scenario(base_url, 1, concurrency=1)
    body["workload"]["num_prompts"] = 6
    run_dir, stderr = run(tmp_path, "light", body)
    client = orjson.loads((run_dir / "summary.json").read_bytes())["cells"][0]["client"]
    assert client["client_bound"] is False, client["reasons"]
    assert client["reads"] >= 6 * 24  # at least one read per token chunk
    assert "client-bound" not in stderr
