"""The text of many CSV rows at once: the passes over every row that write a table (split's labels, plan's labels.csv
and each shard's members, inspection's carried rows) give each column as numpy arrays (spans of a block they read,
picks from a few values, numbers) and get the rows' text back in one call, not a Python ``bytes`` a value.

The compiled ``_spanmap.join_rows`` (built by ``make install``) copies each value once into the text; without it (no
compiler) the same bytes come from Python, a row at a time (``compiled=False``; ``tests/unit/test_row_text.py``
compares the two). A piece is a tuple:

* ``(data, starts, stops)``: row i's value is ``data[starts[i]:stops[i]]`` (``data`` any buffer: bytes, a map);
* ``(values, index)``: row i's value is ``values[index[i]]`` (a list of bytes);
* ``(numbers,)``: row i's value is ``numbers[i]`` in decimal.

A span outside its data or an index outside its values is a ``ValueError``, in both.
"""

from __future__ import annotations

from typing import Any

try:
    from ._spanmap import join_rows as _compiled
except ImportError:  # installed without its C part (or a build of it from before join_rows)
    _compiled = None


def compiled() -> bool:
    """Whether ``join_rows`` runs in C here."""
    return _compiled is not None


def _ints(values: Any) -> Any:
    import numpy as np

    return np.ascontiguousarray(values, dtype=np.int64)


def join_rows(count: int, pieces: list[tuple[Any, ...]], sep: bytes = b",", end: bytes = b"\n",
              compiled: bool = True) -> tuple[bytes, Any]:
    """``count`` rows, each its ``pieces``' values joined by ``sep`` and followed by ``end``: the text, and where
    each row ends in it (a numpy int64 array)."""
    import numpy as np

    pieces = [(piece[0], _ints(piece[1]), _ints(piece[2])) if len(piece) == 3 else
              (list(piece[0]), _ints(piece[1])) if len(piece) == 2 else (_ints(piece[0]),) for piece in pieces]
    if compiled and _compiled is not None:
        text, ends = _compiled(count, pieces, sep, end)
        return text, np.frombuffer(ends, dtype=np.int64)
    columns = [_values(count, piece) for piece in pieces]
    lines = [sep.join(values) + end for values in zip(*columns, strict=True)] if columns else [end] * count
    return b"".join(lines), np.cumsum(np.array([len(line) for line in lines], dtype=np.int64))


def gather(data: Any, starts: Any, stops: Any, compiled: bool = True) -> bytes:
    """``data[starts[i]:stops[i]]`` of every i, one after another."""
    return join_rows(len(starts), [(data, starts, stops)], b"", b"", compiled)[0]


def _values(count: int, piece: tuple[Any, ...]) -> list[bytes]:
    """One piece's values, row by row (the Python fallback)."""
    if len(piece) == 3:
        data, starts, stops = piece[0], piece[1][:count].tolist(), piece[2][:count].tolist()
        size = len(memoryview(data).cast("B"))
        if len(starts) < count or len(stops) < count or \
                any(a < 0 or b < a or b > size for a, b in zip(starts, stops, strict=True)):
            raise ValueError("join_rows: a span outside its data")
        return [bytes(data[a:b]) for a, b in zip(starts, stops, strict=True)]
    if len(piece) == 2:
        values, index = piece[0], piece[1][:count].tolist()
        if len(index) < count or any(not 0 <= j < len(values) for j in index):
            raise ValueError("join_rows: an index outside its values")
        return [values[j] for j in index]
    numbers = piece[0][:count].tolist()
    if len(numbers) < count:
        raise ValueError("join_rows: an int array holds fewer items than rows")
    return [b"%d" % n for n in numbers]
