"""A perceptual hash of an image, for finding near-duplicates (re-encodes, resizes, small crops).

pHash (Zauner, 2010): the upright image as 32 x 32 grey pixels (area averages), their 2-D DCT, and
one bit per coefficient of the 8 x 8 lowest frequencies but the DC term: above the median of those
63 or not. 64 bits as 16 hex digits (the top bit is always 0). Inspection computes it from the grey
levels of the thumbnail it has already decoded (``thumbnail``: a JPEG at 1/8 scale; 32 x 32 needs no
more). Area averaging and the DCT are both linear, so they are one product on each side: the 8 x h
matrix (DCT rows times the vertical averaging weights) and the w x 8 one, kept per side length.

Why pHash, not dHash or PDQ: on photos and their variants (``tests/near_duplicates_corpus.py``),
JPEG re-encodes and EXIF-rotated copies change at most 2 of the 63 bits, brightness +-10% at most 4,
resizes and PNG/WebP re-encodes at most 6, crops of up to 5% a side 12 at the 90th percentile, while
distinct photos differ in 16 or more; dHash (gradients of a 9 x 8 image) moves more under crops, and
PDQ's 256 bits cost a 64 x 64 image and four times the index. Written here with numpy (no SciPy or
ImageHash dependency).
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import Any

from .thumbnail import thumbnail

SIDE = 32  # the grey image the DCT is taken of
LOW = 8  # the LOW x LOW lowest frequencies give the bits (less the DC term)
BITS = LOW * LOW - 1  # 63


@cache
def _dct_matrix() -> Any:
    """The LOW lowest-frequency rows of the orthonormal DCT-II matrix of size SIDE."""
    import numpy as np

    k = np.arange(LOW)[:, None]
    x = np.arange(SIDE)[None, :]
    matrix = np.cos(np.pi * (2 * x + 1) * k / (2 * SIDE)) * np.sqrt(2 / SIDE)
    matrix[0] /= np.sqrt(2)
    return matrix.astype(np.float32)


def _area_weights(size: int) -> Any:
    """The SIDE x ``size`` matrix that averages ``size`` pixels into SIDE (each output pixel the mean of the
    input pixels, or parts of them, its span covers: a box filter)."""
    import numpy as np

    edges = np.arange(SIDE + 1) * (size / SIDE)
    left, right = edges[:-1, None], edges[1:, None]
    pixel = np.arange(size)[None, :]
    overlap = np.clip(np.minimum(right, pixel + 1) - np.maximum(left, pixel), 0, None)
    return overlap / (size / SIDE)


@lru_cache(maxsize=1024)
def _projection(size: int) -> Any:
    """The LOW x ``size`` matrix that takes ``size`` pixels along one axis to the LOW lowest DCT frequencies
    at SIDE pixels."""
    import numpy as np

    return _dct_matrix().astype(np.float64) @ _area_weights(size)


def hash_of_grey(grey: Any) -> str:
    """The pHash of an upright image's grey levels (a 2-D float32 array, ``thumbnail``'s), 16 hex digits."""
    import numpy as np

    # 63 coefficients: the 8 x 8 less DC. BLAS kernels round differently on other CPUs: in float64, and rounded
    # to 1e-6 (the last bits cannot move a coefficient across the median of an almost flat image's noise)
    low = np.round((_projection(grey.shape[0]) @ grey.astype(np.float64) @ _projection(grey.shape[1]).T).ravel()[1:], 6)
    bits = low > np.partition(low, BITS // 2)[BITS // 2]  # above the median
    return f"{int.from_bytes(np.packbits(bits).tobytes(), 'big') >> 1:016x}"  # 63 bits, the first the highest


def perceptual_hash(image: Any) -> str:
    """The pHash of a Pillow image that is upright (16 hex digits)."""
    return hash_of_grey(thumbnail(image).grey)


def distance(a: str, b: str) -> int:
    """The number of bits two hashes differ in."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
