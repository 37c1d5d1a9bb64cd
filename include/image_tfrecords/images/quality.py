"""Image-quality signals of one image, from the thumbnail inspection already decoded.

Four numbers, taken from the upright image at most ``SIDE`` pixels on its longest side (a JPEG is
decoded at 1/8 scale by inspection, so this is its thumbnail; other formats are reduced here):

* ``brightness``: mean grey level, 0-255;
* ``contrast``: standard deviation of the grey levels;
* ``sharpness``: variance of the 4-neighbour Laplacian of the grey image over the variance of the grey
  levels (plus one): the share of the image's detail at the finest scale, so it does not grow with
  contrast alone. Coarse: blur that spans fewer pixels than the thumbnail's scale is not seen;
* ``colourfulness``: mean over pixels of max(R, G, B) - min(R, G, B) (0 for an image stored as grey).

And the flags (``FLAGS``) those and the image's size give: ``dark``, ``bright``, ``flat``,
``blurry``, ``grey_as_colour``, ``tiny``, ``odd_aspect``; thresholds below, measured on the bench
corpus's photos and on darkened, blurred and greyed copies of them (docs/quality.md).
About 0.15 ms an image on the bench corpus (thumbnails of about 70 x 60 pixels), with the perceptual hash
sharing its grey conversion.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIDE = 256  # the longest side the signals are taken at
DARK = 40.0  # brightness below: dark
BRIGHT = 235.0  # brightness above: bright (washed out)
FLAT = 10.0  # contrast below: flat (nearly one grey level)
BLURRY = 0.05  # sharpness below (and not flat): blurry
GREY = 3.0  # colourfulness below, in an image stored with colour channels: grey stored as colour
TINY = 32  # shorter side below, in pixels: tiny
ODD_ASPECT = 3.0  # longer side over shorter side above: odd aspect ratio
FLAGS = ("dark", "bright", "flat", "blurry", "grey_as_colour", "tiny", "odd_aspect")
SIGNALS = ("brightness", "contrast", "sharpness", "colourfulness")


@dataclass(frozen=True)
class Quality:
    """The signals of one image (``None``: not measured) and its flags."""

    brightness: float | None = None
    contrast: float | None = None
    sharpness: float | None = None
    colourfulness: float | None = None
    flags: tuple[str, ...] = ()

    def columns(self) -> dict[str, str]:
        """The inspection's (and labels.csv's) columns: signals with at most 3 decimals, flags joined by ``|``."""
        values = {name: getattr(self, name) for name in SIGNALS}
        return {**{name: "" if v is None else f"{v:.3f}".rstrip("0").rstrip(".") for name, v in values.items()},
                "quality": "|".join(self.flags)}


def measure(image: Any, width: int, height: int, channels: int, grey: Any = None) -> Quality:
    """The signals of a Pillow ``image`` (upright: its thumbnail or the whole image) of a stored image of
    ``width`` x ``height`` pixels with ``channels`` channels, and its flags; ``grey``: ``image`` in mode L,
    when the caller has it already (the perceptual hash's)."""
    import numpy as np
    from PIL import Image

    thumb = image if image.mode in ("RGB", "L") else image.convert("RGB")  # alpha dropped
    if max(thumb.size) > SIDE:
        scale = SIDE / max(thumb.size)
        thumb = thumb.resize((max(1, round(thumb.width * scale)), max(1, round(thumb.height * scale))),
                             Image.Resampling.BOX)
        grey = None
    pixels = np.asarray(thumb)
    if pixels.ndim == 3:  # channel by channel: a reduction over the short last axis is ten times slower
        r, g, b = pixels[..., 0], pixels[..., 1], pixels[..., 2]
        colourfulness = float((np.maximum(np.maximum(r, g), b) - np.minimum(np.minimum(r, g), b)).mean())
        grey = np.asarray(grey if grey is not None and grey.size == thumb.size else thumb.convert("L"),
                          dtype=np.float32)
    else:
        colourfulness, grey = 0.0, pixels.astype(np.float32)
    detail = grey[1:-1, 1:-1] * 4 - grey[:-2, 1:-1] - grey[2:, 1:-1] - grey[1:-1, :-2] - grey[1:-1, 2:]
    variance = float(grey.var())
    brightness, contrast = float(grey.mean()), variance ** 0.5
    sharpness = float(detail.var() / (variance + 1.0)) if detail.size else None
    return Quality(brightness, contrast, sharpness, colourfulness,
                   flags(brightness, contrast, sharpness, colourfulness, width, height, channels))


def flags(brightness: float, contrast: float, sharpness: float | None, colourfulness: float, width: int,
          height: int, channels: int) -> tuple[str, ...]:
    """The flags (in ``FLAGS`` order) of an image with these signals and size."""
    out = []
    if brightness < DARK:
        out.append("dark")
    if brightness > BRIGHT:
        out.append("bright")
    if contrast < FLAT:
        out.append("flat")
    elif sharpness is not None and sharpness < BLURRY:
        out.append("blurry")
    if channels >= 3 and colourfulness < GREY:
        out.append("grey_as_colour")
    if min(width, height) < TINY:
        out.append("tiny")
    if min(width, height) and max(width, height) / min(width, height) > ODD_ASPECT:
        out.append("odd_aspect")
    return tuple(out)


def parse_flags(text: str) -> list[str]:
    """The flags of a ``quality`` cell."""
    return [flag for flag in text.split("|") if flag]
