"""The reference documents' table layouts: RST grid tables with merged cells, Markdown, CSV, JSON.

A ``Table`` is headers plus rows of text. Its first ``group_columns`` columns are grouped: a
value equal to the one above is not repeated (the documents' merged "Model" and "Input
Length" cells). ``merge`` says, per grouped column, whether the border under a repeated value
is left open (``"span"``, a merged cell) or drawn (``"blank"``, a blank cell): the documents
use both. A group also restarts where the next grouping level would repeat a row it already
holds, so a block measured twice shows twice, as in the source.

``parse_grid`` reads an RST grid table back into cells and borders; the reference round-trip
test renders the parsed rows again and compares the two cell for cell.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from typing import Any, Literal

import orjson

Merge = Literal["span", "blank"]
FORMATS: tuple[str, ...] = ("rst", "md", "csv", "json")


@dataclass(frozen=True, slots=True)
class Table:
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    group_columns: int = 0
    # columns that together name a row (the grouping restarts when they repeat within a group)
    key_columns: int = 0
    merge: tuple[Merge, ...] = ()
    title: str = ""
    footnotes: tuple[str, ...] = ()

    def merge_mode(self, column: int) -> Merge:
        return self.merge[column] if column < len(self.merge) else "span"


def continued(table: Table) -> list[list[bool]]:
    """For each row and grouped column: does the row continue the group of the row above?"""
    out: list[list[bool]] = []
    seen: list[set[tuple[str, ...]]] = [set() for _ in range(table.group_columns)]
    key_end = max(table.key_columns, table.group_columns)
    prev: tuple[str, ...] | None = None
    for row in table.rows:
        flags = []
        broken = prev is None
        for c in range(table.group_columns):
            last = c == table.group_columns - 1
            rest = row[c + 1:key_end]
            if not broken and row[c] == prev[c] and not (last and rest in seen[c]):  # type: ignore[index]
                flags.append(True)
            else:
                broken = True
                flags.append(False)
                seen[c] = set()
            seen[c].add(rest)
        out.append(flags)
        prev = row
    return out


def _display_rows(table: Table) -> list[tuple[list[str], list[bool]]]:
    """Each row's shown cells (grouped repeats blanked) and which borders above it stay open."""
    shown = []
    for row, flags in zip(table.rows, continued(table), strict=True):
        cells = [("" if c < len(flags) and flags[c] else v) for c, v in enumerate(row)]
        open_above = [c < len(flags) and flags[c] and table.merge_mode(c) == "span" for c in range(len(row))]
        shown.append((cells, open_above))
    return shown


def _widths(table: Table, widths: tuple[int, ...] | None) -> list[int]:
    if widths is not None:
        return list(widths)
    out = [len(h) for h in table.headers]
    for row in table.rows:
        for c, v in enumerate(row):
            out[c] = max(out[c], *(len(line) for line in v.split("\n")))
    return out


def _grid_line(widths: list[int], fill: str, open_cols: list[bool] | None = None) -> str:
    parts = [(" " if open_cols and open_cols[c] else fill) * (w + 2) for c, w in enumerate(widths)]
    return "+" + "+".join(parts) + "+"


def _grid_cells(cells: list[str], widths: list[int]) -> list[str]:
    lines = [c.split("\n") for c in cells]
    height = max(len(x) for x in lines)
    return [
        "|" + "|".join(f" {(x[i] if i < len(x) else ''):<{w}} " for x, w in zip(lines, widths, strict=True)) + "|"
        for i in range(height)
    ]


def render_rst(table: Table, widths: tuple[int, ...] | None = None) -> str:
    """The RST grid table of the documents, with merged cells and footnotes below."""
    w = _widths(table, widths)
    lines = [_grid_line(w, "-"), *_grid_cells(list(table.headers), w), _grid_line(w, "=")]
    shown = _display_rows(table)
    for i, (cells, _) in enumerate(shown):
        lines += _grid_cells(cells, w)
        below = shown[i + 1][1] if i + 1 < len(shown) else None
        lines.append(_grid_line(w, "-", below))
    if table.footnotes:
        lines += ["", *(f"  * {note}" for note in table.footnotes)]
    return "\n".join(lines)


def render_md(table: Table) -> str:
    """A GitHub pipe table (004's layout): repeats blanked, multi-line cells as extra rows."""
    w = _widths(table, None)
    body: list[list[str]] = []
    for cells, _ in _display_rows(table):
        parts = [c.split("\n") for c in cells]
        for i in range(max(len(p) for p in parts)):
            body.append([p[i] if i < len(p) else "" for p in parts])

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(f"{c:<{x}}" for c, x in zip(cells, w, strict=True)) + " |"

    lines = [line(list(table.headers)), "|" + "|".join(":" + "-" * (x + 1) for x in w) + "|"]
    lines += [line(r) for r in body]
    if table.footnotes:
        lines += ["", *(f"* {note}" for note in table.footnotes)]
    return "\n".join(lines)


def render_csv(table: Table) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(table.headers)
    writer.writerows(table.rows)
    return buf.getvalue()


def render_json(table: Table) -> str:
    data = {
        "title": table.title,
        "rows": [dict(zip(table.headers, r, strict=True)) for r in table.rows],
        "footnotes": list(table.footnotes),
    }
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def render(table: Table, fmt: str) -> str:
    renderers = {"rst": render_rst, "md": render_md, "csv": render_csv, "json": render_json}
    return renderers[fmt](table)


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


def to_rows(table: Table) -> list[dict[str, Any]]:
    return [dict(zip(table.headers, r, strict=True)) for r in table.rows]
