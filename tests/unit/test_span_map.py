"""``storage.span_map``: the compiled map and its Python fallback give the same answers, on keys given in one part
or two, repeated, empty or long, and refuse spans outside their data alike."""

from __future__ import annotations

import random

import numpy as np
import pytest

from image_tfrecords.storage import span_map
from image_tfrecords.storage.span_map import SpanMap

compiled = pytest.mark.skipif(span_map._Compiled is None, reason="the package was installed without its C part")
KINDS = [pytest.param(True, marks=compiled, id="compiled"), pytest.param(False, id="python")]


def _table(keys: list[bytes]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """``keys`` as one buffer (a comma after each) and each key's span."""
    data = b",".join(keys) + b","
    stops = np.cumsum([len(k) + 1 for k in keys], dtype=np.int64) - 1
    return data, stops - np.array([len(k) for k in keys], dtype=np.int64), stops


@pytest.mark.parametrize("use_c", KINDS)
def test_a_join_finds_each_key_added_and_only_those(use_c: bool) -> None:
    rng = random.Random(7)
    base = list(dict.fromkeys(rng.randbytes(rng.randrange(0, 300)).replace(b",", b";") for _ in range(5000)))
    others = [k + b"x" for k in base[:500]] + [b"", b"\0" * 40]
    m = SpanMap(compiled=use_c)
    assert m.compiled is use_c
    data, starts, stops = _table(base)
    m.add(data, starts, stops, np.arange(len(base)) * 3)
    assert len(m) == len(base)
    probe = base[::-1] + others
    data2, starts2, stops2 = _table(probe)
    got = m.get(data2, starts2, stops2)
    expected = [3 * base.index(k) if k in base else -1 for k in probe]
    assert got.tolist() == expected
    assert m.get(data2, starts2, stops2, missing=-7).tolist() == [-7 if e == -1 else e for e in expected]


@pytest.mark.parametrize("use_c", KINDS)
def test_a_key_in_two_parts_is_the_key_they_make_together(use_c: bool) -> None:
    m = SpanMap(compiled=use_c)
    data = b"cat/1.jpg,cat,120,99|dog/2.jpg,dog,7,5"
    m.add(data, [0, 21], [20, 38], [11, 22])  # "cat/1.jpg,cat,120,99", "dog/2.jpg,dog,7,5"
    probe = b"cat/1.jpg,120,99;dog/2.jpg,7,5"
    # "cat/1.jpg" + ",cat,120,99" is a key; "cat/1.jpg" + ",120,99" is not
    got = m.get(data, [0, 0, 21], [9, 9, 30], [9, 13, 30], [20, 20, 38])
    assert got.tolist() == [11, -1, 22]
    assert m.get(probe, [0], [16]).tolist() == [-1]
    assert m.get_key(b"dog/2.jpg,dog,7,5") == 22 and m.get_key(b"dog") == -1


@pytest.mark.parametrize("use_c", KINDS)
def test_a_key_added_again_takes_the_later_value(use_c: bool) -> None:
    m = SpanMap(compiled=use_c)
    m.add(b"aaXaa", [0, 3], [2, 5], [1, 2])
    m.add_key(b"aa", 9)
    assert len(m) == 1 and m.get_key(b"aa") == 9


@pytest.mark.parametrize("use_c", KINDS)
def test_spans_outside_the_data_are_refused(use_c: bool) -> None:
    m = SpanMap(compiled=use_c)
    with pytest.raises(ValueError, match="not within"):
        m.add(b"abc", [0], [4], [1])
    with pytest.raises(ValueError, match="not within"):
        m.get(b"abc", [2], [1])
    with pytest.raises(ValueError, match="not within"):
        m.get(b"abc", [0], [1], [-1], [2])
    with pytest.raises(ValueError):
        m.add(b"abc", [0, 1], [1], [1])
    with pytest.raises(TypeError):
        m.get(b"abc", [0], [1], [0], None)
    assert len(m) == 0 and m.get(b"abc", [0], [3]).tolist() == [-1]


@compiled
def test_the_compiled_map_takes_only_8_byte_integers() -> None:
    raw = span_map._Compiled()
    with pytest.raises(TypeError, match="8-byte"):
        raw.get(b"abc", np.array([0], dtype=np.int32), np.array([1], dtype=np.int64))
    assert np.frombuffer(raw.get(b"abc", np.array([0]), np.array([1])), dtype=np.int64).tolist() == [-1]


@compiled
def test_the_two_maps_agree_on_a_large_random_join() -> None:
    rng = np.random.default_rng(3)
    data = rng.integers(97, 100, 400_000, dtype=np.uint8).tobytes()  # three letters: many equal short keys
    starts = rng.integers(0, len(data) - 64, 60_000)
    stops = starts + rng.integers(0, 12, 60_000)
    values = rng.integers(-(2**62), 2**62, 60_000)
    a, b = SpanMap(), SpanMap(compiled=False)
    a.add(data, starts, stops, values)
    b.add(data, starts, stops, values)
    assert len(a) == len(b)
    probe = rng.integers(0, len(data) - 64, 20_000)
    cut = probe + rng.integers(0, 6, 20_000)
    end = cut + rng.integers(0, 6, 20_000)
    assert np.array_equal(a.get(data, probe, cut, cut, end), b.get(data, probe, cut, cut, end))
    assert (a.get(data, probe, end) >= -(2**62)).all()
