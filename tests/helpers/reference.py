"""The reference documents, copied into tests/data/reference so that a clone tests on its own,
and a reader of their RST grid tables: the round-trip tests render the parsed rows again with
loadgen's renderer and compare the two cell for cell."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from loadgen.report.tables import Merge

REFERENCE = Path(__file__).resolve().parents[1] / "data" / "reference"


def document(prefix: str) -> str:
    return next(REFERENCE.glob(f"{prefix}_*")).read_text(encoding="utf-8")


def speed_tables(prefix: str) -> list[tuple[str, str, ParsedGrid]]:
    """(title line, source text, parsed) of every single-stream table of a document."""
    out = []
    for title, text in grid_tables(document(prefix)):
        parsed = parse_grid(text)
        if "Speed(tokens/s)" in parsed.headers:
            out.append((title, text, parsed))
    return out


@dataclass(frozen=True, slots=True)
class ParsedGrid:
    """An RST grid table as drawn: cell texts (stripped; merged or blank cells are ``""``) and,
    for each border between body rows, which columns it leaves open."""

    headers: tuple[str, ...]
    cells: tuple[tuple[str, ...], ...]
    open_borders: tuple[tuple[bool, ...], ...]
    widths: tuple[int, ...] = field(default=())

    def filled_rows(self, group_columns: int) -> list[tuple[str, ...]]:
        """Body rows with each blank grouped cell given the value above it."""
        out: list[tuple[str, ...]] = []
        for row in self.cells:
            filled = list(row)
            for c in range(group_columns):
                if filled[c] == "" and out:
                    filled[c] = out[-1][c]
            out.append(tuple(filled))
        return out

    def group_columns(self) -> int:
        """The leading columns in which some body cell is blank (a merged or blanked repeat)."""
        n = 0
        while n < len(self.headers) and self.cells and self.cells[0][n] and any(r[n] == "" for r in self.cells):
            n += 1
        return n

    def merge_modes(self, group_columns: int) -> tuple[Merge, ...]:
        """Per grouped column: ``span`` if any border under a repeat is open, else ``blank``."""
        return tuple(
            "span" if any(b[c] for b in self.open_borders) else "blank" for c in range(group_columns)
        )


def _split_row(line: str, cuts: list[int]) -> list[str]:
    return [line[a + 1:b] for a, b in zip(cuts, cuts[1:], strict=False)]


def parse_grid(text: str) -> ParsedGrid:
    """Read one RST grid table (lines starting with ``+`` or ``|``)."""
    lines = [ln.rstrip() for ln in text.strip("\n").splitlines()]
    cuts = [i for i, ch in enumerate(lines[0]) if ch == "+"]
    headers: list[str] | None = None
    rows: list[list[str]] = []
    borders: list[tuple[bool, ...]] = []
    pending: list[list[str]] = []
    for line in lines[1:]:
        if line.startswith("|"):
            pending.append(_split_row(line.ljust(cuts[-1] + 1), cuts))
            continue
        cells = ["\n".join(p[c].strip() for p in pending).strip("\n") for c in range(len(cuts) - 1)]
        pending = []
        segs = _split_row(line, cuts)
        if "=" in line:
            headers = cells
            continue
        rows.append(cells)
        borders.append(tuple(s.strip() == "" for s in segs))
    if headers is None:
        raise ValueError("not a grid table with a header row (no '+===+' line)")
    widths = tuple(b - a - 3 for a, b in zip(cuts, cuts[1:], strict=False))
    return ParsedGrid(tuple(headers), tuple(tuple(r) for r in rows), tuple(borders[:-1]), widths)


def grid_tables(text: str) -> list[tuple[str, str]]:
    """Every RST grid table in a document, each with the text of the nearest line above it."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("+-"):
            j = i
            while j < len(lines) and lines[j][:1] in ("+", "|"):
                j += 1
            above = next((ln.strip() for ln in reversed(lines[:i]) if ln.strip()), "")
            out.append((above, "\n".join(lines[i:j])))
            i = j
        else:
            i += 1
    return out
