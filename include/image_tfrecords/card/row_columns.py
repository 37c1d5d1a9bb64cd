"""labels.csv's rows as the card's pass needs them: one numpy array a column, and where each row's line is.

A version's card keeps them (``card/label-rows.bin``, ``RowColumns.dump``) beside its scan, so that the next
night's card parses only the rows that night added or changed: the rows it kept of the previous version
(``Changes``: the plan knows which, as it joins the previous labels.csv) are taken from the saved columns by
their row numbers there (``RowColumns.merged``). Whatever way the columns came, the card's pass over them
(``card.label_columns.scan_row_columns``) is the same code on the same values: the same counts, picks and sums.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..storage import Storage, is_s3
from ..storage.csv_blocks import Block, Quoted, Ragged
from .quality import _COLUMNS

ROWS_FILE = "card/label-rows.bin"  # in a published version: its labels.csv's RowColumns (``dump``)
_FORMAT = 1
REQUIRED = ("filename", "label", "label_id", "split", "sha256")


@dataclass
class RowColumns:
    """The columns of a single-label labels.csv the card reads, in row order (``count`` rows): ``ids`` (label_id),
    ``labels``, ``splits`` and ``cells`` (the quality cell) as fixed-width bytes, ``prefixes`` (the sha256's first 64
    bits), ``measures`` (``quality._COLUMNS`` as floats, NaN where empty), ``names`` and ``contents`` (the diff's
    8-byte hashes of the filename and of filename and sha256, as little-endian integers); ``starts`` and ``stops``:
    where each row's line begins and ends in this version's table (not kept by ``dump``)."""

    ids: Any
    labels: Any
    splits: Any
    cells: Any
    prefixes: Any
    measures: Any
    names: Any
    contents: Any
    starts: Any
    stops: Any

    @property
    def count(self) -> int:
        return len(self.ids)

    @classmethod
    def of_block(cls, block: Block, at: dict[str, int]) -> RowColumns:
        """A block's rows (``at``: each column's place in the header). ``ValueError`` for a value the columns
        cannot take (not UTF-8, a label id or a measure that is not a number, a short sha256)."""
        import numpy as np

        block.data.decode("utf-8")  # a value that is not UTF-8 (UnicodeDecodeError): the rows, as they read it
        filenames, hashes = block.column(at["filename"]), block.column(at["sha256"])
        blake2b = hashlib.blake2b
        names = b"".join([blake2b(name, digest_size=8).digest() for name in filenames.tolist()])
        contents = b"".join([blake2b(name + b"\0" + sha, digest_size=8).digest()
                             for name, sha in zip(filenames.tolist(), hashes.tolist(), strict=True)])
        quality = at.get("quality")
        return cls(ids=block.integers(at["label_id"]), labels=block.column(at["label"]),
                   splits=block.column(at["split"]),
                   cells=block.column(quality) if quality is not None else np.zeros(block.count, dtype="S1"),
                   prefixes=block.hex_prefixes(at["sha256"]),
                   measures=np.stack([_floats(block, at.get(name)) for name in _COLUMNS], axis=1) if block.count
                   else np.zeros((0, len(_COLUMNS))),
                   names=np.frombuffer(names, dtype="<u8"), contents=np.frombuffer(contents, dtype="<u8"),
                   starts=block.offset + block.starts[:, 0], stops=block.offset + block.stops[:, -1])

    @classmethod
    def concat(cls, parts: list[RowColumns]) -> RowColumns:
        import numpy as np

        if not parts:
            return cls.empty()
        return cls(*(np.concatenate([getattr(part, name) for part in parts]) for name in _FIELDS))

    @classmethod
    def empty(cls) -> RowColumns:
        import numpy as np

        return cls(ids=np.zeros(0, dtype=np.int64), labels=np.zeros(0, dtype="S1"), splits=np.zeros(0, dtype="S1"),
                   cells=np.zeros(0, dtype="S1"), prefixes=np.zeros(0, dtype=np.uint64),
                   measures=np.zeros((0, len(_COLUMNS))), names=np.zeros(0, dtype="<u8"),
                   contents=np.zeros(0, dtype="<u8"), starts=np.zeros(0, dtype=np.int64),
                   stops=np.zeros(0, dtype=np.int64))

    @classmethod
    def merged(cls, previous: RowColumns, origins: Any, fresh: RowColumns, starts: Any, stops: Any) -> RowColumns:
        """This version's columns: row ``i`` is the previous version's row ``origins[i]``, or (where that is -1) the
        next row of ``fresh`` (its new rows, in order); ``starts``/``stops``: where each row's line is now."""
        import numpy as np

        new = np.flatnonzero(origins < 0)
        kept = np.flatnonzero(origins >= 0)
        columns = []
        for name in _FIELDS[:-2]:
            old, add = getattr(previous, name), getattr(fresh, name)
            dtype = np.result_type(old.dtype, add.dtype)
            out = np.empty((len(origins), *old.shape[1:]), dtype=dtype)
            out[kept] = old[origins[kept]]
            out[new] = add
            columns.append(out)
        return cls(*columns, starts, stops)

    def dump(self, labels_sha256: str) -> bytes:
        """These columns (of the labels.csv whose SHA-256 is ``labels_sha256``) as bytes: a JSON line (the distinct
        labels, splits and quality cells), then the arrays. Deterministic."""
        import numpy as np

        tables, codes = {}, []
        for name in ("labels", "splits", "cells"):
            distinct, code = np.unique(getattr(self, name), return_inverse=True)
            tables[name] = [value.decode("utf-8") for value in distinct.tolist()]
            codes.append(code.astype("<i4").ravel())
        header = {"format": _FORMAT, "labels_sha256": labels_sha256, "rows": self.count, **tables}
        arrays = [self.ids.astype("<i8"), *codes, self.prefixes.astype("<u8"), self.measures.astype("<f8"),
                  self.names.astype("<u8"), self.contents.astype("<u8")]
        return json.dumps(header, sort_keys=True, separators=(",", ":")).encode() + b"\n" + \
            b"".join(array.tobytes() for array in arrays)

    @classmethod
    def load(cls, data: bytes, labels_sha256: str) -> RowColumns | None:
        """The columns ``dump`` wrote, if they are of the labels.csv whose SHA-256 is ``labels_sha256`` (else None).
        ``starts``/``stops`` are -1: the previous version's lines are never read through them."""
        import numpy as np

        try:
            line, _, body = data.partition(b"\n")
            header = json.loads(line)
            rows = int(header["rows"])
            if header.get("format") != _FORMAT or not labels_sha256 or header.get("labels_sha256") != labels_sha256 \
                    or len(body) != rows * (8 + 3 * 4 + 8 + 8 * len(_COLUMNS) + 16):
                return None
            at = 0

            def take(dtype: str, width: int = 1) -> Any:
                nonlocal at
                size = np.dtype(dtype).itemsize * rows * width
                array = np.frombuffer(body, dtype=dtype, count=rows * width, offset=at)
                at += size
                return array.reshape(rows, width) if width > 1 else array

            ids = take("<i8").astype(np.int64)
            tables = [np.array([value.encode("utf-8") for value in header[name]] or [b""])
                      for name in ("labels", "splits", "cells")]
            labels, splits, cells = (table[take("<i4")] for table in tables)
            prefixes, measures = take("<u8").astype(np.uint64), take("<f8", len(_COLUMNS)).astype(np.float64)
            names, contents = take("<u8"), take("<u8")
            missing = np.full(rows, -1, dtype=np.int64)
            return cls(ids, labels, splits, cells, prefixes, measures, names, contents, missing, missing)
        except (ValueError, KeyError, TypeError, IndexError, UnicodeError):
            return None


