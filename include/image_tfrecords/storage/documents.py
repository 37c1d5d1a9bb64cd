"""CSV tables and JSON documents in a store, streamed: never held whole in memory."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
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


def dict_rows(data: bytes, name: str, start: int = 0) -> list[dict[str, str]]:
    """The rows of a small table this package wrote (``data``, whole), as dicts, from row ``start`` on. ``name``
    says which table is cut inside a quoted field or has a row of another count of fields."""
    reader = csv.reader(io.StringIO(data.decode("utf-8-sig"), newline=""), strict=True)
    header = next(reader, [])
    try:
        rows = list(itertools.islice(reader, start, None))
    except csv.Error as exc:
        raise ValueError(f"{name} is not a table this package wrote: {exc}") from exc
    if any(len(values) != len(header) for values in rows):
        raise ValueError(f"{name} has a row of another count of fields than its header's")
    return [dict(zip(header, values, strict=True)) for values in rows]


def first_column(data: bytes, name: str, column: str) -> list[str]:
    """The values of the first column (``column``, checked against the header) of a small table this package
    wrote, in order."""
    reader = csv.reader(io.StringIO(data.decode("utf-8-sig"), newline=""), strict=True)
    header = next(reader, [])
    if header[:1] != [column]:
        raise ValueError(f"{name} has columns {header!r}, expected {column!r} first")
    try:
        return [values[0] for values in reader]
    except csv.Error as exc:
        raise ValueError(f"{name} is not a table this package wrote: {exc}") from exc


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
