"""Locust's web UI with loadgen's LLM user, driven from a real headless browser (Debian's
chromium and chromedriver): start a run from the form, read the statistics and the LLM tab,
keep a screenshot (set LOADGEN_SCREENSHOT_DIR to keep it past the test)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from loadgen.results.records import read_records
from loadgen.servers.launch import free_port
from tests.browser import browser_fixture, keep_screenshots, wait_for
from tests.conftest import StartSim

By = pytest.importorskip("selenium.webdriver.common.by", reason="pip install selenium (the test extra)").By
Keys = pytest.importorskip("selenium.webdriver.common.keys").Keys
WebDriver = Any
browser = pytest.fixture(browser_fixture, name="browser")

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "chat.yaml"


def tab(driver: WebDriver, name: str) -> None:
    for t in driver.find_elements(By.CSS_SELECTOR, "[role=tab]"):
        if t.text.strip().upper() == name:
            t.click()
            return
    raise AssertionError(f"no {name} tab")


def test_locust_counts_requests_and_the_llm_tab_charts_the_run(
    start_sim: StartSim, browser: WebDriver, tmp_path: Path
) -> None:
    """16 users on the simulator (TTFT 50 ms, ITL 10 ms, 128 output tokens: 1.32 s a request, so
    16 / 1.32 = 12.1 requests/s): Locust's RPS and Response Times are requests', the LLM tab
    charts the run while it goes, and STOP writes the run directory's summary."""
    base_url = start_sim(ttft_ms=50, itl_ms=10)
    port = free_port("127.0.0.1")
    run_dir = tmp_path / "run"
    with (tmp_path / "locust.log").open("w") as log:
        ui = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "locust", "--scenario", str(SCENARIO), "--host", base_url,
             "--web-port", str(port), "--out", str(run_dir)],
            stdout=subprocess.DEVNULL, stderr=log,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: _up(url))
        browser.get(url)
        # the start page says what the users will send
        about = wait_for(lambda: browser.find_elements(By.ID, "loadgen-scenario"))[0].text
        assert "API: chat at " + base_url in about
        assert "Model: auto" in about
        assert "Input / output: 256 / 128 tokens" in about
        browser.save_screenshot(str(tmp_path / "start.png"))
        # users started 0.2 s apart, as a ramp would: 16 started at once finish in waves, and
        # Locust's RPS (completions in whole seconds over 10 s) would count 7 or 8 of them
        for name, value in (("userCount", "16"), ("spawnRate", "5")):
            field = wait_for(lambda n=name: browser.find_elements(By.NAME, n))[0]
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(value)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

        cells = lambda: set(browser.execute_script(  # noqa: E731
            "return Array.from(document.querySelectorAll('td'), e => e.textContent)"
        ))
        wait_for(lambda: {"LLM", "TTFT", "TPOT", "E2E"} <= cells())
        assert "ITL" not in cells()
        tab(browser, "LLM")
        points = lambda: int(browser.execute_script(  # noqa: E731
            "const b = document.getElementById('loadgen-llm-charts'); return b ? b.dataset.points || 0 : 0"))
        first = wait_for(points)
        # Locust's current RPS is over 10 s ending 2 s ago: read it once all users have run 12 s
        time.sleep(16)
        read_at = time.time()
        stats = httpx.get(url + "stats/requests", trust_env=False).json()
        history = httpx.get(url + "llm/history", trust_env=False).json()["points"]
        # the Response Times chart is the requests' latency (1.32 s), not a gap between tokens
        p50 = stats["current_response_time_percentiles"]["response_time_percentile_0.5"]
        assert 1250 <= p50 <= 1400, stats["current_response_time_percentiles"]
        assert points() > first  # the charts moved on while the test ran
        assert browser.execute_script("return document.querySelectorAll('#loadgen-llm-charts svg').length") == 6
        drawn = browser.execute_script("return document.querySelectorAll('#loadgen-llm-charts polyline').length")
        assert drawn >= 6
        browser.save_screenshot(str(tmp_path / "llm-running.png"))

        # STOP: the run directory gets its summary without Locust exiting
        stop = next(b for b in browser.find_elements(By.TAG_NAME, "button") if b.text.strip().upper() == "STOP")
        stop.click()
        summary = wait_for(lambda: (run_dir / "summary.json").exists() and (run_dir / "summary.json").read_text())
        # the requests that completed in the 10 whole seconds Locust's RPS counts (it ends 2 s
        # before the latest request), from the run directory's records on the wall clock
        base = json.loads((run_dir / "provenance.json").read_text())["clock_base_epoch_ns"] / 1e9
        done = [base + r.done_at for r in read_records(run_dir / "records.jsonl") if r.ok and r.done_at]
        last = int(read_at)
        completed = sum(1 for t in done if last - 12 <= int(t) < last - 2) / 10
        assert abs(stats["current_rps"] - completed) / completed < 0.05, (stats["current_rps"], completed)
        # the LLM tab's own figure, over its window behind the longest request
        assert abs(history[-1]["requests_s"] - completed) / completed < 0.05, (history[-1], completed)
        assert history[-1]["users"] == 16
        # at most the simulator's rate: 16 streams of 50 + 127 x 10 ms (the browser shares the cores)
        assert completed <= 16 / 1.32 * 1.05
        cell = json.loads(summary)["cells"][0]
        assert cell["metrics"]["completed"] > 100
        assert cell["server"]["model"] == "loadgen-sim"
        assert (run_dir / "report.md").exists()
        rows = lambda: browser.execute_script(  # noqa: E731
            "return Array.from(document.querySelectorAll('tr'), r => Array.from(r.cells, c => c.textContent))"
        )
        total = wait_for(lambda: next((r for r in rows() if r and r[0] == "Total"), None))
        # after the stop the per-user figure is per user of the peak, not blank
        headers = next(r for r in rows() if r and r[0] == "Name")
        assert total[headers.index("Output tok/s per user")] not in ("", "-")
        wait_for(lambda: "STOPPED" in browser.find_element(By.TAG_NAME, "header").text.upper())
        time.sleep(2.5)  # the charts' next draw, after the stop
        browser.save_screenshot(str(tmp_path / "llm-stopped.png"))
    finally:
        ui.terminate()
        ui.wait(timeout=30)
        keep_screenshots(tmp_path)
    for png in ("start.png", "llm-running.png", "llm-stopped.png"):
        assert (tmp_path / png).stat().st_size > 10_000


def _up(url: str) -> bool:
    try:
        return httpx.get(url, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
