"""A map from byte strings to ints whose keys are spans of a buffer, many rows a call: the joins over every row of a
version's tables against its base's (``rules.base_version``: plan's join on each record's fields, inspect's on each
file's name, size and stamp).

The compiled map (``_spanmap.c``, built by ``make install``) keeps each key's bytes and compares them whole: about
0.2 us a row, without a Python object a row. Without it (no compiler), the same answers come from a dict on each
key's 128-bit BLAKE2b digest (about 1.5 us a row; memory about 100 bytes a key, against the key's own bytes and 64
bytes in C). ``tests/unit/test_span_map.py`` compares the two.
"""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

try:
    from ._spanmap import SpanMap as _Compiled
except ImportError:  # installed without its C part
    _Compiled = None


def _ints(values: Any) -> Any:
    import numpy as np

    return np.ascontiguousarray(values, dtype=np.int64)


class SpanMap:
    """``add`` maps the bytes ``data[starts[i]:stops[i]]`` (followed by ``data[starts2[i]:stops2[i]]`` where given)
    to ``values[i]`` (a key added again takes its later value); ``get`` gives each key's value as a numpy int64
    array, ``missing`` for a key never added. ``compiled=False``: the Python map even where the C one is built."""

    def __init__(self, compiled: bool = True) -> None:
        self._map: Any = _Compiled() if compiled and _Compiled is not None else None
        self._digests: dict[bytes, int] = {}

    @property
    def compiled(self) -> bool:
        return self._map is not None

    def __len__(self) -> int:
        return len(self._map) if self._map is not None else len(self._digests)

    def add(self, data: bytes, starts: Any, stops: Any, values: Any, starts2: Any = None, stops2: Any = None) -> None:
        if self._map is not None:
            first, last, first2, last2 = _spans(starts, stops, starts2, stops2)
            self._map.add(data, first, last, _ints(values), first2, last2)
            return
        self._digests.update(zip(_digests(data, starts, stops, starts2, stops2), _ints(values).tolist(), strict=True))

    def get(self, data: bytes, starts: Any, stops: Any, starts2: Any = None, stops2: Any = None,
            missing: int = -1) -> Any:
        import numpy as np

        if self._map is not None:
            return np.frombuffer(self._map.get(data, *_spans(starts, stops, starts2, stops2), missing),
                                 dtype=np.int64).copy()  # (writable, as the fallback's)
        keys = _digests(data, starts, stops, starts2, stops2)
        return np.fromiter(map(self._digests.get, keys, itertools.repeat(missing)), dtype=np.int64, count=len(keys))

    def add_key(self, key: bytes, value: int) -> None:
        """``add`` of one whole key (a row read as a list: the slow path for a table with quoted fields)."""
        self.add(key, [0], [len(key)], [value])

    def get_key(self, key: bytes, missing: int = -1) -> int:
        """``get`` of one whole key."""
        return int(self.get(key, [0], [len(key)], missing=missing)[0])


def _spans(starts: Any, stops: Any, starts2: Any, stops2: Any) -> tuple[Any, Any, Any, Any]:
    if (starts2 is None) != (stops2 is None):
        raise TypeError("starts2 and stops2 go together")
    return (_ints(starts), _ints(stops), None if starts2 is None else _ints(starts2),
            None if stops2 is None else _ints(stops2))


def _digests(data: bytes, starts: Any, stops: Any, starts2: Any, stops2: Any) -> list[bytes]:
    """Each key's BLAKE2b digest (16 bytes), its spans checked as the compiled map checks them."""
    import numpy as np

    blake, size = hashlib.blake2b, len(data)
    spans = _spans(starts, stops, starts2, stops2)
    for first, last in (spans[:2], spans[2:]) if starts2 is not None else (spans[:2],):
        if len(first) != len(spans[0]) or len(last) != len(first):
            raise ValueError("the span arrays differ in length")
        bad = np.flatnonzero((first < 0) | (first > last) | (last > size))
        if len(bad):
            raise ValueError(f"span {bad[0]} is not within the data's {size} bytes")
    first, last = spans[0].tolist(), spans[1].tolist()
    if starts2 is None:
        return [blake(data[a:b], digest_size=16).digest() for a, b in zip(first, last, strict=True)]
    return [blake(data[a:b] + data[c:d], digest_size=16).digest()
            for a, b, c, d in zip(first, last, spans[2].tolist(), spans[3].tolist(), strict=True)]