_FIELDS = ("ids", "labels", "splits", "cells", "prefixes", "measures", "names", "contents", "starts", "stops")


def _floats(block: Block, j: int | None) -> Any:
    """Column ``j`` as floats, an empty cell (or an absent column) NaN, as ``QualityScan.offer_batch`` reads them."""
    import numpy as np

    if j is None:
        return np.full(block.count, np.nan)
    column = block.column(j)
    return np.where(column == b"", b"nan", column).astype(np.float64)


def header_places(names: list[str]) -> dict[str, int]:
    """Each column's place in a table whose header names ``names``; ``Quoted`` (read the rows instead) when one the
    card needs is missing."""
    at = {name: j for j, name in enumerate(names)}
    if missing := [name for name in REQUIRED if name not in at]:
        raise Quoted(f"no column {', '.join(missing)}")
    return at


class LineReader:
    """Rows of a table on this machine, read by where their lines are (``pread``): the few the card shows."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "rb")  # noqa: SIM115 (closed by ``close``)
        first = self._file.readline().lstrip(b"\xef\xbb\xbf").rstrip(b"\n")
        self.names = first.decode("utf-8", "surrogateescape").split(",")
        self.size = os.fstat(self._file.fileno()).st_size

    def rows(self, starts: Any, stops: Any) -> list[dict[str, str]]:
        """The rows whose lines are ``data[start:stop]``, each a dict as ``documents.list_rows`` gives it."""
        fd = self._file.fileno()
        out = []
        for start, stop in zip(starts.tolist(), stops.tolist(), strict=True):
            values = os.pread(fd, stop - start, start).decode("utf-8").split(",")
            if len(values) != len(self.names):
                raise Ragged("a row has another count of fields than the table's header")
            out.append(dict(zip(self.names, values, strict=True)))
        return out

    def block(self, starts: Any, stops: Any) -> Block:
        """The rows whose lines are ``data[start:stop]`` as one ``Block`` (their lines, in that order)."""
        fd = self._file.fileno()
        return Block(b"".join([os.pread(fd, stop - start, start) + b"\n"
                               for start, stop in zip(starts.tolist(), stops.tolist(), strict=True)]), len(self.names))

    def close(self) -> None:
        self._file.close()


@contextmanager
def line_reader(storage: Storage, uri: str) -> Iterator[LineReader]:
    """A ``LineReader`` of the table at ``uri`` (an S3 object is spooled to a temporary file first)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = uri
        if is_s3(uri):
            path = os.path.join(tmp, "rows.csv")
            storage.download(uri, path)
        reader = LineReader(path)
        try:
            yield reader
        finally:
            reader.close()


