"""This package's CSV tables (labels.csv, inspected.csv, records.csv...) as polars DataFrames, and back.

Every column is read as text (``pl.String``): a table's values are what it says, never a guessed type. An empty
field reads as null and is written back empty, so a table read and written again keeps its bytes: polars quotes
a field only where it must (a comma, a quote, a ``\\r`` or a ``\\n`` in it), as ``documents.csv_writer`` does.
One code path for every file name, however odd. Memory: the whole table (about 300 bytes a labels.csv row).
"""

from __future__ import annotations

import functools
import io
import signal
from collections.abc import Iterable
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ..errors import BuildError
from . import Storage

if TYPE_CHECKING:
    import polars as pl


@functools.cache
def polars() -> ModuleType:
    """The polars module, for the functions that use it (imported on first use: never by the DAG file).

    Importing polars 2.1 installs its own SIGINT handler with ``SA_RESTART``: a process waiting in a lock (the
    command line waiting on its pool's shards) would then see Ctrl-C only when the wait ends, seconds later. Its
    handler is kept (it hands the signal on to Python's), but made to interrupt system calls again."""
    import polars as pl

    signal.siginterrupt(signal.SIGINT, True)
    return pl


@functools.cache
def arrow() -> ModuleType:
    """The pyarrow module (``table_lines`` hands polars a table's rows through Arrow), imported on first use: about
    35 ms, which the tasks that never cut a table into rows do not pay."""
    import pyarrow

    return pyarrow


def read_table(storage: Storage, uri: str, data: bytes | None = None, columns: list[str] | None = None
               ) -> pl.DataFrame:
    """The table at ``uri`` (or its bytes ``data``, read already), every column text (``columns``: those alone,
    several times faster to read); a damaged table (a row of another count of fields, text that is not UTF-8, no
    header) is a ``BuildError`` naming it."""
    pl = polars()

    if data is None:
        data = storage.read_bytes(uri)
    if not data or data.isspace():
        raise BuildError(f"{uri} is empty: a table has a header line at least")
    try:
        return pl.read_csv(data, columns=columns, infer_schema=False, quote_char='"', raise_if_empty=True,
                           truncate_ragged_lines=False)
    except (pl.exceptions.PolarsError, UnicodeDecodeError) as exc:  # (polars' first line: its plan follows)
        raise BuildError(f"{uri} is not a table this package wrote: {str(exc).strip().splitlines()[0]}") from exc


def table_text(frame: pl.DataFrame, header: bool = True) -> bytes:
    """``frame`` as this package writes a CSV table: minimal quoting, rows ending in ``\\n``, null written empty."""
    out = io.BytesIO()  # (bytes written straight: no str made and encoded)
    frame.write_csv(out, include_header=header, quote_style="necessary", line_terminator="\n")
    return out.getvalue()


def header_line(columns: Iterable[str]) -> bytes:
    """The header line ``table_text`` writes for a table of ``columns``."""
    pl = polars()

    return table_text(pl.DataFrame(schema=dict.fromkeys(columns, pl.String)))


def table_rows(frame: pl.DataFrame) -> tuple[bytes, Any, Any]:
    """``frame``'s rows as ``table_text`` writes them (no header), and where each begins and ends in them
    (``row_bounds``): a table written once, to be cut into parts at row ends."""
    text = table_text(frame, header=False)
    begins, ends = row_bounds(text)
    if len(ends) != frame.height:
        raise BuildError(f"a table of {frame.height} rows was written as {len(ends)}")
    return text, begins, ends


ROW_SCAN_BLOCK = 1 << 18  # bytes a step of ``row_ends`` compares (its temporaries stay small: no 25 MB arrays)


def row_ends(text: bytes | memoryview) -> Any:
    """The offset just past each row of ``text`` (a numpy int64 array), rows as this package writes tables: a row ends
    at a ``\\n`` outside quotes (a quote opens or closes a quoted field, an escaped one ``""`` does both), so a
    quoted field's line breaks stay inside its row. numpy over the bytes, a block at a time, whatever the fields
    hold."""
    import numpy as np

    data = np.frombuffer(text, dtype=np.uint8)
    breaks, quotes = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
    for start in range(0, len(data), ROW_SCAN_BLOCK):
        block = data[start:start + ROW_SCAN_BLOCK]
        breaks.append(np.flatnonzero(block == ord("\n")) + start)
        quotes.append(np.flatnonzero(block == ord('"')) + start)
    ends, quoted = np.concatenate(breaks), np.concatenate(quotes)
    if len(quoted):  # (an even count of quotes before a line break: outside quotes)
        ends = ends[np.searchsorted(quoted, ends) % 2 == 0]
    return ends + 1


def row_bounds(text: bytes | memoryview) -> tuple[Any, Any]:
    """Where each row of ``text`` (``row_ends``) begins and ends: two numpy arrays of offsets."""
    import numpy as np

    ends = row_ends(text)
    begins = np.zeros_like(ends)
    begins[1:] = ends[:-1]
    return begins, ends


def table_lines(uri: str, data: bytes) -> tuple[bytes, pl.Series]:
    """A table's header line and each row's text (``\\n`` included, quoting as written: a row as it is in ``data``)
    as a polars String Series, cut at ``row_ends`` (the bytes are handed to Arrow as they are, not copied row by
    row). A table with no header, or text that is not UTF-8, is a ``BuildError`` naming ``uri``."""
    import numpy as np

    pl, pa = polars(), arrow()
    ends = row_ends(data)
    if not len(ends) or len(data) != ends[-1]:
        raise BuildError(f"{uri} is not a table this package wrote: no header, or its last row has no line end")
    offsets = np.concatenate([[0], ends[1:] - ends[0]])  # (each row's start from the first row's, then the end)
    body = memoryview(data)[int(ends[0]):]
    rows = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1,
                                            [None, pa.py_buffer(offsets), pa.py_buffer(body)])
    try:
        lines = pl.Series(_ArrowArray(rows)).cast(pl.String).alias("line")
    except pl.exceptions.PolarsError as exc:
        raise BuildError(f"{uri} is not a table this package wrote: {str(exc).strip().splitlines()[0]}") from exc
    return data[: int(ends[0])], lines


class _ArrowArray:
    """An Arrow array handed to polars through the Arrow PyCapsule interface: polars' path for a pyarrow array
    would import ``pyarrow.compute`` (about 50 ms, once per process) to do the same."""

    def __init__(self, array: Any) -> None:
        self.array = array

    def __arrow_c_array__(self, requested_schema: Any = None) -> Any:
        return self.array.__arrow_c_array__(requested_schema)


def lines_text(lines: pl.Series) -> memoryview:
    """The rows of ``lines`` (each with its line end: ``table_lines``) as one text, without a copy of each row."""
    import numpy as np

    rows = lines.to_arrow(compat_level=polars().CompatLevel.oldest())  # (large_string: offsets and one data buffer)
    if not len(rows):
        return memoryview(b"")
    _, offsets, data = rows.buffers()
    at = np.frombuffer(offsets, dtype=np.int64, count=len(rows) + 1, offset=rows.offset * 8)
    return memoryview(data)[int(at[0]):int(at[-1])]


def write_table(storage: Storage, uri: str, frame: pl.DataFrame) -> None:
    """Store ``frame`` at ``uri`` as ``table_text`` makes it."""
    storage.write_bytes(uri, table_text(frame))
