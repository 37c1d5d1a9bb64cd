"""Image-quality signals of one image, from the thumbnail inspection already decoded.

Four numbers, taken from the upright image's ``thumbnail`` (a JPEG's 1/8-scale decode, which inspection
has already; other formats reduced to at most 256 pixels on the longest side):

* ``brightness``: mean grey level, 0-255;
* ``contrast``: standard deviation of the grey levels;
* ``sharpness``: variance of the 4-neighbour Laplacian of the grey image over the variance of the grey
  levels (plus one): the share of the image's detail at the finest scale, so it does not grow with
  contrast alone. Coarse: blur that spans fewer pixels than the thumbnail's scale is not seen;
* ``colourfulness``: mean over pixels of max(R, G, B) - min(R, G, B) (0 for an image stored as grey).

And the flags (``FLAGS``) those and the image's size give: ``dark``, ``bright``, ``flat``,
``blurry``, ``grey_as_colour``, ``tiny``, ``odd_aspect``; thresholds below, measured on the bench
corpus's photos and on darkened, blurred and greyed copies of them (docs/quality.md).
The perceptual hash shares the thumbnail's grey levels.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .thumbnail import Thumbnail, thumbnail

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


def measure(image: Any, width: int, height: int, channels: int) -> Quality:
    """The signals and flags of a Pillow ``image`` (upright: its thumbnail or the whole image) of a stored
    image of ``width`` x ``height`` pixels with ``channels`` channels."""
    return signals(thumbnail(image), width, height, channels)


def signals(thumb: Thumbnail, width: int, height: int, channels: int) -> Quality:
    """The signals of a ``thumbnail`` of a stored image of ``width`` x ``height`` pixels with ``channels``
    channels, and its flags. The thumbnail's sums are exact integers, so each signal is one division away
    from them: the same on every CPU."""
    brightness, variance, detail = thumb.brightness, thumb.variance, thumb.detail_variance
    sharpness = None if detail is None else detail / (variance + 1.0)
    contrast, colourfulness = variance ** 0.5, thumb.colourfulness
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
