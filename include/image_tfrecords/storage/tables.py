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


def table_rows(frame: pl.DataFrame) -> tuple[bytes, Any, Any]:
    """``frame``'s rows as ``table_text`` writes them (no header), and where each begins and ends in them
    (``row_bounds``): a table written once, to be cut into parts at row ends."""
    text = table_text(frame, header=False)
    return text, *row_bounds(frame, text)


def row_bounds(frame: pl.DataFrame, text: bytes | memoryview) -> tuple[Any, Any]:
    """The offset where each of ``frame``'s rows begins and ends (numpy arrays) in ``text``, its rows as this package
    writes tables (no header). A quoted field's line breaks are counted (a name holding ``\\n`` is one row of two
    lines); a text of another count of lines is a ``BuildError``."""
    import numpy as np
    pl = polars()

    ends = np.flatnonzero(np.frombuffer(text, dtype=np.uint8) == ord("\n")) + 1  # each line's end
    if len(ends) != frame.height:  # a field holds line breaks: each row ends at its last line's end
        breaks = frame.select(pl.sum_horizontal(pl.all().cast(pl.String).str.count_matches("\n", literal=True)
                                                .fill_null(0))).to_series().to_numpy()
        last_line = np.cumsum(1 + breaks, dtype=np.int64) - 1
        if len(ends) != frame.height + int(breaks.sum()):
            raise BuildError(f"a table of {frame.height} rows was written as {len(ends)} lines, "
                             f"expected {frame.height + int(breaks.sum())}")
        ends = ends[last_line]
    begins = np.zeros_like(ends)
    begins[1:] = ends[:-1]
    return begins, ends


def write_table(storage: Storage, uri: str, frame: pl.DataFrame) -> None:
    """Store ``frame`` at ``uri`` as ``table_text`` makes it."""
    storage.write_bytes(uri, table_text(frame))
