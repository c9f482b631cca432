"""The serving commands of the README and the guides in ``docs/``, verbatim, as a user on a machine without GPUs runs them: the
catalogue and the engines listed, every ``--dry-run``, ``--script`` and ``--print-argv`` printed
(exit 0), and every launch on named GPUs refused in one line that says how to get the launch for
a GPU host (exit 3). The launches that run here (``loadgen serve tiny``...) are the engines
tier's; the quick start's commands are ``test_quick_start_as_the_readme_runs_it``'s."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def readme_commands() -> list[tuple[str, str]]:
    """Each ``loadgen serve|models|engines`` line of the pages' code blocks, without its comment,
    with where it is (``docs/guides/engines.md:12``)."""
    out = []
    for page in PAGES:
        inside = False
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if line.startswith("```"):
                inside = not inside
            elif inside and re.match(r"loadgen (serve|models|engines)(\s|$)", text := line.strip()):
                out.append((f"{page.relative_to(ROOT)}:{n}", text.split("  #")[0].strip()))
    return out


PRINTS = ("--dry-run", "--script", "--print-argv")
COMMANDS = [(n, c) for n, c in readme_commands()
            if not c.startswith("loadgen serve") or any(f in c for f in PRINTS) or "--gpus" in c]


def run(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    # ``loadgen`` as the user types it, whichever Python runs the tests
    shell = f'loadgen() {{ "{sys.executable}" -m loadgen "$@"; }}; {command}'
    return subprocess.run(["bash", "-c", shell], cwd=cwd, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, check=False)


def test_the_readme_shows_the_commands_this_runs() -> None:
    assert len(COMMANDS) >= 12
    assert any("--gpus" in c and not any(f in c for f in PRINTS) for _, c in COMMANDS)


@pytest.mark.parametrize(("line", "command"), COMMANDS, ids=[where for where, _ in COMMANDS])
def test_a_readme_serving_command_runs_as_written(line: str, command: str, tmp_path: Path) -> None:
    (tmp_path / "servers").mkdir()  # where the README's script goes
    proc = run(command, tmp_path)
    assert "Traceback" not in proc.stderr, proc.stderr
    if not command.startswith("loadgen serve") or any(f in command for f in PRINTS):
        assert proc.returncode == 0, f"{line}: {proc.stderr[-1500:]}"
        if "--script >" in command:
            script = tmp_path / command.rsplit("> ", 1)[1]
            assert script.read_text().startswith("#!/usr/bin/env bash")
            assert subprocess.run(["bash", "-n", str(script)], check=False).returncode == 0
        return
    if shutil.which("nvidia-smi") is not None:
        pytest.skip("a machine with GPUs launches it")
    assert proc.returncode == 3, f"{line}: {proc.stderr[-1500:]}"
    errors = [x for x in proc.stderr.splitlines() if x.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert "this engine needs GPUs: `loadgen serve ... --script` (or `--dry-run`) prints the launch" in errors[0]
