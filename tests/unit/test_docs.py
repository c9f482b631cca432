"""The documentation as a reader meets it: a README that fits on a front page and links only to
pages that exist, a site that ``mkdocs build --strict`` builds, and reference pages written
from the code (every scenario key described where it is declared, every command and option)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from pydantic import BaseModel

from loadgen.cli import app, reference

ROOT = Path(__file__).parents[2]


def test_every_scenario_key_is_described_where_it_is_declared() -> None:
    assert reference.missing_descriptions() == []


def test_a_field_without_a_description_is_found() -> None:
    class Described(BaseModel):
        kept: int = 1
        """What kept does."""
        bare: int = 2

    assert reference.description(Described, "kept") == "What kept does."
    assert reference.description(Described, "bare") is None


@pytest.mark.parametrize("page", sorted(reference.PAGES))
def test_the_reference_pages_are_what_the_code_writes(page: str) -> None:
    committed = (ROOT / "docs" / "reference" / page).read_text()
    assert committed == reference.PAGES[page](), (
        f"docs/reference/{page} is out of date: run `python -m loadgen.cli.reference docs/reference`")


def test_the_command_reference_holds_every_command_and_option() -> None:
    page = reference.cli_page()
    root = typer.main.get_command(app)
    for path, command in reference._commands(root, ["loadgen"])[1:]:
        assert f"## `{' '.join(path)}`" in page
        for param in command.params:
            if param.name != "help" and param.param_type_name == "option":
                assert f"`{param.opts[0]}`" in page, (path, param.opts)
    # by hand: the sim's --itl-ms and its default, the run's --search with its metavar
    assert "| `--itl-ms` ITL_MS | time between tokens, ms | `10` |" in page
    assert "| `--search` BY[:MIN:MAX] |" in page


def test_the_scenario_reference_gives_types_defaults_and_places() -> None:
    page = reference.scenario_page()
    assert ("| `concurrency` | integer or null, or a list of them | `1` | Requests in flight at most: a number, "
            "`unlimited`, or a list (one cell per value). |") in page
    assert "| `connect_s` | number, or null | `10` |" in page
    assert "## `workload.input_dist`\n\nAlso at `workload.output_dist`." in page
    assert "| `schema` | map of text to any, or null | `null` |" in page  # the key as written, not its field name


def test_the_readme_is_a_front_page_whose_links_exist() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).is_file(), link
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        assert f" {page.relative_to(ROOT / 'docs')}" in nav, f"{page} is in no menu of mkdocs.yml"


def test_the_site_builds_strict(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "scenario" / "index.html").is_file()
