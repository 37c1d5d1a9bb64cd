"""The tables this package writes, read as columns: numpy finds every row's fields at once.

A pass over every row of a table (100,000 rows and more a night) that splits each row into Python strings
pays about 2 us a row for the split alone. Here a block of rows (a few MiB, whole rows) is one ``bytes``; the
positions of its line ends and commas, found by numpy, give every field's bounds as a matrix, and a column
comes out as a numpy array (fixed-width bytes, or integers parsed as columns): per row, only what a pass
asks for costs anything.

This holds for rows without a quote, which are all the rows of a table whose names and values need none
(no comma, quote or line end in them: nearly every dataset). A table holding one (or a carriage return, or a
NUL) is ``Quoted``: the caller reads it row by row as before (``documents.list_rows``). Memory: one block and
its field bounds (16 bytes a field).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from . import Storage, is_s3

BLOCK_BYTES = 8 << 20
NEWLINE, COMMA, QUOTE = 10, 44, 34


class Quoted(Exception):
    """The table holds a quoted field (or another header): read it row by row."""


class Ragged(ValueError):
    """A block holds a row with another count of fields than the header's (a damaged table)."""


class Block:
    """Whole rows of a table, each ending in a line end: ``data``, and each field's bounds."""

    def __init__(self, data: bytes, width: int, offset: int = 0) -> None:
        import numpy as np

        raw = np.frombuffer(data, dtype=np.uint8)
        ends = np.flatnonzero(raw == NEWLINE)
        commas = np.flatnonzero(raw == COMMA)
        count = len(ends)
        if len(commas) != count * (width - 1) or (count and (  # the commas before each line end: width - 1 a row
                np.searchsorted(commas, ends) != np.arange(1, count + 1) * (width - 1)).any()):
            raise Ragged("a row has another count of fields than the table's header")
        starts = np.empty((count, width), dtype=np.int64)  # field j of row i: data[starts[i, j]:stops[i, j]]
        stops = np.empty((count, width), dtype=np.int64)
        starts[:, 0] = np.concatenate(([0], ends[:-1] + 1)) if count else ends
        starts[:, 1:] = commas.reshape(count, width - 1) + 1
        stops[:, :-1] = commas.reshape(count, width - 1)
        stops[:, -1] = ends
        self.data, self.raw, self.starts, self.stops, self.count = data, raw, starts, stops, count
        self.offset = offset  # where ``data`` starts in the table's file

    def __len__(self) -> int:
        return self.count

    def column(self, j: int) -> Any:
        """Column ``j`` as a numpy array of fixed-width bytes (``S``): its values, NUL-padded."""
        import numpy as np
        from numpy.lib.stride_tricks import as_strided

        starts, lengths = self.starts[:, j], self.stops[:, j] - self.starts[:, j]
        width = int(lengths.max()) if self.count else 0
        if not width:
            return np.zeros(self.count, dtype="S1")
        raw = self.raw if int(starts.max()) + width <= len(self.raw) else \
            np.concatenate((self.raw, np.zeros(width, dtype=np.uint8)))
        windows = as_strided(raw, shape=(len(raw) - width + 1, width), strides=(1, 1), writeable=False)
        values = windows[starts]  # a copy: each row's ``width`` bytes from its field's start
        if int(lengths.min()) != width:
            values[np.arange(width) >= lengths[:, None]] = 0
        return values.view(f"S{width}").ravel()

    def integers(self, j: int) -> Any:
        """Column ``j`` as int64, each a plain decimal (``ValueError`` for an empty or other value)."""
        import numpy as np

        lengths = self.stops[:, j] - self.starts[:, j]
        if not self.count:
            return np.zeros(0, dtype=np.int64)
        if int(lengths.min()) < 1 or int(lengths.max()) > 18:
            raise ValueError("not a plain decimal in every row")
        digits = self.column(j).view(np.uint8).reshape(self.count, -1).astype(np.int64) - 48
        places = lengths[:, None] - 1 - np.arange(digits.shape[1])  # each digit's power of ten; < 0: padding
        present = places >= 0
        if ((digits < 0) | (digits > 9))[present].any():
            raise ValueError("not a plain decimal in every row")
        return (np.where(present, digits, 0) * 10 ** np.maximum(places, 0)).sum(axis=1)

    def hex_prefixes(self, j: int) -> Any:
        """The first 16 hex digits (lower case) of each value of column ``j`` as uint64 (``ValueError`` for a value
        that does not begin so): a SHA-256 hexdigest's first 64 bits."""
        import numpy as np

        if not self.count:
            return np.zeros(0, dtype=np.uint64)
        digits = self.column(j).view(np.uint8).reshape(self.count, -1)
        if digits.shape[1] < 16:
            raise ValueError("a value shorter than 16 hex digits")
        digits = digits[:, :16].astype(np.uint64)
        letters = (digits >= 97) & (digits <= 102)
        if not (letters | ((digits >= 48) & (digits <= 57))).all():
            raise ValueError("not a lower-case hex digit")
        values = np.where(letters, digits - 87, digits - 48)
        return (values << (np.uint64(4) * np.arange(15, -1, -1, dtype=np.uint64))).sum(axis=1, dtype=np.uint64)

    def row_slices(self, first: int, last: int) -> tuple[Any, Any]:
        """Where each row's fields ``first`` to ``last`` (inclusive) begin and end in ``data``."""
        return self.starts[:, first], self.stops[:, last]


