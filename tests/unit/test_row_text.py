"""``storage.row_text``: the text of many CSV rows at once, in C (``_spanmap.join_rows``) and in Python, byte for
byte the same, and the same errors for a span or an index out of range."""

from __future__ import annotations

import mmap
import random
from pathlib import Path

import numpy as np
import pytest

from image_tfrecords.storage import row_text
from image_tfrecords.storage.row_text import gather, join_rows

WAYS = [pytest.param(True, id="compiled"), pytest.param(False, id="python")]


@pytest.fixture(autouse=True)
def _built(request: pytest.FixtureRequest) -> None:
    callspec = getattr(request.node, "callspec", None)
    if not row_text.compiled() and (callspec is None or callspec.params.get("compiled", True)):
        pytest.skip("installed without the C part (make install builds it)")


@pytest.mark.parametrize("compiled", WAYS)
def test_rows_of_spans_picks_and_numbers(compiled: bool) -> None:
    data = b"cats/a.jpg,12\ndogs/b\xc3\xa9.png,7\n"
    text, ends = join_rows(2, [(data, np.array([0, 14]), np.array([10, 26])),
                               ([b"train", b"validation"], np.array([1, 0], dtype=np.int32)),
                               (np.array([-3, 2**62]),)], compiled=compiled)
    assert text == b"cats/a.jpg,validation,-3\n" + b"dogs/b\xc3\xa9.png,train,%d\n" % 2**62
    assert ends.tolist() == [25, len(text)]


@pytest.mark.parametrize("compiled", WAYS)
def test_separators_empty_values_and_no_rows(compiled: bool) -> None:
    assert join_rows(0, [(b"", [], [])], compiled=compiled)[0] == b""
    text, ends = join_rows(3, [([b"", b"x"], [0, 1, 0]), ([b""], [0, 0, 0])], sep=b"|", end=b";", compiled=compiled)
    assert text == b"|;x|;|;" and ends.tolist() == [2, 5, 7]
    assert join_rows(2, [], compiled=compiled)[0] == b"\n\n"


@pytest.mark.parametrize("compiled", WAYS)
def test_gather_reads_a_map(compiled: bool, tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(b"h\nrow one\nrow two\nrow three\n")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as lines:
        assert gather(lines, np.array([18, 2]), np.array([28, 10]), compiled=compiled) == b"row three\nrow one\n"


@pytest.mark.parametrize("compiled", WAYS)
@pytest.mark.parametrize("piece", [
    (b"abc", [0, 2], [2, 4]),  # past the end
    (b"abc", [-1, 0], [1, 1]),  # before the start
    (b"abc", [2, 0], [1, 1]),  # stops before it starts
    ([b"a"], [0, 1]),  # an index past the values
    ([b"a"], [0, -1]),  # a negative index (no wrapping round)
    ([1],),  # fewer numbers than rows
])
def test_out_of_range_is_a_value_error(compiled: bool, piece: tuple) -> None:
    with pytest.raises(ValueError):
        join_rows(2, [piece], compiled=compiled)


def test_compiled_and_python_agree_on_random_tables() -> None:
    rng = random.Random(7)
    for _ in range(50):
        count = rng.randrange(0, 40)
        data = bytes(rng.randrange(256) for _ in range(200))
        starts = np.array([rng.randrange(0, 200) for _ in range(count)], dtype=np.int64)
        stops = np.array([rng.randrange(int(a), 201) for a in starts], dtype=np.int64)
        values = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 5))) for _ in range(rng.randrange(1, 6))]
        index = np.array([rng.randrange(len(values)) for _ in range(count)], dtype=np.int64)
        numbers = np.array([rng.randrange(-2**63, 2**63) for _ in range(count)], dtype=np.int64)
        pieces = [(data, starts, stops), (values, index), (numbers,)]
        rng.shuffle(pieces)
        c_text, c_ends = join_rows(count, pieces, compiled=True)
        p_text, p_ends = join_rows(count, pieces, compiled=False)
        assert c_text == p_text and c_ends.tolist() == p_ends.tolist()
