"""The reference documents' table layouts: RST grid tables with merged cells, Markdown, CSV, JSON.

A ``Table`` is headers plus rows of text. Its first ``group_columns`` columns are grouped: a
value equal to the one above is not repeated (the documents' merged "Model" and "Input
Length" cells). ``merge`` says, per grouped column, whether the border under a repeated value
is left open (``"span"``, a merged cell) or drawn (``"blank"``, a blank cell): the documents
use both. A group also restarts where the next grouping level would repeat a row it already
holds, so a block measured twice shows twice, as in the source.
"""

from __future__ import annotations

import csv
import io
import re
from dataclasses import dataclass
from typing import Literal

import orjson

Merge = Literal["span", "blank"]


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
    """A GitHub pipe table (the cross-engine comparison's layout): repeats blanked, multi-line cells as extra rows."""
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


# a share as the tables show it, "36.8%"
_PERCENT = re.compile(r"^-?\d+(\.\d+)?%$")


def plain(cell: str) -> str | float | None:
    """A cell as data files hold it: a number as a number (a share as its fraction), no figure
    (``-``) as nothing, and text as text."""
    if cell in ("-", ""):
        return None
    if _PERCENT.match(cell):
        return round(float(cell[:-1]) / 100, 6)
    try:
        return float(cell) if any(c in cell for c in ".eE") else int(cell)
    except ValueError:
        return cell


def render_csv(table: Table) -> str:
    """CSV for spreadsheets and scripts: numbers plain, shares as fractions, no figure empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(table.headers)
    writer.writerows([["" if (v := plain(c)) is None else v for c in r] for r in table.rows])
    return buf.getvalue()


def render_json(table: Table) -> str:
    data = {
        "title": table.title,
        "rows": [dict(zip(table.headers, (plain(c) for c in r), strict=True)) for r in table.rows],
        "footnotes": list(table.footnotes),
    }
    return orjson.dumps(data, option=orjson.OPT_INDENT_2).decode()


def render(table: Table, fmt: str) -> str:
    renderers = {"rst": render_rst, "md": render_md, "csv": render_csv, "json": render_json}
    return renderers[fmt](table)
