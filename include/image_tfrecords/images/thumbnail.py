"""An image's thumbnail as the exact sums its perceptual hash and quality signals are made of.

The perceptual hash (``perceptual``) and the quality signals (``quality``) are both taken from this. A
JPEG's thumbnail is its 1/8-scale decode (inspection has it already); any other image is reduced here to at
most ``SIDE`` pixels on its longest side. Pillow hands the pixels over once (``tobytes``, or in place through
its Arrow export: ``quality.measured``).

Everything is integer arithmetic, so the numbers are exact: the same on every CPU, and the same from the
compiled pass (``_thumbstats``, built with the package where a C compiler is at hand: one call an image,
about 12 us for a JPEG's thumbnail) and from the numpy fallback here (a dozen calls; tests compare the
two). A pixel's grey level is 1000 x its ITU-R 601 luma, ``299 R + 587 G + 114 B`` (Pillow's mode L
unrounded); ``max(R, G, B) - min(R, G, B)`` is half of ``|R-G| + |G-B| + |B-R|``, so the colourfulness
needs no per-pixel maximum.

The hash (pHash): the grey levels averaged into 32 x 32 cells (box filter: each cell the mean of the pixels,
or parts of pixels, it covers; the parts are multiples of 1/32 pixel, so the sums are whole numbers; they are
divided by the power of two nearest below the pixel count, rounding down, which keeps the DCT's products in 64
bits and scales every cell alike), the 8 x 8 lowest frequencies of their DCT-II with the DCT's rows in 13-bit fixed
point (``dct_rows``), and one bit per coefficient but the DC term: above the median of the 63 or not.
"""

from __future__ import annotations

import math
from array import array
from functools import cache, lru_cache
from typing import Any, NamedTuple

SIDE = 256  # the longest side the numbers are taken at
CELLS = 32  # the hash averages the grey levels into CELLS x CELLS
LOW = 8  # the LOW x LOW lowest frequencies give the hash's bits (less the DC term)
BITS = LOW * LOW - 1  # 63
DCT_ONE = 1 << 13  # the DCT rows' fixed point: 1.0
LUMA = (299, 587, 114)  # ITU-R 601 x 1000, as Pillow's mode L (unrounded)
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # grey levels of 0-65535 (PNG's 16-bit grey)

try:  # built with the package where a C compiler was at hand (pyproject.toml's ext-modules)
    from . import _thumbstats
except ImportError:  # pragma: no cover - depends on how the package was installed
    _thumbstats = None


class Thumbnail(NamedTuple):
    """The sums of a ``width`` x ``height`` thumbnail's grey levels (x 1000): ``s1`` of them, ``s2`` of their
    squares; ``d1``, ``d2`` the same of the 4-neighbour Laplacian over the inner pixels (0 when a side is
    under 3 pixels); ``spread`` the sum of ``|R-G| + |G-B| + |B-R|`` (0 for an image stored as grey);
    ``bits`` the 63-bit perceptual hash. ``quality`` takes the signals from these."""

    width: int
    height: int
    s1: int
    s2: int
    d1: int
    d2: int
    spread: int
    bits: int

    @property
    def phash(self) -> str:
        """The hash as 16 hex digits (the top bit is always 0)."""
        return f"{self.bits:016x}"


@cache
def dct_rows() -> bytes:
    """The LOW lowest-frequency rows of the orthonormal DCT-II matrix of size CELLS, times DCT_ONE rounded
    (native int64, row by row): made here once for both passes."""
    rows = [round(math.cos(math.pi * (2 * x + 1) * k / (2 * CELLS)) * math.sqrt((1 if k else 0.5) * 2 / CELLS)
                  * DCT_ONE) for k in range(LOW) for x in range(CELLS)]
    return array("q", rows).tobytes()


def thumbnail(image: Any) -> Thumbnail:
    """The sums of an upright Pillow ``image`` (alpha dropped; any mode Pillow converts to RGB; 16-bit grey
    scaled to 0-255, not clipped), reduced to at most SIDE pixels a side first."""
    data, width, height, kind = pixels(image)
    sums = (_thumbstats.sums if _thumbstats is not None else numpy_sums)(data, width, height, kind, dct_rows())
    return Thumbnail(width, height, *sums)


