"""This package's CSV tables: what its writers write, ``storage.documents``' small-table readers and
``storage.tables`` (polars) read and write, is what ``csv`` itself reads and writes, for any value."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.errors import BuildError
from image_tfrecords.storage import Storage
from image_tfrecords.storage.documents import RowWriter, csv_writer, dict_rows, first_column
from image_tfrecords.storage.tables import lines_text, read_table, row_ends, table_lines, table_rows, table_text

ODD_ROWS: list[list[Any]] = [
    ["plain", "row", "3"],
    ["a,comma", "b", "c"],
    ['a "quote"', "b", ""],
    ["line\nfeed", "cr\ronly", "crlf\r\nboth"],
    ["", "", ""],
    [" spaces ", "\t", "\x1f"],
    ["caf\u00e9", "\u2028", "\x00"],
    [1, 2.5, True],
    [None, "none", 0],
    ['"', ",", '""'],
]


def test_row_writer_writes_what_csv_writer_writes(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.csv")
    with RowWriter(Storage(), uri, ["x", "y", "z"]) as writer:
        for values in ODD_ROWS:
            writer.write_values(values)
    expected = io.StringIO()
    reference = csv_writer(expected)
    reference.writerow(["x", "y", "z"])
    reference.writerows(ODD_ROWS)
    assert Path(uri).read_bytes() == expected.getvalue().encode()
    assert writer.count == len(ODD_ROWS)


def test_a_one_column_row_of_nothing_stays_a_row(tmp_path: Path) -> None:
    uri = str(tmp_path / "one.csv")
    with RowWriter(Storage(), uri, ["only"]) as writer:
        writer.write_values([""])
        writer.write_values(["x"])
    assert dict_rows(Path(uri).read_bytes(), "one.csv") == [{"only": ""}, {"only": "x"}]


def test_a_table_cut_inside_quotes_or_ragged_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cut\.csv is not a table"):
        dict_rows(b'x,y\n1,"open\nnever closed\n', "cut.csv")
    with pytest.raises(ValueError, match=r"cut\.csv is not a table"):
        first_column(b'x,y\n"open\nnever closed\n', "cut.csv", "x")
    with pytest.raises(ValueError, match="another count of fields"):
        dict_rows(b"x,y\n1,2,3\n", "ragged.csv")
    with pytest.raises(BuildError, match=r"ragged\.csv is not a table"):
        read_table(Storage(), "ragged.csv", b"x,y\n1,2,3\n")
    with pytest.raises(BuildError, match=r"empty\.csv is empty"):
        read_table(Storage(), "empty.csv", b"")


def test_tables_read_what_csv_reads_and_write_it_back_byte_for_byte(tmp_path: Path) -> None:
    """Every column read as text, an empty field as null, and written back as this package's writers write it:
    the same bytes, whatever the values hold (comma, quote, LF, CR, CRLF, U+2028, NUL, spaces)."""
    uri = tmp_path / "t.csv"
    with RowWriter(Storage(), str(uri), ["x", "y", "z"]) as writer:
        for values in ODD_ROWS:
            writer.write_values(values)
    data = uri.read_bytes()
    table = read_table(Storage(), str(uri))
    expected = list(csv.reader(io.StringIO(data.decode(), newline="")))
    assert [table.columns, *([value or "" for value in row] for row in table.iter_rows())] == expected
    assert table_text(table) == data


@pytest.mark.parametrize("rows", [ODD_ROWS, ODD_ROWS[:1] + ODD_ROWS[4:6], []], ids=["line breaks", "none", "empty"])
def test_a_table_cut_at_its_row_ends_gives_each_row(rows: list[list[Any]]) -> None:
    """``table_rows``: the rows as ``table_text`` writes them, and where each begins and ends: every slice is that
    row alone, as ``csv`` reads it, however many lines its quoted fields span (plan cuts the members this way)."""
    from image_tfrecords.storage.tables import polars

    pl = polars()
    frame = pl.DataFrame([["" if v is None else str(v) for v in row] for row in rows] or None,
                         schema=dict.fromkeys("xyz", pl.String), orient="row")
    text, begins, ends = table_rows(frame)
    assert text == table_text(frame, header=False)
    assert len(begins) == len(ends) == len(rows)
    assert begins.tolist() == [0, *ends[:-1].tolist()][:len(rows)] and (not rows or ends[-1] == len(text))
    for i, row in enumerate(frame.iter_rows()):
        cut = text[int(begins[i]):int(ends[i])].decode()
        assert list(csv.reader(io.StringIO(cut, newline=""))) == [[value or "" for value in row]], cut


@pytest.mark.parametrize("block", [1, 3, 1 << 18])
def test_a_table_as_lines_gives_each_row_as_written(block: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """``table_lines``: the header and each row's text as ``csv`` cuts it (a quoted field's line breaks, quotes
    and commas inside its row), whatever block ``row_ends`` scans at a time; ``lines_text`` puts rows (a gathered
    subset, in any order) back together byte for byte."""
    from image_tfrecords.storage import tables

    monkeypatch.setattr(tables, "ROW_SCAN_BLOCK", block)
    pl = tables.polars()
    frame = pl.DataFrame([["" if v is None else str(v) for v in row] for row in ODD_ROWS],
                         schema=dict.fromkeys("xyz", pl.String), orient="row")
    data = table_text(frame)
    header, lines = table_lines("t.csv", data)
    assert header == b"x,y,z\n" and len(lines) == frame.height
    for line, row in zip(lines.to_list(), frame.iter_rows(), strict=True):
        assert list(csv.reader(io.StringIO(line, newline=""))) == [[value or "" for value in row]], line
    assert header + bytes(lines_text(lines)) == data
    order = [5, 3, 0, 9]
    assert bytes(lines_text(lines.gather(order))) == b"".join(lines[i].encode() for i in order)
    assert row_ends(data).tolist() == [len(header)] + [len(header) + len(b"".join(
        line.encode() for line in lines.to_list()[:i + 1])) for i in range(len(lines))]
    assert table_lines("t.csv", b"x,y\n")[1].is_empty() and bytes(lines_text(lines.clear())) == b""


@pytest.mark.parametrize("data", [b"", b"x,y\n1,2", b"x,y\n\xff\xfe,2\n"], ids=["empty", "no line end", "not utf-8"])
def test_a_damaged_table_as_lines_is_a_build_error(data: bytes) -> None:
    with pytest.raises(BuildError, match=r"t\.csv is not a table this package wrote"):
        table_lines("t.csv", data)


def test_first_column_and_rows_from_a_start_read_what_csv_reads(tmp_path: Path) -> None:
    """A members table's names (``first_column``) and its rows from the kept ones on (``dict_rows(start=)``), for
    names that need quotes: the same values ``csv.DictReader`` gives."""
    uri = str(tmp_path / "t.csv")
    with RowWriter(Storage(), uri, ["filename", "y", "z"]) as writer:
        for values in ODD_ROWS:
            writer.write_values(values)
    data = Path(uri).read_bytes()
    expected = list(csv.DictReader(io.StringIO(data.decode(), newline="")))
    assert first_column(data, "t.csv", "filename") == [row["filename"] for row in expected]
    for start in (0, 3, len(ODD_ROWS) - 1, len(ODD_ROWS), len(ODD_ROWS) + 2):
        assert dict_rows(data, "t.csv", start) == expected[start:]
    with pytest.raises(ValueError, match="expected 'name' first"):
        first_column(data, "t.csv", "name")


SIGINT_WAIT = """
import os, signal, subprocess, sys, threading, time
class Stop(Exception): pass
def stop(*_): raise Stop()
signal.signal(signal.SIGINT, stop)
from image_tfrecords.storage.tables import polars
polars()
import polars as pl  # a later plain import changes nothing more
pl.DataFrame({"a": list(range(1000))}).sort("a")
woken = threading.Event()
threading.Thread(target=lambda: (time.sleep(10), woken.set()), daemon=True).start()
subprocess.Popen(["sh", "-c", f"sleep 0.3; kill -INT {os.getpid()}"])
started = time.monotonic()
try:
    woken.wait()
    print("not interrupted")
