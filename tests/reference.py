"""Access to the reference documents (../shared/reference beside the repository, or $LOADGEN_REFERENCE)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from loadgen.report.tables import ParsedGrid, grid_tables, parse_grid


def reference_dir() -> Path:
    env = os.environ.get("LOADGEN_REFERENCE")
    path = Path(env) if env else Path(__file__).resolve().parents[2] / "shared" / "reference"
    if not path.is_dir():
        pytest.fail(f"reference documents not found at {path}; set LOADGEN_REFERENCE")
    return path


def document(prefix: str) -> str:
    return next(reference_dir().glob(f"{prefix}_*")).read_text(encoding="utf-8")


def speed_tables(prefix: str) -> list[tuple[str, str, ParsedGrid]]:
    """(title line, source text, parsed) of every single-stream table of a document."""
    out = []
    for title, text in grid_tables(document(prefix)):
        parsed = parse_grid(text)
        if "Speed(tokens/s)" in parsed.headers:
            out.append((title, text, parsed))
    return out
