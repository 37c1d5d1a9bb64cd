"""The thumbnail's sums (``images.thumbnail``): the compiled pass and the numpy fallback give the same exact
numbers, and the hash is the pHash it says it is."""

from __future__ import annotations

import io
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from image_tfrecords.images import thumbnail as thumbs
from image_tfrecords.images.perceptual import distance, perceptual_hash
from image_tfrecords.images.quality import columns

ROOT = Path(__file__).resolve().parents[2]
compiled = pytest.mark.skipif(thumbs._thumbstats is None, reason="the package was installed without its C part")


def _cases(count: int) -> list[tuple[bytes, int, int, int]]:
    """Random pixels of every kind and many shapes (1 x 1 to 256 x 256), flat ones, and the extremes."""
    rng = np.random.default_rng(5)
    out = []
    for i in range(count):
        width, height, kind = int(rng.integers(1, 257)), int(rng.integers(1, 257)), (1, 3, 4)[i % 3]
        if kind == 4:
            data = rng.integers(-10, 255_010, width * height).astype(np.int32).tobytes()  # clipped to 0-255000
        elif i % 5 == 0:
            data = bytes([int(rng.integers(0, 256))]) * (width * height * kind)  # flat: every coefficient ties
        else:
            data = rng.integers(0, 256, width * height * kind, dtype=np.uint8).tobytes()
        out.append((data, width, height, kind))
    out += [(b"\xff" * 256 * 256 * 3, 256, 256, 3), (np.full(256 * 256, 255_000, np.int32).tobytes(), 256, 256, 4),
            (bytes(range(256)) * 3, 256, 1, 3), (b"\x00\xff\x00", 1, 1, 3)]
    return out


@compiled
def test_the_compiled_pass_gives_the_numpy_fallbacks_numbers() -> None:
    rows = thumbs.dct_rows()
    for data, width, height, kind in _cases(600):
        assert thumbs._thumbstats.sums(data, width, height, kind, rows) == \
            thumbs.numpy_sums(data, width, height, kind, rows), (width, height, kind)


@compiled
def test_the_compiled_columns_are_the_python_columns() -> None:
    """``_thumbstats.measure`` gives ``columns``' strings and the hash's digits, flags included: thumbnails of
    every kind (flat, dark, bright, grey, noisy, tiny, one pixel wide) and stored sizes (tiny, elongated,
    none) and channel counts."""
    rows = thumbs.dct_rows()
    rng = np.random.default_rng(8)
    cases = _cases(300)
    for level in (0, 3, 128, 250, 255):  # flat images at the thresholds' ends
        cases.append((bytes([level]) * (40 * 30 * 3), 40, 30, 3))
    for number, (data, width, height, kind) in enumerate(cases):
        stored = [(width * 8, height * 8), (int(rng.integers(1, 40)), int(rng.integers(1, 4000))), (0, 10)]
        for (stored_width, stored_height), channels in zip(stored, (3, 1, 4), strict=True):
            thumb = thumbs.Thumbnail(width, height, *thumbs.numpy_sums(data, width, height, kind, rows))
            expected = (thumb.phash, columns(thumb, stored_width, stored_height, channels))
            got = thumbs._thumbstats.measure(data, width, height, kind, rows, stored_width, stored_height, channels)
            assert got == expected, (number, width, height, kind, stored_width, stored_height, channels)


@compiled
def test_pillows_arrow_export_gives_what_its_bytes_give() -> None:
    """``measure_arrow`` (an RGB image's pixels where Pillow keeps them, 4 bytes a pixel) is ``measure`` of the
    same image's ``tobytes``; an array that is not Pillow's RGB is refused."""
    rows = thumbs.dct_rows()
    rng = np.random.default_rng(3)
    for _ in range(200):
        width, height = int(rng.integers(1, 257)), int(rng.integers(1, 257))
        image = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        schema, array = image.__arrow_c_array__()
        assert thumbs._thumbstats.measure_arrow(schema, array, width, height, rows, width * 4, height * 4, 3) == \
            thumbs._thumbstats.measure(image.tobytes(), width, height, 3, rows, width * 4, height * 4, 3)
    grey = Image.new("L", (8, 8))
    with pytest.raises(ValueError, match="not an Arrow array of RGB pixels"):
        thumbs._thumbstats.measure_arrow(*grey.__arrow_c_array__(), 8, 8, rows, 8, 8, 1)
    with pytest.raises(ValueError, match="not an Arrow array of RGB pixels"):  # the size does not match
        thumbs._thumbstats.measure_arrow(*image.__arrow_c_array__(), width + 1, height, rows, 8, 8, 3)


@compiled
def test_the_compiled_pass_refuses_what_it_cannot_hold() -> None:
    rows = thumbs.dct_rows()
    with pytest.raises(ValueError, match="256 pixels a side"):
        thumbs._thumbstats.sums(b"\x00" * 257 * 3, 257, 1, 3, rows)
    with pytest.raises(ValueError, match="kind"):
        thumbs._thumbstats.sums(b"\x00" * 4, 2, 2, 2, rows)
    with pytest.raises(ValueError, match="wrong length"):
        thumbs._thumbstats.sums(b"\x00" * 11, 2, 2, 3, rows)
    with pytest.raises(ValueError, match="wrong length"):
        thumbs._thumbstats.sums(b"\x00" * 12, 2, 2, 3, rows[:-8])


