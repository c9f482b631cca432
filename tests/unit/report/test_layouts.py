"""Reference round trip: the documents' tables parsed into rows and rendered back, cell for cell."""

from __future__ import annotations

import pytest

from loadgen.report.layouts import (
    CompareRow,
    SpeedRow,
    ThroughputRow,
    compare_table,
    setting_footnote,
    single_stream_table,
    throughput_table,
)
from loadgen.report.tables import Table, render_md, render_rst
from tests.helpers.reference import document, grid_tables, parse_grid, speed_tables


def _speed_rows(parsed, extra: str | None) -> list[SpeedRow]:
    h = list(parsed.headers)
    rows = []
    for r in parsed.filled_rows(2):
        mem = r[h.index("GPU Memory(GB)")] if "GPU Memory(GB)" in h else None
        setting = None
        note = ""
        if extra == "Setting":
            text = r[h.index("Setting")]
            setting = None if text == "-" else text.strip("[]").removeprefix("Setting ")
        elif extra == "Note":
            note = r[h.index("Note")]
        rows.append(SpeedRow(
            model=r[0], input_length=int(r[1]), quantization=r[2], gpu_num=r[3],
            speed=float(r[h.index("Speed(tokens/s)")]), memory_gib=None if mem is None else float(mem),
            note=note, setting=setting,
        ))
    return rows


CASES = [(doc, i) for doc in ("000", "001") for i in range(len(speed_tables(doc)))]


@pytest.mark.parametrize(("doc", "index"), CASES, ids=[f"{d}-{i}" for d, i in CASES])
def test_single_stream_tables_round_trip_cell_for_cell(doc: str, index: int) -> None:
    title, text, source = speed_tables(doc)[index]
    extra = source.headers[-1] if source.headers[-1] in ("Note", "Setting") else None
    table = single_stream_table(
        _speed_rows(source, extra), memory="GPU Memory(GB)" in source.headers, extra=extra,
    )
    # the documents draw some repeated values as blank cells with a border, others as merged cells
    table = Table(table.headers, table.rows, table.group_columns, table.key_columns, source.merge_modes(2))
    rendered = parse_grid(render_rst(table))
    assert rendered.headers == source.headers
    assert rendered.cells == source.cells, title
    assert rendered.open_borders == source.open_borders, title


def test_the_documents_own_column_widths_give_the_source_bytes() -> None:
    title, text, source = speed_tables("000")[0]
    table = single_stream_table(_speed_rows(source, None), memory=True, extra=None)
    assert render_rst(table, source.widths) == text


def test_the_throughput_table_round_trips() -> None:
    [(title, text)] = [(t, x) for t, x in grid_tables(document("000")) if "QPS" in x]
    source = parse_grid(text)
    rows = [ThroughputRow(r[0], r[1], int(r[2]), float(r[3]), float(r[4])) for r in source.cells]
    table = throughput_table(rows, output=False)
    rendered = parse_grid(render_rst(table))
    assert (rendered.headers, rendered.cells, rendered.open_borders) == (
        source.headers, source.cells, source.open_borders
    )
    assert render_rst(table, source.widths) == text


def test_settings_footnotes_match_the_documents() -> None:
    text = document("000")
    for name in ("default", "1", "2", "3"):
        assert f"  * {setting_footnote(name)}\n" in text


def test_merging_restarts_where_a_block_repeats() -> None:
    rows = [SpeedRow("M", 1, q, "1", 1.0) for q in ("A", "B")] + [SpeedRow("M", 1, q, "1", 2.0) for q in ("A", "B")]
    out = render_rst(single_stream_table(rows, memory=False, extra=None)).splitlines()
    # the second A/B block shows its input length again, under a closed border
    assert out[3:10] == [
        "| M     | 1            | A            | 1       | 1.00            |",
        "+       +              +--------------+---------+-----------------+",
        "|       |              | B            | 1       | 1.00            |",
        "+       +--------------+--------------+---------+-----------------+",
        "|       | 1            | A            | 1       | 2.00            |",
        "+       +              +--------------+---------+-----------------+",
        "|       |              | B            | 1       | 2.00            |",
    ]


def test_compare_table_speed_x_and_memory_percent_against_the_baseline() -> None:
    # 004's first two rows: FP32 1.48 tok/s 47677 MiB (baseline), BF16 3.88 tok/s 46211 MiB
    rows = [CompareRow("HF Transformers", ("FP32",), 1.48, 47677.0), CompareRow("HF Transformers", ("BF16",), 3.88, 46211.0)]
    table = compare_table(rows, 0)
    assert table.rows[0][1:6] == ("Baseline (FP32)", "1.48", "47677.0", "1.00", "100.0")
    # 3.88 / 1.48 = 2.6216...; 46211 / 47677 = 96.925...%
    assert table.rows[1][1:6] == ("BF16", "3.88", "46211.0", "2.62", "96.9")
    md = render_md(table).splitlines()
    assert md[0].startswith("| Software        | Settings        | Avg Tok/s | Max Mem | Speed X | Max mem % |")
    assert md[1].startswith("|:----------------|:----------------|")