except Stop:
    print(f"interrupted after {time.monotonic() - started:.2f}")
"""


def test_ctrl_c_still_interrupts_a_wait_once_polars_is_imported() -> None:
    """polars' import installs a SIGINT handler that restarts interrupted system calls: ``tables.polars()`` makes
    them interruptible again, so a build waiting on its pool stops at Ctrl-C at once, not when the wait ends."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", SIGINT_WAIT], capture_output=True, text=True, timeout=60)
    assert result.stdout.startswith("interrupted after "), (result.stdout, result.stderr)
    assert float(result.stdout.split()[-1]) < 2.0, result.stdout


def test_rows_of_two_tables_merge_in_listing_order_once_each() -> None:
    """``inspect._merged``: rows of two texts put in listing order (runs of consecutive rows copied whole), and
    nothing when a number is missing, given twice or out of range."""
    import numpy as np

    from image_tfrecords.stages.inspect import _merged

    base, new = b"a\nb\nc\nd\n", b"X\nY\n"
    ends = lambda text: np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == 10) + 1  # noqa: E731
    parts = [(base, np.array([0, 1, 4, 5]), np.array([0, 2, 4, 6]), ends(base)),
             (new, np.array([2, 3]), np.array([0, 2]), ends(new))]
    assert _merged(6, parts) == b"a\nb\nX\nY\nc\nd\n"
    assert _merged(0, [(b"", np.array([], dtype=np.int64), np.array([]), np.array([]))]) == b""
    for numbers in ([0, 1, 4, 4], [0, 1, 4, 6], [-1, 1, 4, 5]):  # one twice (and one missing), out of range
        assert _merged(6, [(base, np.array(numbers), *parts[0][2:]), parts[1]]) is None
    assert _merged(7, parts) is None  # a file neither read nor taken over
