"""Console tables that fit the terminal without cutting or folding a number.

A table wider than the terminal is turned on its side, as AIPerf prints its figures: its
columns become rows (``req/s``, ``TTFT p99 ms``, ...) and its rows become columns, as many side by
side as fit, the rest continued below. Only where even one column beside the labels cannot fit
does a figure wrap (``overflow="fold"``): then onto the next line, never cut short or ellipsised.
A line of figures (``completed 32/32 | failed 0 | ...``) breaks between its parts, never inside one.
"""

from __future__ import annotations

from rich.table import Table as RichTable
from rich.text import Text

from loadgen.report.tables import Table

# a rich column's padding (one space each side) and its border on one side
_EDGE = 3


def natural_width(headers: tuple[str, ...], rows: tuple[tuple[str, ...], ...]) -> int:
    """The width a rich table needs to show every cell on one line."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    return sum(w + _EDGE for w in widths) + 1


def to_rich(table: Table, bold_first: bool = False) -> RichTable:
    """The table for the console, untitled (its title goes above it as text: a title wider than
    the table would be wrapped to the table's width)."""
    out = RichTable()
    for i, h in enumerate(table.headers):
        # a terminal too narrow for even this layout wraps a figure onto the next line
        out.add_column(h, justify="left" if i == 0 and bold_first else "right", overflow="fold",
                       style="bold" if i == 0 and bold_first else None)
    for row in table.rows:
        out.add_row(*row)
    return out


def _titled(title: str, table: RichTable) -> list[RichTable | Text]:
    return [Text(title, style="italic"), table] if title else [table]


def fit(table: Table, width: int, bold_first: bool = False) -> list[RichTable | Text]:
    """``table`` as it is where it fits in ``width`` columns; else on its side, in as many parts
    as needed. The first column names the rows (a cell, a latency) and heads the columns after.
    Each part is preceded by its title, which wraps between words."""
    title = table.title.lstrip("- ")
    if not table.rows or natural_width(table.headers, table.rows) <= width:
        return _titled(title, to_rich(table, bold_first=bold_first))
    names = [r[0] for r in table.rows]
    rows = [(h, *(r[j] for r in table.rows)) for j, h in enumerate(table.headers[1:], 1)]
    label = max(len(table.headers[0]), *(len(r[0]) for r in rows))
    column = max(len(v) for v in [*names, *(c for r in rows for c in r[1:])])
    per = (width - 1 - (label + _EDGE)) // (column + _EDGE)
    if per < 1:
        return _titled(title, to_rich(table, bold_first=bold_first))
    parts = -(-len(names) // per)
    per = -(-len(names) // parts)  # parts of even size: 6 cells as 3 and 3, not 5 and 1
    out: list[RichTable | Text] = []
    for start in range(0, len(names), per):
        part = Table(
            (table.headers[0], *names[start:start + per]),
            tuple((r[0], *r[1 + start:1 + start + per]) for r in rows),
        )
        out += _titled(title + (" (continued)" if start else ""), to_rich(part, bold_first=True))
    return out


def wrap_parts(line: str, width: int, sep: str = " | ") -> str:
    """A line of ``sep``-joined parts, broken between parts so that no line exceeds ``width``
    (a part longer than that stands alone on its line)."""
    lines: list[str] = []
    for part in line.split(sep):
        if lines and len(lines[-1]) + len(sep) + len(part) <= width:
            lines[-1] += sep + part
        else:
            lines.append(part)
    return "\n".join(lines)


def fit_text(table: Table, width: int) -> list[RichTable | Text]:
    """A table of text (names, commands, paths) as a table where it fits; else each row as a
    block: its first column as a heading, then one ``column: value`` line per other column,
    wrapped between words, so that what users must type is never broken inside a word."""
    title = table.title.lstrip("- ")
    if natural_width(table.headers, table.rows) <= width:
        return _titled(title, to_rich(table))
    out: list[RichTable | Text] = [Text(title, style="italic")] if title else []
    for row in table.rows:
        out.append(Text(row[0], style="bold"))
        for header, value in zip(table.headers[1:], row[1:], strict=True):
            line = Text(f"  {header}: ", style="dim")
            line.append(value)
            out.append(line)
    return out
