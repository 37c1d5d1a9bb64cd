"""CSV tables and JSON documents in a store, streamed: never held whole in memory."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from . import Storage, is_s3


@contextmanager
def read_rows(storage: Storage, uri: str, errors: str = "strict") -> Iterator[csv.DictReader[str]]:
    """Yield a DictReader of the CSV at ``uri`` (S3 objects are spooled to disk)."""
    if is_s3(uri):
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "rows.csv")
            storage.download(uri, path)
            with open(path, newline="", encoding="utf-8-sig", errors=errors) as f:
                yield csv.DictReader(f)
    else:
        with open(uri, newline="", encoding="utf-8-sig", errors=errors) as f:
            yield csv.DictReader(f)


class ListRows:
    """A table's ``fieldnames`` and ``reader`` (each row as a list of its values), as ``csv.DictReader``
    gives them, made for the tables this package writes (``RowWriter``): a row without a quote is split at
    its commas, and only a row with one is parsed by ``csv``. Several times faster over a wide table."""

    def __init__(self, header: str, texts: Iterator[str]) -> None:
        self.fieldnames: list[str] = next(csv.reader([header])) if header else []
        self.reader = self._values(texts)

    @staticmethod
    def _values(texts: Iterator[str]) -> Iterator[list[str]]:
        parse = csv.reader
        for text in texts:
            yield text.split(",") if '"' not in text else next(parse([text]))


@contextmanager
def list_rows(storage: Storage, uri: str) -> Iterator[ListRows]:
    """The rows of a table this package wrote, as lists (``ListRows``): for passes over every image."""
    with raw_rows(storage, uri) as (header, texts):
        yield ListRows(header, texts)


@contextmanager
def raw_rows(storage: Storage, uri: str) -> Iterator[tuple[str, Iterator[str]]]:
    """The header line and each row of the CSV table at ``uri`` as its text, without the line end (S3
    objects are spooled to disk): a row goes on over line ends while its quotes are open. For passes that
    copy rows on, or extend them, without parsing every field (see ``csv_field``, ``field_end``)."""
    with ExitStack() as stack:
        path = uri
        if is_s3(uri):
            path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "rows.csv")
            storage.download(uri, path)
        f = stack.enter_context(open(path, newline="", encoding="utf-8", errors="surrogateescape"))
        header = f.readline().lstrip("\ufeff").rstrip("\n")

        yield header, row_texts(f, uri)


def row_texts(lines: Iterable[str], name: str) -> Iterator[str]:
    """Each row's text, without its line end, of CSV ``lines`` (read with ``newline=""``): a row goes on over
    line ends while its quotes are open. ``name`` says which table ends inside a quoted field."""
    lines = iter(lines)
    for line in lines:
        if '"' in line:
            while line.count('"') % 2:  # a quoted field goes on: a \r or \n inside it
                more = next(lines, None)
                if more is None:
                    raise ValueError(f"{name} ends inside a quoted field")
                line += more
        yield line[:-1] if line[-1:] == "\n" else line


def dict_rows(data: bytes, name: str, start: int = 0) -> list[dict[str, str]]:
    """The rows of a small table this package wrote (``data``, whole), as dicts: ``csv.DictReader``'s
    answer at a fraction of its cost (see ``ListRows``); from row ``start`` on (the ones before are not parsed)."""
    lines = io.StringIO(data.decode("utf-8-sig"), newline="")
    header = lines.readline().rstrip("\n")
    texts = row_texts(lines, name)
    for _ in itertools.islice(texts, start):
        pass
    rows = ListRows(header, texts)
    return [dict(zip(rows.fieldnames, values, strict=True)) for values in rows.reader]


def first_column(data: bytes, name: str, column: str) -> list[str]:
    """The values of the first column (``column``, checked against the header) of a small table this package
    wrote, in order, without splitting the rest of each row: for passes that only need its keys."""
    lines = io.StringIO(data.decode("utf-8-sig"), newline="")
    header = lines.readline().rstrip("\n")
    if header.split(",", 1)[0] != column:
        raise ValueError(f"{name} has columns {header!r}, expected {column!r} first")
    values = []
    for text in row_texts(lines, name):
        field = text[:field_end(text)]
        values.append(next(csv.reader([field]))[0] if field.startswith('"') else field)  # quoted: csv unquotes it
    return values


def csv_field(value: str) -> str:
    """``value`` as one field of this package's CSV rows (quoted when it must be)."""
    text = io.StringIO()
    csv_writer(text).writerow([value])
    return text.getvalue()[:-1]


