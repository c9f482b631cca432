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
from tests.conftest import StartSim
from tests.helpers.browser import browser_fixture, console_errors, keep_screenshots, wait_for

pytestmark = pytest.mark.browser

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
        # the LLM tab: metrics as rows, statistics as columns, output tokens/s and requests/s first
        headers = wait_for(lambda: next((r for r in rows() if r and r[0] == "Metric"), None))
        assert headers == ["Metric", "Value", "p50", "p90", "p99"]
        table = {r[0]: r[1:] for r in rows() if r and r[0] != "Metric"}
        names = [r[0] for r in rows() if r and r[0] != "Metric"]
        assert names[:2] == ["Output tokens/s (whole test)", "Requests/s (whole test)"]
        assert {"TTFT (ms)", "TPOT (ms)", "ITL (ms)", "E2E (ms)"} <= set(table)
        assert 45 <= float(table["TTFT (ms)"][1]) <= 80  # p50 of the simulator's 50 ms
        # after the stop the per-user figure is per user of the peak, not blank
        wait_for(lambda: {r[0]: r[1:] for r in rows() if r}.get("Output tokens/s per user", ["-"])[0] not in ("", "-"))
        wait_for(lambda: "STOPPED" in browser.find_element(By.TAG_NAME, "header").text.upper())
        # the charts: a legend per chart, time ticks in seconds, "stopped" once stopped, and
        # the values of the point under the pointer
        wait_for(lambda: browser.execute_script(
            "return document.getElementById('loadgen-llm-charts').dataset.state") == "stopped", timeout=10)
        statuses = browser.execute_script(
            "return Array.from(document.querySelectorAll('.loadgen-status'), e => e.textContent)")
        assert len(statuses) == 6
        assert all(t.startswith("stopped; last: ") for t in statuses), statuses
        legends = browser.execute_script(
            "return Array.from(document.querySelectorAll('.loadgen-legend'), e => e.textContent)")
        assert "p99 (ms)" in legends
        assert "users (users)" in legends
        ticks = browser.execute_script(
            "return Array.from(document.querySelectorAll('svg.loadgen-chart')[0].querySelectorAll('.loadgen-tick'),"
            " e => e.textContent)")
        assert ticks[0] == "0 s"
        assert len(ticks) >= 3
        from selenium.webdriver.common.action_chains import ActionChains

        def hovered() -> str | None:
            # the pointer over the TTFT chart (redrawn every 2 s: tried again until one draw shows it)
            ActionChains(browser).move_by_offset(1, 0).perform()
            ActionChains(browser).move_to_element(browser.find_elements(By.CSS_SELECTOR, "svg.loadgen-chart")[2]).perform()
            return browser.execute_script(
                "const t = document.querySelectorAll('svg.loadgen-chart')[2].querySelector('.loadgen-hover');"
                "return t.getAttribute('visibility') === 'visible' ? t.textContent : null")

        hover = wait_for(hovered, timeout=10)
        assert "p50" in hover  # two series: each named
        assert hover.endswith(" ms")
        browser.save_screenshot(str(tmp_path / "llm-stopped.png"))

        # a second test from the form: a cell of its own, and the LLM tab counts it alone
        new = next(b for b in browser.find_elements(By.TAG_NAME, "button") if b.text.strip().upper() == "NEW")
        new.click()
        field = wait_for(lambda: browser.find_elements(By.NAME, "userCount"))[0]
        field.send_keys(Keys.CONTROL, "a")
        field.send_keys("4")
        wait_for(lambda: [b for b in browser.find_elements(By.CSS_SELECTOR, "button[type=submit]") if b.is_displayed()]
                 )[0].click()
        time.sleep(6)
        stop = next(b for b in browser.find_elements(By.TAG_NAME, "button") if b.text.strip().upper() == "STOP")
        stop.click()
        wait_for(lambda: len(json.loads((run_dir / "summary.json").read_text())["cells"]) == 2)
        cells = json.loads((run_dir / "summary.json").read_text())["cells"]
        assert [c["users"]["peak"] for c in cells] == [16, 4]
        second = sum(1 for r in read_records(run_dir / "records.jsonl") if r.cell == 1 and r.ok)
        assert cells[1]["metrics"]["completed"] == second > 0
        tab_total = next(r for r in httpx.get(url + "llm/stats", trust_env=False).json()["rows"] if r["name"] == "Total")
        assert tab_total["requests"] == second + sum(
            1 for r in read_records(run_dir / "records.jsonl") if r.cell == 1 and not r.ok and r.error != "cancelled")

        # the pages loadgen adds to: no console error, no script shown as text
        page = browser.find_element(By.TAG_NAME, "body").text
        assert "window.templateArgs" not in page
        assert "use strict" not in page
        assert console_errors(browser) == []

        # Locust's own report: it renders (its charts drawn, no script shown as text, no console
        # error) with the LLM figures of the last test
        errors_before = len(console_errors(browser))
        browser.get(url + "stats/report")
        wait_for(lambda: browser.find_elements(By.ID, "loadgen-llm"))
        text = browser.find_element(By.TAG_NAME, "body").text
        assert "Object.create" not in text
        assert "window.templateArgs" not in text
        assert "LLM (loadgen)" in text
        assert f"Requests\n{tab_total['requests']}" in text or f"Requests {tab_total['requests']}" in text
        wait_for(lambda: browser.execute_script("return document.querySelectorAll('canvas, svg').length") > 0)
        assert console_errors(browser)[errors_before:] == []
        browser.save_screenshot(str(tmp_path / "report.png"))

        # the way out: the LLM tab's Quit (confirmed) ends Locust cleanly, the run not interrupted
        browser.get(url)
        tab(browser, "LLM")
        quit_button = wait_for(lambda: browser.find_elements(By.ID, "loadgen-quit"))[0]
        quit_button.click()
        from selenium.common.exceptions import NoAlertPresentException

        def confirm_box() -> Any:
            try:
                return browser.switch_to.alert
            except NoAlertPresentException:
                return None

        wait_for(confirm_box).accept()
        assert ui.wait(timeout=60) == 0
        assert json.loads((run_dir / "summary.json").read_text())["interrupted"] is False
    finally:
        if ui.poll() is None:
            ui.terminate()
            ui.wait(timeout=30)
        keep_screenshots(tmp_path)
    for png in ("start.png", "llm-running.png", "llm-stopped.png", "report.png"):
        assert (tmp_path / png).stat().st_size > 10_000


def _up(url: str) -> bool:
    try:
        return httpx.get(url, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
