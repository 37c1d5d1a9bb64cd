"""The CSV fast paths of passes over every row read and write what ``csv`` itself reads and writes."""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.storage import Storage
from image_tfrecords.storage.documents import RowWriter, csv_writer, dict_rows, first_column, list_rows

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
    with list_rows(Storage(), uri) as rows:
        assert rows.fieldnames == ["only"] and list(rows.reader) == [[""], ["x"]]


@pytest.mark.parametrize("eol", ["\n", "\r\n"])
def test_list_rows_reads_what_csv_reads(tmp_path: Path, eol: str) -> None:
    text = io.StringIO()
    writer = csv.writer(text, lineterminator=eol)
    writer.writerow(["x", "y", "z"])
    writer.writerows(ODD_ROWS)
    uri = tmp_path / "t.csv"
    uri.write_bytes(text.getvalue().encode())
    with open(uri, newline="", encoding="utf-8") as f:
        expected = list(csv.reader(f))
    with list_rows(Storage(), str(uri)) as rows:
        got = [rows.fieldnames, *rows.reader]
    if eol == "\r\n":  # list_rows is for this package's tables, which end rows in \n alone
        got = [[*row[:-1], row[-1].removesuffix("\r")] for row in got]
    assert got == expected


def test_list_rows_refuses_a_table_cut_inside_quotes(tmp_path: Path) -> None:
    uri = tmp_path / "cut.csv"
    uri.write_text('x,y\n1,"open\nnever closed\n')
    with list_rows(Storage(), str(uri)) as rows, pytest.raises(ValueError, match="inside a quoted field"):
        list(rows.reader)


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
