"""summary.json as typed results: the same keys as before, a schema version, and run
directories written before the version existed still read and render."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import orjson

from loadgen.results.cellstatus import ServerInfo
from loadgen.results.figures import Distribution
from loadgen.results.readings import ClientReading, Scrape
from loadgen.results.rundir import rebuild_summary
from loadgen.results.samples import SAMPLES, read_samples
from loadgen.results.summary import SCHEMA_VERSION, Summary

OLD_RUN = Path(__file__).resolve().parents[2] / "data" / "rundir-v1"  # written by loadgen 0.1.0 before typing
# what later versions added; everything else keeps its key and value
ADDED = {
    "schema_version", "seed", "server_prefix_cache_hit_rate", "cache_reset", "warnings", "slot_wait_s", "verdict", "hogs",
    "request_bounds", "connection_retries", "engine_gap", "ramp_left_out", "margin", "ranges", "likely", "at_edge", "peak_in_flight", "mean_in_flight",
    "windows", "steady_state", "energy", "clock", "client_delay_ms", "coalesced_reads",
    # a cell's server is a fixed schema now, every field written
    *(f.name for f in fields(ServerInfo)),
}


def same_but_added(new: object, old: object, path: str = "") -> None:
    """``new`` holds every key of ``old`` with the same value; its other keys are ADDED ones."""
    if isinstance(old, dict):
        assert isinstance(new, dict), path
        assert set(old) <= set(new), (path, set(old) - set(new))
        assert set(new) - set(old) <= ADDED, (path, set(new) - set(old))
        for k in old:
            same_but_added(new[k], old[k], f"{path}.{k}")
    elif isinstance(old, list):
        assert isinstance(new, list), path
        assert len(new) == len(old), path
        for i, (a, b) in enumerate(zip(new, old, strict=True)):
            same_but_added(a, b, f"{path}[{i}]")
    else:
        assert new == old, path


def test_distribution_round_trip_keeps_the_p99_9_key() -> None:
    d = Distribution(mean=1.0, min=0.5, max=2.0, std=0.1, p50=1.0, p90=1.5, p95=1.6, p99=1.9, p99_9=1.99)
    data = d.to_dict()
    assert data["p99.9"] == 1.99
    assert list(data) == ["mean", "min", "max", "std", "p50", "p90", "p95", "p99", "p99.9"]
    assert Distribution.from_dict(data) == d
    assert d.get("p99.9") == 1.99


def test_old_summary_reads_into_types_and_writes_back_the_same_keys() -> None:
    old = orjson.loads((OLD_RUN / "summary.json").read_bytes())
    assert "schema_version" not in old
    summary = Summary.from_dict(old)
    assert summary.schema_version == 1
    assert len(summary.cells) == 2
    first = summary.cells[0].metrics
    assert first is not None
    assert first.completed == 8
    assert first.slo == {"ttft_ms": 200.0, "tpot_ms": 20.0}
    again = summary.to_dict()
    assert again["schema_version"] == 1
    same_but_added(again, old)


def test_old_run_directory_is_re_derived_with_the_same_figures() -> None:
    old = orjson.loads((OLD_RUN / "summary.json").read_bytes())
    rebuilt = rebuild_summary(OLD_RUN).to_dict()
    assert rebuilt["schema_version"] == SCHEMA_VERSION
    assert rebuilt["seed"] == 0  # the scenario of that run had seed 0, then the default
    # its closed-loop cells reported TTFT from the schedule and the send lag, which there
    # measured the wait for a free slot; both are now left empty outside an open loop
    for cell in old["cells"]:
        if cell["params"]["rate"] is None and cell["metrics"]:
            for key in ("ttft_from_schedule_s", "send_lag_s"):
                assert cell["metrics"][key]["mean"] is not None
                cell["metrics"][key] = dict.fromkeys(cell["metrics"][key])
    same_but_added(rebuilt, old)


def test_old_run_directory_renders_with_loadgen_report() -> None:
    for fmt in ("console", "md", "json"):
        done = subprocess.run(
            [sys.executable, "-m", "loadgen", "report", str(OLD_RUN), "--format", fmt],
            capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert "TTFT" in done.stdout or '"ttft_s"' in done.stdout


# written by this version: a capacity search of multi-turn sessions against the simulator
# (6 probes, per-turn figures, /metrics scrapes and client readings, the launched server)
NEW_RUN = Path(__file__).resolve().parents[2] / "data" / "rundir-v2"


def test_todays_summary_reads_into_types_and_writes_back_identical() -> None:
    stored = orjson.loads((NEW_RUN / "summary.json").read_bytes())
    assert stored["schema_version"] == SCHEMA_VERSION
    summary = Summary.from_dict(stored)
    assert summary.to_dict() == stored
    (answer,) = summary.capacity
    assert (answer.max_meeting_slo, answer.binds_at, answer.limiting_slo) == (4.0, 5.0, ("tpot_ms.p99",))
    first = summary.cells[0].metrics
    assert first is not None
    assert first.turns is not None
    assert [t.value for t in first.turns] == [0, 1]
    # every session of the first probe ran both turns: its 6 requests per turn
    assert [t.metrics.requests for t in first.turns] == [6, 6]


def test_todays_run_directory_is_re_derived_to_the_same_summary() -> None:
    stored = orjson.loads((NEW_RUN / "summary.json").read_bytes())
    assert rebuild_summary(NEW_RUN).to_dict() == stored


def test_todays_samples_read_back_as_their_readings() -> None:
    samples = read_samples(NEW_RUN / SAMPLES)
    first = samples[0]
    assert set(first) == {"metrics", "client"}
    assert all(isinstance(s.values, Scrape) for s in first["metrics"])
    assert all(isinstance(s.values, ClientReading) for s in first["client"])
    # the prefix-cache counters the simulator exports, read as counters
    assert "prefix_cache_queries" in first["metrics"][0].values.counters
