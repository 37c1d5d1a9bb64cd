"""Decode a record's image with Pillow, for the random-access readers (PyTorch, Grain): no TensorFlow."""

from __future__ import annotations

import io
from typing import Any

import numpy as np

_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


def decode_image(image: bytes | np.ndarray, channels: int | None = 3,
                 image_size: tuple[int, int] | None = None) -> np.ndarray:
    """``uint8 [height, width, channels]``: a record's ``image`` (encoded bytes, or raw pixels) decoded.

    ``channels`` 1, 3 or 4 converts (grey repeated to RGB, RGB to grey by luminance, alpha dropped or
    added opaque), as ``load_split`` does; None keeps the stored channels (palette images become RGB or
    RGBA). ``image_size=(height, width)`` resizes (bilinear; the aspect ratio is not kept).
    """
    from PIL import Image

    if channels not in (None, 1, 3, 4):
        raise ValueError(f"channels must be 1, 3, 4 or None, not {channels!r}")
    if isinstance(image, np.ndarray):
        if image_size is None and (channels is None or image.shape[-1] == channels):
            return image
        picture = Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image, _MODES[image.shape[-1]])
    else:
        picture = Image.open(io.BytesIO(image))
    mode = _MODES[channels] if channels else _stored_mode(picture)
    if picture.mode != mode:
        picture = picture.convert(mode)
    if image_size is not None:
        picture = picture.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
    pixels = np.array(picture)  # a writable copy
    return pixels[..., None] if pixels.ndim == 2 else pixels


def _stored_mode(picture: Any) -> str:
    """The mode that keeps a picture's channels: L, LA, RGB or RGBA."""
    if picture.mode in ("L", "LA", "RGB", "RGBA"):
        return picture.mode
    if picture.mode in ("1", "I", "I;16", "F"):
        return "L"
    if picture.mode in ("P", "PA"):
        return "RGBA" if picture.mode == "PA" or "transparency" in picture.info else "RGB"
    return "RGBA" if "A" in picture.getbands() else "RGB"
