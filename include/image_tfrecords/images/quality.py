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

from .thumbnail import Thumbnail, _thumbstats, dct_rows, numpy_sums, pixels, reduced, thumbnail

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
        return {"brightness": _cell(self.brightness), "contrast": _cell(self.contrast),
                "sharpness": _cell(self.sharpness), "colourfulness": _cell(self.colourfulness),
                "quality": "|".join(self.flags)}


def _cell(value: float | None) -> str:
    """A signal as a column: at most 3 decimals, no trailing zeros; "" when not measured."""
    return "" if value is None else f"{value:.3f}".rstrip("0").rstrip(".")


def measure(image: Any, width: int, height: int, channels: int) -> Quality:
    """The signals and flags of a Pillow ``image`` (upright: its thumbnail or the whole image) of a stored
    image of ``width`` x ``height`` pixels with ``channels`` channels."""
    return signals(thumbnail(image), width, height, channels)


def signals(thumb: Thumbnail, width: int, height: int, channels: int) -> Quality:
    """The signals of a ``thumbnail`` of a stored image of ``width`` x ``height`` pixels with ``channels``
    channels, and its flags. The thumbnail's sums are exact integers, so each signal is one division away
    from them: the same on every CPU."""
    values = _values(thumb)
    return Quality(*values, flags(*values, width, height, channels))


def columns(thumb: Thumbnail, width: int, height: int, channels: int) -> dict[str, str]:
    """The inspection's columns of a ``thumbnail`` (``signals(...).columns()``): what ``_thumbstats.measure``
    gives in one call, in the same operations."""
    return signals(thumb, width, height, channels).columns()


def _values(thumb: Thumbnail) -> tuple[float, float, float | None, float]:
    """(brightness, contrast, sharpness, colourfulness) from the exact sums: the numerators in Python's
    integers, so each is one correctly rounded division."""
    n, s1 = thumb.width * thumb.height, thumb.s1
    variance = (n * thumb.s2 - s1 * s1) / (n * n * 1_000_000)
    sharpness = None
    if thumb.width > 2 and thumb.height > 2:
        m, d1 = (thumb.width - 2) * (thumb.height - 2), thumb.d1
        sharpness = (m * thumb.d2 - d1 * d1) / (m * m * 1_000_000) / (variance + 1.0)
    return s1 / (1000 * n), variance ** 0.5, sharpness, thumb.spread / (2 * n)


def measured(image: Any, width: int, height: int, channels: int) -> tuple[str, dict[str, str]]:
    """(perceptual hash, columns) of an upright Pillow ``image`` (a thumbnail) of a stored image of ``width`` x
    ``height`` pixels with ``channels`` channels: inspection's path. One C call where the package has its
    compiled part (``_thumbstats.measure``: ``columns``' operations, so the same strings; an RGB image's
    pixels read where Pillow keeps them, through its Arrow export); else the numpy sums and ``columns``."""
    small = reduced(image)
    if _thumbstats is not None:
        if small.mode == "RGB":
            try:
                schema, array = small.__arrow_c_array__()
            except (AttributeError, ValueError):  # a Pillow before 11.2; rows not in one block
                pass
            else:
                return _thumbstats.measure_arrow(schema, array, small.width, small.height, dct_rows(), width, height,
                                                 channels)
        return _thumbstats.measure(*pixels(small), dct_rows(), width, height, channels)
    data, thumb_width, thumb_height, kind = pixels(small)
    thumb = Thumbnail(thumb_width, thumb_height, *numpy_sums(data, thumb_width, thumb_height, kind, dct_rows()))
    return thumb.phash, columns(thumb, width, height, channels)


def flags(brightness: float, contrast: float, sharpness: float | None, colourfulness: float, width: int,
          height: int, channels: int) -> tuple[str, ...]:
    """The flags (in ``FLAGS`` order) of an image with these signals and size."""
    short, long = min(width, height), max(width, height)
    marks = (brightness < DARK, brightness > BRIGHT, contrast < FLAT,
             contrast >= FLAT and sharpness is not None and sharpness < BLURRY,
             channels >= 3 and colourfulness < GREY, short < TINY, short > 0 and long / short > ODD_ASPECT)
    return tuple([flag for flag, marked in zip(FLAGS, marks, strict=True) if marked])


def parse_flags(text: str) -> list[str]:
    """The flags of a ``quality`` cell."""
    return [flag for flag in text.split("|") if flag]


if _thumbstats is not None:
    _thumbstats.thresholds(DARK, BRIGHT, FLAT, BLURRY, GREY, TINY, ODD_ASPECT, FLAGS)