def field_end(text: str, start: int = 0) -> int:
    """Where the CSV field that begins at ``start`` of a row's ``text`` ends (the index of the comma after
    it, or the length of the text)."""
    if text.startswith('"', start):
        at = start + 1
        while True:
            at = text.index('"', at)
            if text.startswith('"', at + 1):  # a doubled quote inside the field
                at += 2
                continue
            return at + 1
    comma = text.find(",", start)
    return len(text) if comma < 0 else comma


class _LineFeed:
    """A text file that csv writers write rows to: rows end in ``\n``, while the writer, told that rows end
    in ``\r\n``, quotes every field holding a ``\r`` or a ``\n`` (Python's csv quotes only the characters
    of its line terminator, so a lone ``\r`` in a file name or a metadata value would end the row when
    read back)."""

    def __init__(self, file: Any) -> None:
        self._file = file

    def write(self, text: str) -> int:
        return self._file.write(text[:-2] + "\n" if text.endswith("\r\n") else text)


def csv_writer(file: Any) -> Any:
    """A ``csv.writer`` of rows ending in ``\n`` that round-trip any text (see ``_LineFeed``)."""
    return csv.writer(_LineFeed(file), lineterminator="\r\n")


class RowWriter:
    """Write dict rows to a local temporary CSV, then store it at ``uri`` on close."""

    def __init__(self, storage: Storage, uri: str, fields: Sequence[str]) -> None:
        self._storage, self._uri = storage, uri
        fd, self._path = tempfile.mkstemp(suffix=".csv")
        self._file = os.fdopen(fd, "w", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(_LineFeed(self._file), fieldnames=list(fields),  # type: ignore[arg-type]
                                      extrasaction="ignore", lineterminator="\r\n")
        self._writer.writeheader()
        self.count = 0

    def write(self, row: dict[str, Any]) -> None:
        self._writer.writerow(row)
        self.count += 1

    def write_values(self, values: Sequence[Any]) -> None:
        """Write one row given as its values, in this writer's field order (the fast path of a long table):
        values that need no quotes (no comma, quote, CR or LF; not None) are joined as they are, as
        ``csv.writer`` would write them, and any other row goes through it."""
        line = ",".join(map(str, values))
        if line.count(",") == len(values) - 1 > 0 and '"' not in line and "\n" not in line and "\r" not in line \
                and None not in values:
            self._file.write(line + "\n")
        else:
            self._writer.writer.writerow(values)
        self.count += 1

    def write_line(self, line: str) -> None:
        """Write one row already formatted as CSV (its fields in this writer's order, ending in a newline)."""
        self._file.write(line)
        self.count += 1

    def write_lines(self, text: str, rows: int) -> None:
        """Write ``rows`` rows already formatted as CSV, as one text (each ending in a newline)."""
        self._file.write(text)
        self.count += rows

    def write_text(self, text: bytes, rows: int) -> None:
        """Write ``rows`` rows already formatted as CSV, as one UTF-8 text (``storage.row_text``)."""
        self._file.flush()
        self._file.buffer.write(text)
        self.count += rows

    def close(self) -> None:
        self._file.close()
        try:
            self._storage.upload(self._path, self._uri)
        finally:
            os.unlink(self._path)

    def __enter__(self) -> RowWriter:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self._file.close()
            os.unlink(self._path)


def write_json(storage: Storage, uri: str, value: Any) -> None:
    """Store ``value`` as stable, human-readable JSON."""
    storage.write_bytes(uri, (json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode())


def read_json(storage: Storage, uri: str) -> Any:
    return json.loads(storage.read_bytes(uri))
