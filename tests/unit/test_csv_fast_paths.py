"""The CSV fast paths of passes over every row read and write what ``csv`` itself reads and writes."""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from image_tfrecords.rules.base_version import record_key
from image_tfrecords.storage import Storage
from image_tfrecords.storage.csv_blocks import Block, Quoted, Ragged, blocks, distinct, within
from image_tfrecords.storage.documents import RowWriter, csv_writer, dict_rows, first_column, list_rows, row_texts
from image_tfrecords.storage.span_map import SpanMap

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


# -- csv_blocks: tables read as columns --------------------------------------------------------------------
PLAIN_ROWS = [[f"cls{i % 3}/img {i:05d}.jpg", f"cls{i % 3}", str(i * 7919 % 100003),
               hashlib.sha256(b"%d" % i).hexdigest(), "" if i % 5 else "x"] for i in range(500)]


def _table(tmp_path: Path, rows: list[list[str]], name: str = "t.csv") -> str:
    uri = str(tmp_path / name)
    with RowWriter(Storage(), uri, ["filename", "label", "size", "sha256", "note"]) as writer:
        for values in rows:
            writer.write_values(values)
    return uri


@pytest.mark.parametrize("block_bytes", [64, 1000, 8 << 20])
def test_blocks_give_the_columns_csv_reads(tmp_path: Path, block_bytes: int) -> None:
    """Every column of every block, and the integer column, as ``csv`` reads them; rows cut across reads stay whole."""
    uri = _table(tmp_path, PLAIN_ROWS)
    columns: list[list[str]] = [[] for _ in range(5)]
    sizes: list[int] = []
    keys: list[bytes] = []
    with blocks(Storage(), uri, "filename,label,size,sha256,note", block_bytes) as parts:
        for part in parts:
            for j in range(5):
                columns[j] += [value.decode() for value in part.column(j).tolist()]
            sizes += part.integers(2).tolist()
            starts, stops = part.row_slices(0, 3)
            keys += [part.data[a:b] for a, b in zip(starts.tolist(), stops.tolist(), strict=True)]
    with open(uri, newline="") as f:
        rows = list(csv.reader(f))[1:]
    assert [list(row) for row in zip(*columns, strict=True)] == rows
    assert sizes == [int(row[2]) for row in rows]
    assert keys == [",".join(row[:4]).encode() for row in rows]


def test_a_table_that_needs_quotes_or_other_columns_is_read_row_by_row(tmp_path: Path) -> None:
    """A quoted field, a carriage return or a NUL anywhere, or another header: ``Quoted`` before any block."""
    header = "filename,label,size,sha256,note"
    for k, odd in enumerate(["a,comma", 'a "quote"', "cr\ronly", "nul\x00"]):
        uri = _table(tmp_path, [*PLAIN_ROWS[:50], [odd, "b", "1", "f" * 64, ""]], f"odd{k}.csv")
        with pytest.raises(Quoted), blocks(Storage(), uri, header):
            pass
    with pytest.raises(Quoted), blocks(Storage(), _table(tmp_path, PLAIN_ROWS), "filename,label,size,sha256"):
        pass


def test_rows_with_another_count_of_fields_and_bad_integers_are_refused() -> None:
    with pytest.raises(Ragged):
        Block(b"a,b,c\nd,e\n", 3)
    with pytest.raises(Ragged):
        Block(b"a,b,c,d\ne,f\n", 3)  # as many commas in all as two rows of three fields: still refused
    for data in (b"x,\n", b"x,12a\n", b"x,-3\n", b"x,1234567890123456789\n"):
        with pytest.raises(ValueError):
            Block(data, 2).integers(1)
    assert Block(b"x,007\ny,0\n", 2).integers(1).tolist() == [7, 0]


@pytest.mark.parametrize("compiled", [True, False])
def test_a_rows_bytes_are_the_record_key_of_its_fields(tmp_path: Path, compiled: bool) -> None:
    """The join key taken from a row's bytes (a ``SpanMap`` span, the column path) is the one taken from its parsed
    fields (``record_key``, the row path): for plain rows and for rows this package writes with quotes."""
    odd = [[str(v) for v in row] for row in ODD_ROWS if None not in row]
    uri = str(tmp_path / "odd.csv")
    with RowWriter(Storage(), uri, ["x", "y", "z"]) as writer:
        for values in [*odd, ["a", "b", "c"]]:
            writer.write_values(values)
    with list_rows(Storage(), uri) as rows:
        parsed = list(rows.reader)
    with open(uri, newline="", encoding="utf-8") as f:
        f.readline()
        texts = [text.encode() for text in row_texts(f, uri)]
    joined = SpanMap(compiled)
    for number, text in enumerate(texts):
        joined.add(text, np.array([0]), np.array([len(text)]), np.array([number]))
    for number, values in enumerate(parsed):
        assert record_key(values, 3) == texts[number]
        assert joined.get_key(record_key(values, 3)) == number
    assert record_key(["a", "b,c"], 2) != record_key(["a,b", "c"], 2)


def test_hex_prefixes_are_the_first_64_bits_of_each_digest() -> None:
    digests = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(50)]
    block = Block(("\n".join(f"x{i},{d}" for i, d in enumerate(digests)) + "\n").encode(), 2)
    assert block.hex_prefixes(1).tolist() == [int(d[:16], 16) for d in digests]
    for bad in (b"x,0123456789ABCDEF\n", b"x,0123456789abcdeg\n", b"x,0123\n"):
        with pytest.raises(ValueError):
            Block(bad, 2).hex_prefixes(1)


@pytest.mark.parametrize("values, others", [
    (np.array([5, 1, 9, 1, 7], dtype=np.uint64), np.array([9, 3, 1, 9], dtype=np.uint64)),
    (np.array([b"b", b"a", b"dd", b"c"]), np.array([b"dd", b"a", b"zz", b"a"])),
    (np.array([2, 4], dtype=np.int64), np.array([], dtype=np.int64)),
    (np.array([], dtype=np.int64), np.array([3], dtype=np.int64)),
])
def test_distinct_and_within_answer_as_unique_and_isin(values: Any, others: Any) -> None:
    """The column helpers that spare the main process numpy.ma's import give numpy's own answers."""
    assert np.array_equal(distinct(others), np.unique(others))
    assert np.array_equal(within(values, others), np.isin(values, others))
