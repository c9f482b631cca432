"""``loadgen report RUN --html`` opened in headless Chromium: one file, every chart and table
rendered, nothing fetched from anywhere, no error in the page's console."""

from __future__ import annotations

import re
from pathlib import Path

import orjson
import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.load.run import execute
from loadgen.scenario.loader import parse_scenario
from tests.conftest import StartSim
from tests.helpers.browser import browser_fixture, console_errors, keep_screenshots

pytestmark = pytest.mark.browser

browser = pytest.fixture(browser_fixture, name="browser")


OFFLINE = re.compile(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import""")
PAGE = """
    const charts = Array.from(document.querySelectorAll('figure.chart'), f => {
        const box = (f.querySelector('svg') || f.querySelector('canvas') || f).getBoundingClientRect();
        return {title: f.querySelector('figcaption').textContent, live: f.classList.contains('interactive'),
                width: box.width, height: box.height, top: f.getBoundingClientRect().top,
                paths: f.querySelectorAll('svg path').length};
    });
    const first = document.querySelector('table:not(.u-legend)');
    const verdict = document.querySelector('.verdict');
    return {charts, tables: Array.from(document.querySelectorAll('table:not(.u-legend)'), t => t.rows.length),
            verdict: verdict ? verdict.textContent : null,
            verdictTop: verdict ? verdict.getBoundingClientRect().top : null,
            firstTableTop: first ? first.getBoundingClientRect().top : null,
            resources: performance.getEntriesByType('resource').map(e => e.name)};
"""


def open_report(browser, run: Path) -> dict:  # type: ignore[no-untyped-def]
    """The run's report.html, written and opened: what the page shows, checked to have fetched nothing."""
    result = CliRunner().invoke(app, ["report", str(run), "--html"])
    assert result.exit_code == 0, result.output
    page = run / "report.html"
    text = page.read_text()
    # nothing is fetched when it opens: no script, image, style or font from a URL (a server's URL
    # may be named in the text, as the title names the server measured)
    assert OFFLINE.search(text) is None
    assert "<script src" not in text
    browser.get(page.as_uri())
    found = browser.execute_script(PAGE)
    assert found["resources"] == []  # nothing fetched: the file is the whole report
    assert console_errors(browser) == []
    # the answer first: the verdict above the first table
    assert found["verdict"]
    assert found["verdictTop"] < found["firstTableTop"]
    return found


def legend_values(browser, chart: str) -> list[str]:  # type: ignore[no-untyped-def]
    return browser.execute_script(
        "return Array.from(document.querySelectorAll('#' + arguments[0] + ' .u-legend .u-value'),"
        " e => e.textContent)", chart)


def test_html_report_of_a_sweep_renders_offline_and_its_charts_answer_the_mouse(
    start_sim: StartSim, browser, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    sc = parse_scenario({
        "name": "html-sweep",
        "target": {"base_url": start_sim(ttft_ms=20, itl_ms=2)},
        "workload": {"num_prompts": 8, "input_tokens": 32, "output_tokens": 16},
        "load": {"concurrency": [1, 2, 4], "warmup_requests": 0},
        "slo": {"ttft_ms": 200},
    })
    run = tmp_path / "run"
    execute(sc, run)
    found = open_report(browser, run)
    live = [c["title"] for c in found["charts"] if c["live"]]
    assert live[:3] == ["TTFT and E2E latency against throughput", "TPOT and ITL against throughput",
                        "Throughput against the load"]
    assert live[3:6] == ["TTFT by percentile", "TPOT by percentile", "E2E latency by percentile"]
    assert live[6].startswith("Over time")
    assert [c["title"] for c in found["charts"] if not c["live"]] == ["Requests over time"]
    for chart in found["charts"]:
        assert chart["width"] > 300, chart
        assert chart["height"] > 100, chart
        if not chart["live"]:
            assert chart["paths"] > 10, chart
    # the sweep (3 cells + header) and each cell's latency table
    assert 4 in found["tables"]
    assert len(found["tables"]) == 1 + 3

    # hovering the load chart shows the value under the cursor: the legend fills in, and the
    # figures it shows are the run's own (output tok/s of a cell, as summary.json has it)
    summary = orjson.loads((run / "summary.json").read_bytes())
    rates = {round(c["metrics"]["output_throughput"], 1) for c in summary["cells"]}
    over = browser.find_element(By.CSS_SELECTOR, "#chart-load .u-over")
    browser.execute_script("arguments[0].scrollIntoView()", over)
    before = legend_values(browser, "chart-load")
    width = over.size["width"]
    seen = set()
    for fraction in (0.1, 0.3, 0.5, 0.7, 0.9, 0.99):  # across the chart: every cell's point is passed
        ActionChains(browser).move_to_element_with_offset(over, int(width * (fraction - 0.5)), 0).perform()
        values = legend_values(browser, "chart-load")
        seen.update(float(v.split()[0].replace(",", "")) for v in values[1:2] if v not in ("-", "--"))
    assert values != before
    assert seen & rates, (seen, rates)

    # a click on a legend entry hides its series, a second shows it again
    entry = browser.find_elements(By.CSS_SELECTOR, "#chart-load .u-legend .u-series")[1]
    entry.click()
    assert browser.execute_script("return window.loadgenCharts['chart-load'].series[1].show") is False
    entry.click()
    assert browser.execute_script("return window.loadgenCharts['chart-load'].series[1].show") is True

    # dragging across the time chart zooms into that range
    over = browser.find_element(By.CSS_SELECTOR, "#chart-time .u-over")
    browser.execute_script("arguments[0].scrollIntoView()", over)
    span = "const s = window.loadgenCharts['chart-time'].scales.x; return [s.min, s.max];"
    full = browser.execute_script(span)
    w = over.size["width"]
    ActionChains(browser).move_to_element_with_offset(over, -w // 4, 0).click_and_hold() \
        .move_by_offset(w // 4, 0).release().perform()
    zoomed = browser.execute_script(span)
    assert zoomed[1] - zoomed[0] < (full[1] - full[0]) * 0.5, (full, zoomed)
    assert console_errors(browser) == []

    browser.set_window_size(1400, 6000)
    browser.save_screenshot(str(tmp_path / "html-report.png"))
    keep_screenshots(tmp_path)
    assert (tmp_path / "html-report.png").stat().st_size > 50_000


@pytest.mark.alone  # a capacity search against the simulator: the other browser tests beside it moved its answer (19, not 21)
def test_html_report_of_a_capacity_search_leads_with_the_answer(
    start_sim: StartSim, browser, tmp_path: Path,  # type: ignore[no-untyped-def]
) -> None:
    # the simulator serves 24 streams at once, TPOT 10 + 0.5 ms per other stream: 20.25 ms binds at 22
    base_url = start_sim(max_seqs=24, itl_per_seq_us=500)
    sc = parse_scenario({
        "name": "html-capacity", "target": {"base_url": base_url},
        "workload": {"num_prompts": 48, "input_tokens": 32, "output_tokens": 16},
        "load": {"warmup_requests": 0, "search": {"by": "concurrency", "min": 16, "max": 24,
                                                   "slo": {"tpot_ms": {"p99": 20.25}}}},
    })
    run = tmp_path / "run"
    execute(sc, run)
    cap = orjson.loads((run / "summary.json").read_bytes())["capacity"]
    assert cap["max_meeting_slo"] == 21
    found = open_report(browser, run)
    assert f"{cap['max_meeting_slo']:g}" in found["verdict"]
    # the capacity chart leads the charts, the percentile charts drawn live after it
    assert found["charts"][0]["title"] == "Capacity search"
    assert not found["charts"][0]["live"]
    assert "TPOT by percentile" in [c["title"] for c in found["charts"] if c["live"]]