def distinct(values: Any) -> Any:
    """``numpy.unique(values)``: the sorted distinct values, without its check for a masked array, whose first call
    imports ``numpy.ma`` (20 ms of a 0.8 s night on this machine's one busy core)."""
    import numpy as np

    return np.unique(values, return_counts=True)[0]


def within(values: Any, others: Any) -> Any:
    """``numpy.isin(values, others)`` by a binary search of the sorted distinct ``others`` (numpy's own sorts them
    with ``numpy.unique``, see ``distinct``)."""
    import numpy as np

    ref = distinct(others)
    if not len(ref):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(ref, values), len(ref) - 1)
    return ref[at] == values


@contextmanager
def blocks(storage: Storage, uri: str, header: str, block_bytes: int = BLOCK_BYTES) -> Iterator[Iterator[Block]]:
    """The rows of the table at ``uri`` as ``Block``s (S3 objects are spooled to disk). ``Quoted`` (before any block)
    when its header is not ``header`` or the table holds a quote; ``header`` names the columns. A block with a row
    of another count of fields raises ``Ragged`` as it is read: a caller that wrote something of the blocks before
    it must not read the table again row by row."""
    with _opened(storage, uri, header, block_bytes) as (_, found):
        yield found


@contextmanager
def table_blocks(storage: Storage, uri: str, block_bytes: int = BLOCK_BYTES
                 ) -> Iterator[tuple[list[str], Iterator[Block]]]:
    """``blocks`` of a table whatever its columns: the names its header gives, and its blocks (``Quoted`` for a
    header with a quote, as for a table with one)."""
    with _opened(storage, uri, None, block_bytes) as (header, found):
        yield header.split(","), found


@contextmanager
def _opened(storage: Storage, uri: str, header: str | None, block_bytes: int) -> Iterator[tuple[str, Iterator[Block]]]:
    with ExitStack() as stack:
        f = stack.enter_context(open(_local_path(stack, storage, uri), "rb"))
        first = f.readline()
        found = first.lstrip(b"\xef\xbb\xbf").rstrip(b"\n").decode("utf-8", "surrogateescape")
        if found != (found if header is None else header) or not found or '"' in found or "\r" in found:
            raise Quoted(f"{uri} has other columns")
        if _holds_quote(f, block_bytes):
            raise Quoted(f"{uri} holds a quoted field, a carriage return or a NUL")
        f.seek(len(first))
        yield found, _read_blocks(f, found.count(",") + 1, block_bytes)


def first_fields(storage: Storage, uri: str, numbers: list[int], block_bytes: int = BLOCK_BYTES) -> list[str]:
    """The file names (first field) of the table's rows ``numbers`` (ascending; the first row after the header: 0),
    in that order: lines counted, and only the wanted ones cut (the diff's few example names of a long table).
    ``Quoted`` if the table holds a quote, a carriage return or a NUL (a line is then not always a row)."""
    found: list[str] = []
    with ExitStack() as stack:
        f = stack.enter_context(open(_local_path(stack, storage, uri), "rb"))
        if not f.readline().lstrip(b"\xef\xbb\xbf").startswith(b"filename,"):
            raise Quoted(f"{uri} does not begin with a filename column")
        wanted, rest, first = iter(numbers), b"", 0
        number = next(wanted, -1)
        while number >= 0 and (chunk := f.read(block_bytes)):
            if b'"' in chunk or b"\r" in chunk or b"\0" in chunk:
                raise Quoted(f"{uri} holds a quoted field, a carriage return or a NUL")
            lines = (rest + chunk).split(b"\n")
            rest = lines.pop()
            while 0 <= number < first + len(lines):
                found.append(lines[number - first].split(b",", 1)[0].decode("utf-8"))
                number = next(wanted, -1)
            first += len(lines)
        if number >= 0 and rest and number == first:
            found.append(rest.split(b",", 1)[0].decode("utf-8"))
    return found


def _local_path(stack: ExitStack, storage: Storage, uri: str) -> str:
    """A local path to read ``uri`` from: itself, or an S3 object spooled into a folder ``stack`` removes."""
    if not is_s3(uri):
        return uri
    path = os.path.join(stack.enter_context(tempfile.TemporaryDirectory()), "rows.csv")
    storage.download(uri, path)
    return path


def _holds_quote(f: Any, block_bytes: int) -> bool:
    """Whether the rest of ``f`` holds a quote, a carriage return or a NUL (which a column's fixed-width bytes
    would drop from a value's end): a table to read row by row."""
    while chunk := f.read(block_bytes):
        if b'"' in chunk or b"\r" in chunk or b"\0" in chunk:
            return True
    return False


def _read_blocks(f: Any, width: int, block_bytes: int) -> Iterator[Block]:
    rest, at = b"", f.tell()
    while True:
        chunk = f.read(block_bytes)
        if not chunk:
            break
        data = rest + chunk
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if cut:
            yield Block(data[:cut], width, at)
            at += cut
    if rest:
        yield Block(rest + b"\n", width, at)
