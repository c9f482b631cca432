"""``loadgen report RUN --html`` opened in headless Chromium: one file, every chart and table
rendered, nothing fetched from anywhere, no error in the page's console."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from loadgen.cli import app
from loadgen.load.run import execute
from loadgen.scenario.loader import parse_scenario
from tests.browser import browser_fixture, console_errors, keep_screenshots
from tests.conftest import StartSim

browser = pytest.fixture(browser_fixture, name="browser")


def test_html_report_of_a_sweep_renders_offline(start_sim: StartSim, browser, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    sc = parse_scenario({
        "name": "html-sweep",
        "target": {"base_url": start_sim(ttft_ms=20, itl_ms=2)},
        "workload": {"num_prompts": 8, "input_tokens": 32, "output_tokens": 16},
        "load": {"concurrency": [1, 2, 4], "warmup_requests": 0},
        "slo": {"ttft_ms": 200},
    })
    run = tmp_path / "run"
    execute(sc, run)
    result = CliRunner().invoke(app, ["report", str(run), "--html"])
    assert result.exit_code == 0, result.output
    page = run / "report.html"
    text = page.read_text()
    # nothing is fetched when it opens: no script, image, style or font from a URL (a server's URL
    # may be named in the text, as the title names the server measured)
    assert re.search(r"""(src|href)\s*=\s*["']?(https?:)?//|url\(\s*["']?(https?:)?//|@import""", text) is None
    assert "<script src" not in text
    browser.get(page.as_uri())
    found = browser.execute_script("""
        const charts = Array.from(document.querySelectorAll('figure.chart'), f => {
            const svg = f.querySelector('svg'); const box = svg ? svg.getBoundingClientRect() : null;
            return {title: f.querySelector('figcaption').textContent, width: box ? box.width : 0,
                    height: box ? box.height : 0, paths: svg ? svg.querySelectorAll('path').length : 0};
        });
        return {charts, tables: Array.from(document.querySelectorAll('table'), t => t.rows.length),
                resources: performance.getEntriesByType('resource').map(e => e.name)};
    """)
    titles = [c["title"] for c in found["charts"]]
    assert titles == ["Latency against throughput", "Throughput against the load", "Latency distributions",
                      "Requests over time"]
    for chart in found["charts"]:
        assert chart["width"] > 300, chart
        assert chart["height"] > 100, chart
        assert chart["paths"] > 10, chart
    # the sweep (3 cells + header) and each cell's latency table
    assert 4 in found["tables"]
    assert len(found["tables"]) == 1 + 3
    assert found["resources"] == []  # nothing fetched: the file is the whole report
    assert console_errors(browser) == []
    browser.set_window_size(1400, 6000)
    browser.save_screenshot(str(tmp_path / "html-report.png"))
    keep_screenshots(tmp_path)
    assert (tmp_path / "html-report.png").stat().st_size > 50_000