def reduced(image: Any) -> Any:
    """A Pillow ``image`` as the passes take it: mode RGB, L or I (16-bit grey), at most SIDE pixels a side
    (box filter); the image itself when it is so already."""
    mode = image.mode
    if mode in _SIXTEEN_BIT:
        image = image.convert("I")
    elif mode != "RGB" and mode != "L":
        image = image.convert("RGB")
    width, height = image.size
    if width > SIDE or height > SIDE:
        from PIL import Image

        scale = SIDE / max(width, height)
        image = image.resize((max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BOX)
    return image


def pixels(image: Any) -> tuple[bytes, int, int, int]:
    """(pixels, width, height, kind) of a Pillow ``image``, ``reduced``, as the passes take them (see
    ``_thumbstats.c``): kind 3 for RGB bytes, 1 for grey bytes, 4 for 16-bit grey as int32 levels of 0-255000."""
    image = reduced(image)
    width, height = image.size
    if image.mode == "I":
        import numpy as np

        levels = np.clip(np.asarray(image, dtype=np.int64).reshape(height, width), 0, 65535)
        return (levels * 255000 // 65535).astype(np.int32).tobytes(), width, height, 4
    return image.tobytes(), width, height, 3 if image.mode == "RGB" else 1


def numpy_sums(data: bytes, width: int, height: int, kind: int, dct: bytes) -> tuple[int, int, int, int, int, int]:
    """``_thumbstats.sums`` in numpy (int64 throughout: exact, and no BLAS): the fallback where the package
    was installed without its compiled part, and the reference the tests hold that part to."""
    import numpy as np

    spread = 0
    if kind == 3:
        rgb = np.frombuffer(data, np.uint8).reshape(-1, 3).T.astype(np.int64)  # three contiguous rows
        red, green, blue = rgb
        grey = red * LUMA[0] + green * LUMA[1] + blue * LUMA[2]
        spread = int(np.abs(red - green).sum() + np.abs(green - blue).sum() + np.abs(blue - red).sum())
    elif kind == 1:
        grey = np.frombuffer(data, np.uint8).astype(np.int64) * 1000
    else:
        grey = np.clip(np.frombuffer(data, np.int32).astype(np.int64), 0, 255000)
    grey = grey.reshape(height, width)
    s1, s2 = int(grey.sum()), int((grey * grey).sum())
    d1 = d2 = 0
    if height > 2 and width > 2:
        detail = grey[1:-1, 1:-1] * 4 - grey[:-2, 1:-1] - grey[2:, 1:-1] - grey[1:-1, :-2] - grey[1:-1, 2:]
        d1, d2 = int(detail.sum()), int((detail * detail).sum())
    rows = np.frombuffer(dct, np.int64).reshape(LOW, CELLS)
    # the cells' sums over 2^floor(log2(pixels)): their means times a scale in [1, 2), which moves no bit
    means = (_cell_weights(height) @ grey @ _cell_weights(width).T) >> ((width * height).bit_length() - 1)
    low = (rows @ means @ rows.T).ravel()[1:]
    bits = low > np.partition(low, BITS // 2)[BITS // 2]  # above the median
    return s1, s2, d1, d2, spread, int.from_bytes(np.packbits(bits).tobytes(), "big") >> 1


@lru_cache(maxsize=512)
def _cell_weights(size: int) -> Any:
    """The CELLS x ``size`` int64 matrix of the overlap of each cell with each pixel, in 1/CELLS pixels: cell
    ``i`` spans [i size, (i + 1) size) and pixel ``p`` [CELLS p, CELLS p + CELLS) in those units."""
    import numpy as np

    cell = np.arange(CELLS, dtype=np.int64)[:, None]
    pixel = np.arange(size, dtype=np.int64)[None, :]
    high = np.minimum((cell + 1) * size, CELLS * pixel + CELLS)
    return np.clip(high - np.maximum(cell * size, CELLS * pixel), 0, None)
