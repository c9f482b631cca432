"""Locust's web UI with loadgen's LLM user, driven from a real headless browser (Debian's
chromium and chromedriver): start a run from the form, read the statistics and the LLM tab,
keep a screenshot (set LOADGEN_SCREENSHOT_DIR to keep it past the test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

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


def test_start_a_run_from_the_web_ui_and_see_llm_entries(
    start_sim: StartSim, browser: WebDriver, tmp_path: Path
) -> None:
    base_url = start_sim(ttft_ms=50, itl_ms=10)
    port = free_port("127.0.0.1")
    with (tmp_path / "locust.log").open("w") as log:
        ui = subprocess.Popen(
            [sys.executable, "-m", "loadgen", "locust", "--scenario", str(SCENARIO), "--host", base_url,
             "--web-port", str(port)],
            stdout=subprocess.DEVNULL, stderr=log,
        )
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for(lambda: _up(url))
        browser.get(url)
        for name, value in (("userCount", "8"), ("spawnRate", "8")):
            field = wait_for(lambda n=name: browser.find_elements(By.NAME, n))[0]
            field.send_keys(Keys.CONTROL, "a")
            field.send_keys(value)
        browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()

        # the statistics tab fills with loadgen's entries as streams complete (~1.3 s each)
        # one snapshot in the page (the table re-renders every 2 s under element handles)
        cells = lambda: set(browser.execute_script(  # noqa: E731
            "return Array.from(document.querySelectorAll('td'), e => e.textContent)"
        ))
        wait_for(lambda: {"LLM", "TTFT", "TPOT", "ITL", "E2E"} <= cells())
        browser.save_screenshot(str(tmp_path / "statistics.png"))

        tab(browser, "LLM")
        rows = lambda: browser.execute_script(  # noqa: E731
            "return Array.from(document.querySelectorAll('tr'), r => Array.from(r.cells, c => c.textContent))"
        )
        fields = wait_for(lambda: next((r for r in rows() if r and r[0] == "Total"), None))
        # Total, requests, failures, failure classes, output tokens, prompt tokens, ...
        requests, failures, output = int(fields[1]), int(fields[2]), int(fields[4])
        assert requests > 0
        assert failures == 0
        assert output == requests * 128  # chat.yaml: 128 output tokens per request
        browser.save_screenshot(str(tmp_path / "llm.png"))
        # the JSON behind the tab, for scripts
        stats = httpx.get(url + "llm/stats", trust_env=False).json()
        assert stats["entries"] == ["TTFT", "TPOT", "ITL", "E2E"]
        assert stats["rows"][-1]["name"] == "Total"
    finally:
        ui.terminate()
        ui.wait(timeout=30)
        keep_screenshots(tmp_path)
    for png in ("statistics.png", "llm.png"):
        assert (tmp_path / png).stat().st_size > 10_000


def _up(url: str) -> bool:
    try:
        return httpx.get(url, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
