"""The server as witness: its prefix-cache counters say whether any request of ours was answered
from a cache another filled. The simulator keeps vLLM's kind of prefix cache (16-token blocks),
so the truth is known."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from loadgen.errors import TargetError
from loadgen.load.run import execute
from loadgen.load.sampling import MetricsScraper
from loadgen.results.rundir import RECORDS
from loadgen.scenario.loader import parse_scenario
from tests.conftest import StartSim


def cache_counters(base_url: str) -> tuple[float, float]:
    text = httpx.get(base_url.removesuffix("/v1") + "/metrics", trust_env=False).text
    values = dict(line.split() for line in text.splitlines() if line and line[0] != "#")
    return float(values["loadgen_sim_prefix_cache_queries_total"]), float(values["loadgen_sim_prefix_cache_hits_total"])


def scenario(base_url: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": "cache",
        "target": {"base_url": base_url},
        "workload": {"num_prompts": 12, "input_tokens": 64, "output_tokens": 4},
        "load": {"concurrency": [1, 4], "warmup_requests": 2, **extra.pop("load", {})},
        **extra,
    }


@pytest.mark.alone
def test_each_run_draws_its_own_seed_and_the_server_caches_nothing_twice(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    seeds = []
    for n in range(2):
        result = execute(parse_scenario(scenario(base_url)), tmp_path / f"run{n}")
        assert result.summary.seed is not None
        seeds.append(result.summary.seed)
        provenance = orjson.loads((tmp_path / f"run{n}" / "provenance.json").read_bytes())
        assert provenance["seed"] == result.summary.seed
        resolved = yaml.safe_load((tmp_path / f"run{n}" / "scenario.resolved.yaml").read_text())
        assert resolved["seed"] == result.summary.seed  # the run can be repeated exactly
        assert [c.server_prefix_cache_hit_rate for c in result.summary.cells] == [0.0, 0.0]
        assert all(not c.warnings for c in result.summary.cells)
    assert seeds[0] != seeds[1]
    queries, hits = cache_counters(base_url)
    # 2 runs x (2 probes of 16 and 48 words + 2 cells x (2 warmups + 12 requests) x 64 tokens)
    assert queries == 2 * (16 + 48 + 2 * 14 * 64)
    assert hits == 0


def test_a_seed_given_again_is_answered_from_the_cache_and_the_run_says_so(
    start_sim: StartSim, tmp_path: Path
) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    path = tmp_path / "seeded.yaml"
    path.write_text(yaml.safe_dump(scenario(base_url, seed=11)))
    runs = []
    for n in range(2):
        proc = subprocess.run(
            [sys.executable, "-m", "loadgen", "run", str(path), "--out", str(tmp_path / f"run{n}")],
            capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "seed 11: the prompts are those of every run with this seed" in proc.stderr
        runs.append((orjson.loads((tmp_path / f"run{n}" / "summary.json").read_bytes()), proc.stderr + proc.stdout))
    first, second = runs[0][0], runs[1][0]
    assert [c["server_prefix_cache_hit_rate"] for c in first["cells"]] == [0.0, 0.0]
    # the second run's prompts are the first run's: every full 16-token block was cached
    assert [c["server_prefix_cache_hit_rate"] for c in second["cells"]] == [1.0, 1.0]
    assert all("from its prefix cache" in c["warnings"][0] for c in second["cells"])
    assert "warning: cell 1/2: the server answered 100.0% of this cell's prompt tokens" in runs[1][1]
    assert "server prefix-cache hits 100.0% of prompt tokens" in runs[1][1]


def test_reset_between_cells_empties_the_cache_and_is_recorded(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    body = scenario(base_url, seed=3, load={"reset_cache": "between-cells"})
    execute(parse_scenario(body), tmp_path / "run0")
    result = execute(parse_scenario(body), tmp_path / "run1")  # the same prompts again, each cell on an empty cache
    cells = result.summary.cells
    assert [c.cache_reset for c in cells] == ["POST /reset_prefix_cache"] * 2
    assert [c.server_prefix_cache_hit_rate for c in cells] == [0.0, 0.0]
    status = [orjson.loads(line) for line in (tmp_path / "run1" / "cells.jsonl").read_bytes().splitlines()]
    assert [s["cache_reset"] for s in status] == ["POST /reset_prefix_cache"] * 2


class _NoReset(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self.send_response(404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_a_target_without_a_cache_reset_is_a_clear_error() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _NoReset)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        async def reset() -> str:
            async with MetricsScraper(f"http://127.0.0.1:{server.server_port}/v1") as scraper:
                return await scraper.reset_prefix_cache()

        with pytest.raises(TargetError, match=r"load.reset_cache: the target has no prefix-cache reset \(vLLM"):
            asyncio.run(reset())
    finally:
        server.shutdown()
        server.server_close()


def test_a_launched_simulator_and_the_client_get_cores_of_their_own(tmp_path: Path) -> None:
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs two cores to give the server and the client one each")
    body = {"serve": {"backend": "sim", "sim": {"ttft_ms": 5, "itl_ms": 1}}, "workload": {"num_prompts": 4},
            "load": {"warmup_requests": 0}}
    path = tmp_path / "pinned.yaml"
    path.write_text(yaml.safe_dump(body))
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    engine, client = cores[:-1], cores[-1:]
    provenance = orjson.loads((tmp_path / "run" / "provenance.json").read_bytes())
    assert provenance["cpus"]["engine"] == engine
    assert provenance["cpus"]["client"] == client
    assert "taskset -c " + ",".join(map(str, engine)) in proc.stderr  # the launch line says so too
    assert f"cores: engine {engine[0]}" in proc.stderr
    assert (tmp_path / "run" / RECORDS).is_file()
    # an in-process run gives the process its cores back when it ends
    execute(parse_scenario(body), tmp_path / "again")
    assert sorted(os.sched_getaffinity(0)) == cores


def test_client_cores_that_do_not_exist_are_one_line_and_exit_2(start_sim: StartSim, tmp_path: Path) -> None:
    base_url = start_sim(ttft_ms=5, itl_ms=1)
    path = tmp_path / "cores.yaml"
    path.write_text(yaml.safe_dump(scenario(base_url, load={"client_cpus": [4096]})))
    proc = subprocess.run([sys.executable, "-m", "loadgen", "run", str(path), "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: load.client_cpus: core 4096 is not available here")
    assert "Traceback" not in proc.stderr