def test_the_sums_are_the_definitions() -> None:
    """s1, s2, d1, d2 and the spread, worked out in Python integers for a small image."""
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (5, 7, 3))
    grey = [[299 * int(r) + 587 * int(g) + 114 * int(b) for r, g, b in row] for row in pixels]
    laplacian = [4 * grey[y][x] - grey[y - 1][x] - grey[y + 1][x] - grey[y][x - 1] - grey[y][x + 1]
                 for y in range(1, 4) for x in range(1, 6)]
    s1, s2, d1, d2, spread, _ = thumbs.numpy_sums(pixels.astype(np.uint8).tobytes(), 7, 5, 3, thumbs.dct_rows())
    assert s1 == sum(map(sum, grey)) and s2 == sum(v * v for row in grey for v in row)
    assert d1 == sum(laplacian) and d2 == sum(v * v for v in laplacian)
    assert spread == sum(abs(int(r) - int(g)) + abs(int(g) - int(b)) + abs(int(b) - int(r))
                         for row in pixels for r, g, b in row)


def test_the_hash_is_the_float_phash_but_for_near_ties() -> None:
    """The fixed-point hash against pHash taken in floats (area averages, orthonormal DCT, median) on photo-like
    images: the same bits but where a coefficient sits within rounding of the median."""
    rng = np.random.default_rng(9)
    for _ in range(40):
        height, width = int(rng.integers(40, 200)), int(rng.integers(40, 200))
        base = rng.normal(0, 1, (height // 8 + 2, width // 8 + 2, 3))
        pixels = np.kron(base, np.ones((8, 8, 1)))[:height, :width] * 40 + 128 + rng.normal(0, 6, (height, width, 3))
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))
        grey = np.asarray(image, np.float64) @ [0.299, 0.587, 0.114]
        cells = thumbs._cell_weights(height) @ grey @ thumbs._cell_weights(width).T
        k, x = np.arange(8)[:, None], np.arange(32)[None, :]
        dct = np.cos(np.pi * (2 * x + 1) * k / 64) * np.sqrt(2 / 32)
        dct[0] /= np.sqrt(2)
        low = (dct @ cells @ dct.T).ravel()[1:]
        bits = low > np.median(low)
        expected = f"{int(''.join('1' if b else '0' for b in bits), 2):016x}"
        assert distance(perceptual_hash(image), expected) <= 1


SCRIPT = """
import numpy as np
from image_tfrecords.images import thumbnail as t
from image_tfrecords.images.perceptual import perceptual_hash
from image_tfrecords.images.quality import measure, measured
from PIL import Image
rng = np.random.default_rng(4)
for _ in range(20):
    shape = (int(rng.integers(3, 300)), int(rng.integers(3, 300)), 3)
    image = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8))
    for mode in ("RGB", "L", "I;16"):
        print(perceptual_hash(image.convert(mode)), measure(image, image.width, image.height, 3).columns(),
              measured(image.convert(mode), image.width * 8, image.height, 1 if mode != "RGB" else 3))
print(t._thumbstats is not None)
"""


@compiled
def test_inspection_gives_the_same_columns_without_the_compiled_part(tmp_path: Path) -> None:
    """An install without a C compiler (the module hidden) publishes the same hashes and signals."""
    hidden = tmp_path / "image_tfrecords_no_c.py"
    hidden.write_text("import sys\nsys.modules['image_tfrecords.images._thumbstats'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "include"), str(tmp_path)])}
    with_c = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, env=env)
    without = subprocess.run([sys.executable, "-c", "import image_tfrecords_no_c\n" + SCRIPT], capture_output=True,
                             text=True, check=True, env=env)
    assert with_c.stdout.splitlines()[-1] == "True" and without.stdout.splitlines()[-1] == "False"
    assert with_c.stdout.splitlines()[:-1] == without.stdout.splitlines()[:-1]


def test_dct_rows_fit_the_bounds_the_sums_rely_on() -> None:
    rows = np.frombuffer(thumbs.dct_rows(), np.int64).reshape(8, 32)
    assert np.abs(rows).max() <= 1 << 11
    assert rows[0, 0] == round(thumbs.DCT_ONE / math.sqrt(32))
    assert abs(float((rows.astype(np.float64) @ rows.T.astype(np.float64))[3, 3]) / thumbs.DCT_ONE ** 2 - 1) < 1e-3


def test_a_jpeg_thumbnail_and_its_png_twin_hash_alike() -> None:
    image = Image.fromarray(np.random.default_rng(1).integers(0, 256, (60, 80, 3), dtype=np.uint8))
    png = io.BytesIO()
    image.save(png, "PNG")
    assert perceptual_hash(Image.open(io.BytesIO(png.getvalue()))) == perceptual_hash(image)
