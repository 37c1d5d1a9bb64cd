"""Inspect one image file: content hash, real format, upright size, channels, and decodability.

Decoding checks the whole bitstream, not only the header, so truncated or corrupt files are
caught before they reach a shard. JPEGs are decoded at reduced scale (Pillow's draft mode:
every entropy-coded byte is still parsed, the inverse DCT is cheap), which keeps it fast.
"""

from __future__ import annotations

import hashlib
import io
import warnings
from dataclasses import dataclass

# What tf.io.decode_image returns for each Pillow mode (channels=0, dtype uint8).
_JPEG_CHANNELS = {"L": 1, "RGB": 3}
_PNG_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3, "RGBA": 4}
MAX_PIXELS = 89_478_485  # Pillow's default decompression-bomb limit
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"  # the IEND chunk: libpng (and TensorFlow) need it


class RejectedImage(Exception):
    """A file that will not become a record; ``reason`` is a short machine-readable word."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageFacts:
    """What the label CSV and the shard writer need to know about one image."""

    sha256: str
    num_bytes: int
    format: str  # "jpeg" | "png": what the bytes are
    width: int
    height: int
    channels: int


def sniff_format(data: bytes) -> str | None:
    """The image format the bytes say they are, from magic numbers (None if unknown)."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tiff"
    return None


def inspect_image(data: bytes, max_pixels: int = MAX_PIXELS) -> ImageFacts:
    """Check that ``data`` is a complete JPEG or PNG and describe it; raise RejectedImage."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # the limit is max_pixels, checked below before any pixel is decoded
    if not data:
        raise RejectedImage("empty_file")
    fmt = sniff_format(data)
    if fmt is None:
        raise RejectedImage("not_an_image", "content is not a known image format")
    if fmt not in ("jpeg", "png"):
        raise RejectedImage("unsupported_format", fmt)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data), formats=["JPEG" if fmt == "jpeg" else "PNG"])
            width, height = image.size
            if width <= 0 or height <= 0:
                raise RejectedImage("corrupt", f"bad dimensions {width}x{height}")
            if width * height > max_pixels:
                raise RejectedImage("too_many_pixels", f"{width}x{height} exceeds {max_pixels} pixels")
            mode = image.mode
            if fmt == "jpeg":
                image.draft(mode, (max(1, width // 8), max(1, height // 8)))
            image.load()
            if fmt == "png" and data.rfind(_PNG_END) < 0:
                raise RejectedImage("corrupt", "PNG ends before its IEND chunk")
    except RejectedImage:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise RejectedImage("too_many_pixels", str(exc)) from exc
    except Exception as exc:  # Pillow raises many types for broken data
        raise RejectedImage("corrupt", f"{type(exc).__name__}: {exc}") from exc
    if fmt == "png" and mode == "P":
        channels = 4 if "transparency" in image.info else 3
    else:
        channels = (_JPEG_CHANNELS if fmt == "jpeg" else _PNG_CHANNELS).get(mode, 0)
    if not channels:
        raise RejectedImage("unsupported_format", f"{fmt} in colour mode {mode}")
    return ImageFacts(hashlib.sha256(data).hexdigest(), len(data), fmt, width, height, channels)
