"""What users read speaks of loadgen and of what was measured: no internal document numbers
(the reference tables are named for what they are: the single-stream speed table, the
throughput table, the quantization comparison, the cross-engine comparison) and no talk of how
the project is built."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# "004's table", "document 003", "(002)", "issue 22", "task 7", "see 001_..."
INTERNAL = re.compile(
    r"(?<![\d,.:])\b00\d\b(?![.,]\d)|\b\d{3}_[0-9a-f]{8,}|\bdocument \d+|\b(?:issue|task|ticket) #?\d+", re.IGNORECASE
)


def user_strings(path: Path) -> list[tuple[int, str]]:
    """Every string literal of a module (help, errors, docstrings, messages) with its line."""
    tree = ast.parse(path.read_text(), str(path))
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def texts() -> list[tuple[str, str]]:
    out = []
    for path in sorted((ROOT / "loadgen").rglob("*.py")):
        out += [(f"{path.relative_to(ROOT)}:{line}", text) for line, text in user_strings(path)]
    for pattern in ("README.md", "CONTRIBUTING.md", "docs/**/*.md", "mkdocs.yml", "scenarios/*.yaml", "servers/*", "loadgen/**/*.js", "loadgen/**/*.yaml"):
        for path in sorted(ROOT.glob(pattern)):
            if path.is_file() and "vendor" not in path.parts:  # a vendored library is its authors' text
                out += [(f"{path.relative_to(ROOT)}:{n}", line)
                        for n, line in enumerate(path.read_text().splitlines(), 1)]
    return out


def test_the_check_finds_what_it_looks_for() -> None:
    for bad in ("Speed X, Max mem % (004's table)", "as in document 003", "see issue 22", "000_64b012858e65f33d.txt"):
        assert INTERNAL.search(bad), bad
    for fine in ("0.004 s", "port 8000", "p99.9", "HTTP 404", "1,000 requests", "max_tokens 256"):
        assert not INTERNAL.search(fine), fine


def test_no_internal_document_numbers_in_user_text() -> None:
    found = [f"{where}: {text.strip()[:100]}" for where, text in texts() if INTERNAL.search(text)]
    assert found == []
    assert len(texts()) > 2000  # the walk reads the package, the README and the scenarios
