"""Locust's users time a token by when its bytes arrived (the kernel's receive stamp), as
loadgen run does: a user's greenlet that gets to a read late moves no token's time."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from loadgen.load.connection import STARVE_ENV
from loadgen.results.records import RequestRecord, read_records
from tests.conftest import StartSim
from tests.helpers.locust import headless, write_scenario
from tests.helpers.simtruth import sim_metrics
from tests.integration.load.test_kernel_clock import itl_ms

pytestmark = [pytest.mark.locust, pytest.mark.timing]


def locust_run(base_url: str, tmp_path: Path, clock: str) -> tuple[list[RequestRecord], dict]:
    out = tmp_path / clock
    out.mkdir()
    scenario = write_scenario(out / "s.yaml", workload={"num_prompts": 8, "input_tokens": 8, "output_tokens": 2},
                              load={"clock": clock})
    run = headless(scenario, base_url, out, 1, "3s", 10)
    assert run.returncode == 0, run.stderr[-3000:]
    records = [r for r in read_records(out / "run" / "records.jsonl") if r.error is None]
    assert len(records) >= 5, records
    return records, orjson.loads((out / "run" / "provenance.json").read_bytes())


@pytest.mark.alone
def test_a_busy_locust_user_keeps_the_true_itl_with_kernel_stamps_and_not_without(
    start_sim: StartSim, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The user holds its core 30 ms after each read: the second token (10 ms after the first)
    comes while it is held. With the kernel's stamps (the default) its ITL is the server's 10 ms
    and each request says its read was taken 20 ms late; timed when read, 30 ms."""
    base_url = start_sim(ttft_ms=50, itl_ms=10)
    monkeypatch.setenv(STARVE_ENV, "30")
    stamped, provenance = locust_run(base_url, tmp_path, "auto")
    late_ms = sim_metrics(base_url)["loadgen_sim_chunk_lateness_seconds_max"] * 1e3
    assert provenance["client_clock"] == {"clock": "kernel", "why_not_kernel": None}
    # where the user was still held when both tokens had come, TCP merged them into one read, whose
    # stamp is its newest bytes': they share that time, and the read is counted (a few of them)
    merged = [r for r in stamped if r.coalesced_reads]
    assert len(merged) <= len(stamped) // 3, merged
    for r in merged:
        assert r.coalesced_reads == 1
        assert itl_ms(r) == 0
    assert all(r.client_delay_s is not None for r in stamped)  # every request timed by the kernel
    kept = [r for r in stamped if r not in merged]
    # the second token's read also carries the answer's end, sent after it (its usage, [DONE]),
    # and a read's stamp is its newest bytes': 10 ms, or a few more where the simulator sent the
    # end a little later (13 ms once in some 60 requests)
    assert sorted(itl_ms(r) for r in kept)[len(kept) // 2] == pytest.approx(10, abs=1 + late_ms)
    assert sorted(r.ttft_s or 0.0 for r in kept)[len(kept) // 2] == pytest.approx(0.050, abs=0.001 + late_ms / 1e3)
    for r in kept:
        # each within a few ms (a request's TTFT once read 56 ms, its first bytes late from the
        # simulator): the loop's clock reads 30 and 81 ms
        assert 9 - late_ms <= itl_ms(r) <= 15 + late_ms
        assert r.ttft_s == pytest.approx(0.050, abs=0.008 + late_ms / 1e3)
        assert r.client_delay_s is not None
        # the second token's read was taken when the 30 ms hold after the first's ended: 20 ms
        # after its bytes came (up to 60 where a read followed two holds: 43 ms once)
        assert 17 - late_ms < r.client_delay_s * 1e3 < 63 + late_ms
    # the self-check, as loadgen run's: each second of the process's reads, their delays measured
    (cell,) = orjson.loads((tmp_path / "auto" / "run" / "summary.json").read_bytes())["cells"]
    client = cell["client"]
    assert client["clock"] == "kernel"
    assert client["workers"] == 1
    assert client["reads"] > 2 * len(stamped)
    # (a read taken after two events' holds, its own and one before it, waited up to 60 ms)
    assert 17 - late_ms < client["client_delay_ms"]["p99"] < 63 + late_ms
    loop, provenance = locust_run(base_url, tmp_path, "loop")
    assert provenance["client_clock"] == {"clock": "loop", "why_not_kernel": "load.clock: loop"}
    for r in loop:
        assert itl_ms(r) == pytest.approx(30, abs=3)  # when the busy user got to it
        assert r.client_delay_s is None


def test_kernel_stamps_asked_of_an_https_target_are_one_line(tmp_path: Path) -> None:
    from tests.helpers.locust import locust

    scenario = write_scenario(tmp_path / "s.yaml", load={"clock": "kernel"})
    run = locust("--scenario", str(scenario), "--host", "https://127.0.0.1:9/v1", "--headless", "-u", "1",
                 "-t", "2s", "--out", str(tmp_path / "run"))
    assert run.returncode == 2, run.stderr[-2000:]
    assert ("error: load.clock kernel: the target is https: the kernel stamps the encrypted bytes, which the "
            "TLS layer reads; set load.clock: auto (or loop)") in run.stderr


def values_ms(run_dir: Path, wave: int) -> dict[str, list[float]]:
    """A run's TTFTs, TPOTs and ITLs, in ms, after its first ``wave`` requests (sent at once, a
    burst the loop never sees again, and a different share of each client's run)."""
    records = sorted((r for r in read_records(run_dir / "records.jsonl") if r.ok and r.sent_at is not None),
                     key=lambda r: r.sent_at or 0.0)[wave:]
    return {
        "ttft": [r.ttft_s * 1e3 for r in records if r.ttft_s is not None],
        "tpot": [r.tpot_s * 1e3 for r in records if r.tpot_s is not None],
        "itl": [(b - a) * 1e3 for r in records for a, b in zip(r.chunk_offsets_s, r.chunk_offsets_s[1:], strict=False)],
    }


def percentile_and_error(values: list[float], q: float) -> tuple[float, float]:
    """The ``q``th percentile of ``values`` and its standard error (the spread of 400 seeded
    bootstrap resamples' percentiles): how far another run of the same server would move it."""
    import numpy as np

    data = np.asarray(values)
    resampled = np.random.default_rng(0).choice(data, size=(400, data.size))
    return float(np.percentile(data, q)), float(np.std(np.percentile(resampled, q, axis=1)))


@pytest.mark.alone  # two clients' figures to 2 ms: a busy machine moves the simulator's own timing
@pytest.mark.parametrize(("users", "processes"), [(16, 1), (16, 2)])
def test_locust_and_loadgen_run_agree_within_2_ms(start_sim: StartSim, tmp_path: Path, users: int,
                                                  processes: int) -> None:
    """One server (TTFT 50 ms, ITL 10 ms, 64 tokens), measured by loadgen run and by Locust's
    users at the same concurrency (in one process, and over 2): after each run's first wave
    (the first C requests, sent at once: a different share of each client's run), TTFT, TPOT
    and ITL at p50 and p99 agree within 2 ms, or within the percentiles' own sampling error where
    that is wider (two loadgen runs pooled). (At 64 streams on this 2-core machine the p50s and
    the TPOT and ITL p99s agree as well, but the TTFT p99 of either client moves 51 to 62 ms
    run to run: the closed loop's waves of 64 requests sent at once meet the simulator's one
    core. Not held to 2 ms here.)"""
    from typer.testing import CliRunner

    from loadgen.cli import app
    from tests.helpers.locust import locust

    base_url = start_sim(ttft_ms=50, itl_ms=10)
    scenario = write_scenario(tmp_path / "s.yaml", workload={"num_prompts": users * 6, "input_tokens": 32,
                                                             "output_tokens": 64},
                              load={"concurrency": users, "warmup_requests": 0})
    for name in ("run", "run-again"):  # twice: more requests for loadgen's percentiles
        result = CliRunner().invoke(app, ["run", str(scenario), "--base-url", base_url, "--out", str(tmp_path / name)])
        assert result.exit_code == 0, result.output
    run = locust("--scenario", str(scenario), "--host", base_url, "--headless", "-u", str(users), "-r", str(users),
                 "-t", "6s", "--processes", str(processes), "--out", str(tmp_path / "locust"), "--only-summary")
    assert run.returncode == 0, run.stderr[-3000:]
    ours = {k: v + values_ms(tmp_path / "run-again", users)[k]
            for k, v in values_ms(tmp_path / "run", users).items()}
    theirs = values_ms(tmp_path / "locust", users)
    # each process that ran users checked itself: its readings are the cell's self-check
    client = orjson.loads((tmp_path / "locust" / "summary.json").read_bytes())["cells"][0]["client"]
    assert client["workers"] == processes
    assert client["clock"] == "kernel"
    for key in ours:
        for q in (50, 99):
            (a, a_err), (b, b_err) = percentile_and_error(ours[key], q), percentile_and_error(theirs[key], q)
            # within 2 ms, or within three standard errors of the two estimates' difference where
            # the percentile's own sampling spread is wider (a p99 of some 150 requests is nearly
            # their slowest: six loadgen runs of one server put its TTFT p99 1.6 ms apart here,
            # and a busier machine spreads it further)
            assert abs(a - b) <= max(2.0, 3 * (a_err**2 + b_err**2) ** 0.5), (key, q, a, a_err, b, b_err)
