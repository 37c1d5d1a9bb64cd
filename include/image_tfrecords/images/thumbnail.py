"""An image's thumbnail as numbers: its grey levels and its colourfulness, from one copy of its pixels.

The perceptual hash (``perceptual``) and the quality signals (``quality``) are both taken from this. A
JPEG's thumbnail is its 1/8-scale decode (inspection has it already); any other image is reduced here to at
most ``SIDE`` pixels on its longest side. Pillow hands the pixels over once (``tobytes``), and one matrix
product gives, per pixel, the grey level (ITU-R 601 luma, as Pillow's mode L, unrounded) and the three
differences R-G, G-B, B-R: ``max(R, G, B) - min(R, G, B)`` is half the sum of their absolute values, so the
colourfulness needs no per-pixel maximum. Every step is a handful of numpy calls, whatever the size: at a
JPEG thumbnail's few thousand pixels their fixed cost is what counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

SIDE = 256  # the longest side the numbers are taken at
# rows: grey (luma), R-G, G-B, B-R; columns: R, G, B
_MIX = ((0.299, 0.587, 0.114), (1.0, -1.0, 0.0), (0.0, 1.0, -1.0), (-1.0, 0.0, 1.0))


@cache
def _mix() -> Any:
    import numpy as np

    return np.array(_MIX, np.float32)


@dataclass(frozen=True)
class Thumbnail:
    """``grey``: a float32 array of height x width grey levels (0-255); ``colourfulness``: the mean over
    pixels of max(R, G, B) - min(R, G, B) (0 for an image stored as grey)."""

    grey: Any
    colourfulness: float


def thumbnail(image: Any) -> Thumbnail:
    """The numbers of an upright Pillow ``image`` (alpha dropped; any mode Pillow converts to RGB)."""
    import numpy as np
    from PIL import Image

    if image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    if max(image.size) > SIDE:
        scale = SIDE / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.BOX)
    data = np.frombuffer(image.tobytes(), np.uint8)
    if image.mode == "L":
        return Thumbnail(data.reshape(image.height, image.width).astype(np.float32), 0.0)
    mixed = _mix() @ data.reshape(-1, 3).T.astype(np.float32)  # 4 rows of pixels: each row contiguous
    grey = mixed[0].reshape(image.height, image.width)
    return Thumbnail(grey, float(np.abs(mixed[1:]).sum()) / (2 * max(1, grey.size)))