@dataclass
class Changes:
    """What a night's plan knows of its labels.csv: each row's row number in the previous version's labels.csv
    (``origins``; -1 for a row that is not one of it) and where each row's line begins (``offsets``; the table's
    length last), with the previous version's ``RowColumns``."""

    previous: RowColumns
    origins: Any
    offsets: Any
    taken: int | None = None  # rows whose columns ``columns`` took from ``previous`` (None: not taken)

    def columns(self, reader: LineReader) -> RowColumns | None:
        """This version's columns: the kept rows' taken from ``previous``, the others parsed from their lines (read
        by ``reader``). None when the origins do not fit the previous columns."""
        import numpy as np

        origins = self.origins
        if len(self.offsets) != len(origins) + 1 or int(self.offsets[-1]) != reader.size or \
                (len(origins) and int(origins.max()) >= self.previous.count):
            return None
        starts, stops = self.offsets[:-1], self.offsets[1:] - 1  # (a line's end: its newline)
        new = np.flatnonzero(origins < 0)
        at = header_places(reader.names)
        fresh = RowColumns.of_block(reader.block(starts[new], stops[new]), at) if len(new) else RowColumns.empty()
        self.taken = len(origins) - len(new)
        return RowColumns.merged(self.previous, origins, fresh, starts, stops)


def card_rows_bytes(base: tuple[str, str] | None, origins: Any, offsets: Any) -> bytes:
    """What the plan stages for the card (``staging.CARD_ROWS``): the base version and its labels.csv's SHA-256 as its
    manifest gives them (None: a build on no base), each row's row number in that labels.csv (-1: none) and where
    each row's line begins in this version's (``offsets``, the table's length last)."""
    header = {"format": _FORMAT, "rows": len(origins), "base": list(base) if base else None}
    return json.dumps(header, sort_keys=True).encode() + b"\n" + origins.astype("<i8").tobytes() + \
        offsets.astype("<i8").tobytes()


def read_card_rows(data: bytes) -> tuple[tuple[str, str], Any, Any] | None:
    """``card_rows_bytes``' (base version, its labels.csv's SHA-256), origins and offsets; None for a build on no
    base. ``ValueError`` for bytes it did not write."""
    import numpy as np

    line, _, body = data.partition(b"\n")
    header = json.loads(line)
    rows = int(header["rows"])
    if header.get("format") != _FORMAT or len(body) != 8 * (2 * rows + 1):
        raise ValueError("not the card's rows")
    if not header.get("base"):
        return None
    origins = np.frombuffer(body, dtype="<i8", count=rows).astype(np.int64)
    offsets = np.frombuffer(body, dtype="<i8", offset=8 * rows).astype(np.int64)
    return (str(header["base"][0]), str(header["base"][1])), origins, offsets
