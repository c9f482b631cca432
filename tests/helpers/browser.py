"""A real headless browser for the tests that look at pages: Debian's chromium and
chromedriver (CI installs them; elsewhere the tests that need them skip, saying why)."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")


def start_browser() -> Any:
    """Headless chromium through chromedriver, its console log kept; skips (fails on CI) where
    either is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="pip install selenium (the test extra)")
    if CHROMIUM is None or CHROMEDRIVER is None:
        if os.environ.get("CI") == "true":  # CI installs them (.ci/run): never skip silently there
            pytest.fail("chromium / chromedriver missing: apt-get install chromium chromium-driver", pytrace=False)
        pytest.skip("needs Debian's chromium and chromium-driver: apt-get install chromium chromium-driver")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,900"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def browser_fixture() -> Iterator[Any]:
    driver = start_browser()
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(predicate: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError("timed out waiting for the page")


def console_errors(driver: Any) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def keep_screenshots(where: Path) -> None:
    """Copy a test's screenshots to LOADGEN_SCREENSHOT_DIR when set (to look at them)."""
    keep = os.environ.get("LOADGEN_SCREENSHOT_DIR")
    if keep:
        Path(keep).mkdir(parents=True, exist_ok=True)
        for png in where.glob("*.png"):
            shutil.copy(png, Path(keep) / png.name)
