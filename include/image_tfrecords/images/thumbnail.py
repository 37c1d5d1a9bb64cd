"""An image's thumbnail as numbers: its grey levels and its colourfulness, from one copy of its pixels.

The perceptual hash (``perceptual``) and the quality signals (``quality``) are both taken from this. A
JPEG's thumbnail is its 1/8-scale decode (inspection has it already); any other image is reduced here to at
most ``SIDE`` pixels on its longest side. Pillow hands the pixels over once (``tobytes``); per pixel, the
grey level is ITU-R 601 luma (as Pillow's mode L, unrounded), and ``max(R, G, B) - min(R, G, B)`` is half
the sum of ``|R-G|``, ``|G-B|`` and ``|B-R|``, so the colourfulness needs no per-pixel maximum. Every step
is a handful of numpy calls, whatever the size: at a JPEG thumbnail's few thousand pixels their fixed cost
is what counts. No BLAS (matrix products, ``dot``): its kernels round differently on other CPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIDE = 256  # the longest side the numbers are taken at
_LUMA = (0.299, 0.587, 0.114)  # ITU-R 601, as Pillow's mode L


@dataclass(frozen=True)
class Thumbnail:
    """``grey``: a float32 array of height x width grey levels (0-255); ``colourfulness``: the mean over
    pixels of max(R, G, B) - min(R, G, B) (0 for an image stored as grey)."""

    grey: Any
    colourfulness: float


_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")  # grey levels of 0-65535 (PNG's 16-bit grey)


def thumbnail(image: Any) -> Thumbnail:
    """The numbers of an upright Pillow ``image`` (alpha dropped; any mode Pillow converts to RGB; 16-bit
    grey scaled to 0-255, not clipped)."""
    import numpy as np
    from PIL import Image

    if image.mode in _SIXTEEN_BIT:
        image = image.convert("I")
    elif image.mode not in ("RGB", "L"):
        image = image.convert("RGB")
    if max(image.size) > SIDE:
        scale = SIDE / max(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.BOX)
    shape = (image.height, image.width)
    if image.mode == "I":
        levels = np.asarray(image, dtype=np.float32).reshape(shape)
        return Thumbnail(np.clip(levels, 0, 65535) * np.float32(255 / 65535), 0.0)
    data = np.frombuffer(image.tobytes(), np.uint8)
    if image.mode == "L":
        return Thumbnail(data.reshape(shape).astype(np.float32), 0.0)
    # Element by element, not a matrix product: BLAS kernels round differently from one CPU to another,
    # and the numbers must depend on the image alone.
    red, green, blue = data.reshape(-1, 3).T.astype(np.float32)  # three contiguous rows
    grey = red * np.float32(_LUMA[0])
    grey += green * np.float32(_LUMA[1])
    grey += blue * np.float32(_LUMA[2])
    spread = float(np.abs(red - green).sum() + np.abs(green - blue).sum() + np.abs(blue - red).sum())
    return Thumbnail(grey.reshape(shape), spread / (2 * max(1, grey.size)))
