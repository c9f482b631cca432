"""Locust's web UI with loadgen's LLM user, driven from a real headless browser (Debian's
chromium and chromedriver): start a run from the form, read the statistics and the LLM tab,
keep a screenshot (set LOADGEN_SCREENSHOT_DIR to keep it past the test)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from loadgen.servers.launch import free_port
from tests.conftest import StartSim

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (the test extra)")
if CHROMIUM is None or CHROMEDRIVER is None:
    if os.environ.get("CI") == "true":  # CI installs them (.ci/run): never skip silently there
        pytest.fail("chromium / chromedriver missing: apt-get install chromium chromium-driver",
                    pytrace=False)
    pytest.skip("needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver",
                allow_module_level=True)

from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.remote.webdriver import WebDriver  # noqa: E402

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "chat.yaml"


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,900"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate, timeout: float = 30.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError("timed out waiting for the web UI")


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
        keep = os.environ.get("LOADGEN_SCREENSHOT_DIR")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for png in tmp_path.glob("*.png"):
                shutil.copy(png, Path(keep) / png.name)
    for png in ("statistics.png", "llm.png"):
        assert (tmp_path / png).stat().st_size > 10_000


def _up(url: str) -> bool:
    try:
        return httpx.get(url, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False
