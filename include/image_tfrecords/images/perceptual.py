"""A perceptual hash of an image, for finding near-duplicates (re-encodes, resizes, small crops).

pHash (Zauner, 2010): the upright image as 32 x 32 grey pixels (area averages), their 2-D DCT, and
one bit per coefficient of the 8 x 8 lowest frequencies but the DC term: above the median of those
63 or not. 64 bits as 16 hex digits (the top bit is always 0). Inspection computes it from the grey
levels of the thumbnail it has already decoded (``thumbnail``: a JPEG at 1/8 scale; 32 x 32 needs no
more), in whole numbers (the cells' sums exact, the DCT's rows in 13-bit fixed point), in the same pass
as the quality signals.

Why pHash, not dHash or PDQ: on photos and their variants (``tests/near_duplicates_corpus.py``),
JPEG re-encodes and EXIF-rotated copies change at most 2 of the 63 bits, brightness +-10% at most 4,
resizes and PNG/WebP re-encodes at most 6, crops of up to 5% a side 12 at the 90th percentile, while
distinct photos differ in 16 or more; dHash (gradients of a 9 x 8 image) moves more under crops, and
PDQ's 256 bits cost a 64 x 64 image and four times the index. Written here (C, with a numpy fallback; no
SciPy or ImageHash dependency).
"""

from __future__ import annotations

from typing import Any

from .thumbnail import BITS, thumbnail

__all__ = ["BITS", "distance", "perceptual_hash"]


def perceptual_hash(image: Any) -> str:
    """The pHash of a Pillow image that is upright (16 hex digits)."""
    return thumbnail(image).phash


def distance(a: str, b: str) -> int:
    """The number of bits two hashes differ in."""
    return (int(a, 16) ^ int(b, 16)).bit_count()
