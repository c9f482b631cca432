"""A capacity answer resting on probes whose client or engine was starved says it is not sure
(the frozen run directory's search: probes at 1, 2, 4, 8, 6 and 5)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loadgen.report.capacity import answer_lines
from loadgen.report.headline import verdict
from loadgen.results.enginecores import EngineCores
from loadgen.results.rundir import rebuild_summary

ROOT = Path(__file__).parents[3]


def test_an_answer_from_starved_probes_is_not_presented_as_sure() -> None:
    summary = rebuild_summary(ROOT / "tests" / "data" / "rundir-v2")
    quiet = answer_lines(summary)
    assert not any("not sure" in line for line in quiet)
    cells = list(summary.cells)
    client = cells[2].client
    assert client is not None
    cells[2] = replace(cells[2], client=replace(client, verdict="starved"))  # the probe at 4
    cells[5] = replace(cells[5], engine_cores=EngineCores((0,), 0.4, 0.5, (), True))  # the probe at 5
    hogged = replace(summary, cells=tuple(cells))
    lines = answer_lines(hogged)
    assert lines[:2] == quiet
    assert lines[2] == ("not sure: 2 of its 6 probes (at 4, 5) ran with the client or the engine starved by other "
                        "programs (their self-check): their figures hold that delay, and a quiet machine may "
                        "answer otherwise")
    assert verdict(hogged)[2] == lines[2]  # report.md's and report.html's headline


def test_a_cells_warning_in_the_console_fits_the_terminal() -> None:
    """A long warning at 80 columns: broken between words, every line within 80, no word lost."""
    from loadgen.report.summary import console_tables

    summary = rebuild_summary(ROOT / "tests" / "data" / "rundir-v2")
    said = ("the engine was starved: other programs took 66% of its core 0 (python (pid 3048) 27% of a core, "
            "python (pid 3039) 7% of a core); its latencies are not the engine's alone: stop them, or give the "
            "engine other cores")
    cells = list(summary.cells)
    cells[0] = replace(cells[0], probe=None, warnings=(said,))
    texts = [t for t in console_tables(replace(summary, cells=tuple(cells)), 80) if isinstance(t, str)]
    (warning,) = [t for t in texts if t.startswith("warning: the engine was starved")]
    assert all(len(line) <= 80 for line in warning.splitlines())
    assert len(warning.splitlines()) == 3
    assert " ".join(warning.split()) == f"warning: {said}"
