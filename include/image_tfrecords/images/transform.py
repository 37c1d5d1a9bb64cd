"""Image options: resize, re-encode, fixed channels, raw pixels (``resize``, ``fit``, ``upscale``,
``encoding``, ``jpeg_quality``, ``channels``).

What a record stores is decided in two places, so each image is decoded and encoded once:

- ``split`` knows each image's upright size and channels from inspection and computes, by arithmetic
  only, the record's size, channels and format (``Output``); an image the options leave unchanged is
  stored as inspection decided (byte for byte for JPEG/PNG);
- the write task that writes its shard makes the others (``make_image``): decode, orient upright
  (EXIF), convert channels, resize, encode. Same inputs, same Pillow: same bytes.

Rules, stated in docs/features.md:

- ``resize``: ``none`` | ``longest:N`` (longest side N) | ``shortest:N`` (shortest side N, as ImageNet
  pipelines keep 256) | ``WxH`` (exactly W wide, H high, by ``fit``: ``crop`` scales to cover and cuts the
  centre, ``pad`` scales to fit and centres on black (zero, transparent), ``stretch`` ignores the aspect).
  Sides are ``round(side * scale)``, at least 1. Without ``upscale`` the scale never exceeds 1: a smaller
  image keeps its pixels (``crop`` then cuts it to at most WxH, ``pad`` still pads to WxH, ``stretch``
  shrinks only the sides that are too long). Filter: Lanczos (Pillow's ``LANCZOS``); a JPEG is first
  decoded at a reduced DCT scale no smaller than twice the target (as ``Image.thumbnail`` does).
- ``channels``: 0 keeps what the image has (1 grey, 2 grey+alpha, 3 RGB, 4 RGBA); 1, 3, 4 convert
  (grey repeated to RGB; RGB to grey by ITU-R 601 luma; alpha dropped, or added opaque). 16-bit images
  become 8-bit (the high byte), as ``tf.io.decode_png(dtype=uint8)`` gives them.
- ``encoding``: ``original`` keeps each image's stored format (JPEG or PNG; PNG when an alpha channel
  is asked of a JPEG) and re-encodes only images the options change; ``jpeg`` re-encodes every image
  at ``jpeg_quality`` (alpha dropped: channels 4 is refused); ``png`` stores PNGs (an unchanged PNG
  byte for byte); ``raw`` stores the decoded ``uint8`` pixels, row-major H x W x C, as ``image/raw`` with
  ``image/shape`` (no ``image/encoded``); channels 0 means 3 for raw.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, replace
from typing import Any

from ..errors import ConfigError
from ..options import BY_NAME, CHANNELS, default

RESIZE_KINDS = ("none", "longest", "shortest", "exact")
FILTER = "lanczos"
MAX_SIDE = 65_500  # the largest side a JPEG can have (libjpeg's JPEG_MAX_DIMENSION)
_RESIZE = re.compile(r"^(?:(longest|shortest):(\d+)|(\d+)x(\d+))$")
_MODES = {1: "L", 2: "LA", 3: "RGB", 4: "RGBA"}


@dataclass(frozen=True)
class Resize:
    """A parsed ``resize`` option."""

    kind: str = "none"  # none | longest | shortest | exact
    width: int = 0  # longest/shortest: the side N; exact: W
    height: int = 0  # exact: H

    def __str__(self) -> str:
        if self.kind == "none":
            return "none"
        if self.kind == "exact":
            return f"{self.width}x{self.height}"
        return f"{self.kind}:{self.width}"


def parse_resize(text: Any) -> Resize:
    """``"none"``, ``"longest:N"``, ``"shortest:N"`` or ``"WxH"``; ConfigError otherwise."""
    if not isinstance(text, str):
        raise ConfigError(f"resize must be a string like none, longest:512, shortest:256 or 224x224, not {text!r}")
    value = text.strip().lower()
    if value in ("", "none"):
        return Resize()
    match = _RESIZE.match(value)
    if not match:
        raise ConfigError(f"resize {text!r} is not one of none, longest:N, shortest:N or WxH (e.g. 224x224)")
    sides = [int(v) for v in match.groups()[1:] if v is not None]
    if not all(1 <= side <= MAX_SIDE for side in sides):
        raise ConfigError(f"resize {text!r}: sizes must be whole numbers in [1, {MAX_SIDE}]")
    if match.group(1):
        return Resize(match.group(1), sides[0])
    return Resize("exact", sides[0], sides[1])


@dataclass(frozen=True)
class ImageOptions:
    """The image options of a build (``BuildConfig.image_options``)."""

    resize: Resize = Resize()
    fit: str = default("fit")
    upscale: bool = default("upscale")
    encoding: str = default("encoding")
    jpeg_quality: int = default("jpeg_quality")
    channels: int = default("channels")

    @property
    def is_default(self) -> bool:
        """True when every record is stored as inspection decided (the tutorials' classic records)."""
        return self.resize.kind == "none" and self.encoding == "original" and self.channels == 0

    def describe(self) -> dict[str, Any]:
        """The manifest's ``image`` entry."""
        return {"resize": str(self.resize), "fit": self.fit, "upscale": self.upscale, "encoding": self.encoding,
                "jpeg_quality": self.jpeg_quality, "channels": self.channels, "filter": FILTER}


def check_options(opts: ImageOptions) -> None:
    """ConfigError for values or combinations that cannot work."""
    for name in ("fit", "encoding", "jpeg_quality", "upscale"):
        BY_NAME[name].check(getattr(opts, name))
    if type(opts.channels) is not int or opts.channels not in CHANNELS:
        raise ConfigError(f"channels must be 0 (as decoded), 1 (grey), 3 (RGB) or 4 (RGBA), not {opts.channels!r}")
    if opts.fit != "crop" and opts.resize.kind != "exact":
        raise ConfigError(f"fit {opts.fit} applies to a WxH resize only, not to resize {opts.resize}")
    if opts.encoding == "jpeg" and opts.channels == 4:
        raise ConfigError("channels 4 needs an alpha channel, which JPEG has not: use encoding png or raw")


@dataclass(frozen=True)
class Output:
    """What one record stores: its size, channels, format, and whether the writer makes it."""

    width: int
    height: int
    channels: int
    format: str  # jpeg | png | raw
    made: bool  # decoded and encoded by the writer (else: stored as inspection decided)
    resized: bool

    @property
    def num_bytes(self) -> int:
        """The raw tensor's size (raw records), else 0: unknown until the image is encoded."""
        return self.width * self.height * self.channels if self.format == "raw" else 0

    @classmethod
    def of_row(cls, row: dict[str, str]) -> Output:
        """The planned output of a labels.csv row (``planned_facts``)."""
        return cls(int(row["width"]), int(row["height"]), int(row["channels"]), row["format"], True,
                   "resize" in row["transform"].split("+"))


def _scaled(side: int, scale: float) -> int:
    return max(1, round(side * scale))


def _fit_scale(width: int, height: int, opts: ImageOptions) -> float:
    """The scale that makes ``width`` x ``height`` cover (crop) or fit inside (pad) an exact ``WxH``,
    capped at 1 without ``upscale``."""
    scale = (max if opts.fit == "crop" else min)(opts.resize.width / width, opts.resize.height / height)
    return scale if opts.upscale else min(scale, 1.0)


def resized_size(width: int, height: int, resize: Resize, fit: str, upscale: bool) -> tuple[int, int]:
    """The record's size for an upright image of ``width`` x ``height``."""
    if resize.kind == "none":
        return width, height
    limit = (lambda s: s) if upscale else (lambda s: min(s, 1.0))
    if resize.kind in ("longest", "shortest"):
        side = max(width, height) if resize.kind == "longest" else min(width, height)
        scale = limit(resize.width / side)
        return _scaled(width, scale), _scaled(height, scale)
    target_w, target_h = resize.width, resize.height
    if fit == "stretch":
        return (target_w, target_h) if upscale else (min(target_w, width), min(target_h, height))
    if fit == "pad":
        return target_w, target_h
    scale = _fit_scale(width, height, ImageOptions(resize, fit, upscale))  # crop: cover, then cut the centre
    return min(target_w, _scaled(width, scale)), min(target_h, _scaled(height, scale))


def output_of(opts: ImageOptions, stored_format: str, width: int, height: int, channels: int) -> Output:
    """The record an inspected image (stored as ``stored_format``, upright size, channels) becomes."""
    out_w, out_h = resized_size(width, height, opts.resize, opts.fit, opts.upscale)
    if opts.encoding == "raw":
        out_c = opts.channels or 3
    elif opts.channels:
        out_c = opts.channels
    else:
        out_c = channels
    if opts.encoding == "original":
        fmt = "png" if stored_format == "jpeg" and out_c in (2, 4) else stored_format
    else:
        fmt = opts.encoding
    if fmt == "jpeg" and out_c in (2, 4):  # JPEG has no alpha: drop it
        out_c -= 1
    resized = (out_w, out_h) != (width, height)
    made = resized or out_c != channels or fmt != stored_format or opts.encoding in ("jpeg", "raw")
    return Output(out_w, out_h, out_c, fmt, made, resized)


def planned_facts(opts: ImageOptions, fmt: str, width: str, height: str, channels: str, transform: str,
                  encoded_sha256: str, encoded_bytes: str) -> tuple[str, str, str, str, str, str, str]:
    """A record's (width, height, channels, format, transform, encoded_sha256, encoded_bytes) under ``opts``,
    from its inspected facts (labels.csv text). A record the writer makes has no ``encoded_sha256`` yet
    (and ``encoded_bytes`` only for raw pixels, whose size is known): that is how the writer knows it."""
    out = output_of(opts, fmt, int(width), int(height), int(channels))
    if not out.made:
        return width, height, channels, fmt, transform, encoded_sha256, encoded_bytes
    steps = [transform] if transform else []
    if out.resized:
        steps.append("resize")
    if out.channels != int(channels):
        steps.append(f"channels_{out.channels}")
    steps.append(f"to_{out.format}")
    return (str(out.width), str(out.height), str(out.channels), out.format, "+".join(steps), "",
            str(out.num_bytes) if out.format == "raw" else "")


def too_big(planned: tuple[str, ...], max_pixels: int) -> str:
    """Why a record of ``planned_facts`` cannot be made (more than ``max_pixels``, or a JPEG side over
    ``MAX_SIDE``), or ``""``."""
    width, height, fmt = int(planned[0]), int(planned[1]), planned[3]
    if width * height > max_pixels:
        return f"resize makes it {width}x{height}, more than max_pixels {max_pixels}"
    if fmt == "jpeg" and max(width, height) > MAX_SIDE:
        return f"a {width}x{height} JPEG: JPEG sides are at most {MAX_SIDE} px"
    return ""


def planned_bytes(encoded_bytes: str, fmt: str, width: str, height: str, channels: str, jpeg_quality: int) -> int:
    """A record's image size for planning shards: known, or estimated for an image the writer will encode
    (JPEG at quality Q: about 0.1 to 0.7 bytes per pixel and channel; PNG: 0.6 of the raw size)."""
    if encoded_bytes:
        return int(encoded_bytes)
    raw = int(width) * int(height) * int(channels)
    if fmt == "jpeg":
        return max(1, int(raw * (0.08 + 0.6 * (jpeg_quality / 100) ** 4)))
    return max(1, int(raw * 0.6))


def planned_sizes(records: Any, jpeg_quality: int, uri: str) -> Any:
    """``planned_bytes`` of each record of ``records`` (a polars frame of records.csv's rows, read from ``uri``)
    as a numpy int64 array: the stored size where it is known, else planned from the image's facts."""
    import numpy as np

    from ..errors import BuildError
    from ..storage.tables import polars

    pl = polars()
    try:
        sizes = records["encoded_bytes"].cast(pl.Int64).fill_null(0).to_numpy().astype(np.int64, copy=True)
    except pl.exceptions.InvalidOperationError as exc:
        raise BuildError(f"{uri}: an encoded_bytes that is not a number ({exc})") from exc
    for i in np.flatnonzero(records["encoded_bytes"].is_null().to_numpy()).tolist():  # made by the writer
        row = records.row(i, named=True)  # (image options): the size planned from the image's facts
        sizes[i] = planned_bytes("", *(row[name] or "" for name in ("format", "width", "height", "channels")),
                                 jpeg_quality)
    return sizes


def _eight_bit(image: Any) -> Any:
    """An 8-bit image in one of L, LA, RGB, RGBA (16-bit: the high byte; palettes expanded)."""
    from PIL import Image

    if image.mode in _MODES.values():
        return image
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "I;16N"):
        import numpy as np

        pixels = np.asarray(image).astype(np.uint32)
        return Image.fromarray((pixels >> 8).clip(0, 255).astype(np.uint8), "L")
    if image.mode == "P":
        return image.convert("RGBA" if "transparency" in image.info else "RGB")
    if image.mode in ("PA", "RGBa", "RGBX", "CMYK", "YCbCr", "LAB", "HSV", "F", "1", "La", "LA"):
        target = {"PA": "RGBA", "RGBa": "RGBA", "La": "LA", "1": "L", "F": "L"}.get(image.mode, "RGB")
        return image.convert(target)
    return image.convert("RGBA" if "A" in image.mode else "RGB")


def _with_channels(image: Any, channels: int) -> Any:
    """``image`` (L, LA, RGB or RGBA) converted to ``channels`` (Pillow: grey repeated, ITU-R 601 luma,
    alpha dropped or added opaque)."""
    mode = _MODES[channels]
    return image if image.mode == mode else image.convert(mode)


def _resized(image: Any, out: Output, opts: ImageOptions) -> Any:
    """``image`` (upright) at the record's size by ``opts``: Lanczos, then a centre crop or pad."""
    from PIL import Image

    width, height = image.size
    if (width, height) == (out.width, out.height):
        return image
    lanczos = Image.Resampling.LANCZOS
    if opts.resize.kind != "exact" or opts.fit == "stretch":
        return image.resize((out.width, out.height), lanczos)
    target_w, target_h = opts.resize.width, opts.resize.height
    scale = _fit_scale(width, height, opts)
    if opts.fit == "pad":
        inner = (min(target_w, _scaled(width, scale)), min(target_h, _scaled(height, scale)))
        if inner != (width, height):
            image = image.resize(inner, lanczos)
        canvas = Image.new(image.mode, (target_w, target_h))  # zeros: black, transparent
        canvas.paste(image, ((target_w - inner[0]) // 2, (target_h - inner[1]) // 2))
        return canvas
    cover = (_scaled(width, scale), _scaled(height, scale))  # crop: cover the target, cut the centre
    if cover != (width, height):
        image = image.resize(cover, lanczos)
    left, top = (cover[0] - out.width) // 2, (cover[1] - out.height) // 2
    return image.crop((left, top, left + out.width, top + out.height))


def _draft_size(image: Any, out: Output, opts: ImageOptions, rotated: bool) -> tuple[int, int]:
    """The smallest size a JPEG may be decoded at for this resize (twice the scaled size, in the file's
    own orientation), or its full size when the options do not shrink it."""
    if not out.resized:
        return image.size
    width, height = image.size
    if rotated:
        width, height = height, width
    if opts.resize.kind == "exact" and opts.fit != "stretch":
        scale = _fit_scale(width, height, opts)
        need = (_scaled(width, scale), _scaled(height, scale))
    else:
        need = (out.width, out.height)
    need = (need[1], need[0]) if rotated else need
    return 2 * need[0], 2 * need[1]


def record_image(data: bytes, row: dict[str, str], opts: ImageOptions, max_pixels: int,
                 viewable: bool = False) -> bytes:
    """The image a record with labels.csv ``row`` stores for source ``data``: as inspection decided (checked
    against its ``encoded_sha256``), or made by ``make_image`` when the row plans none. ``viewable``: raw
    pixels as a PNG instead (the card's samples)."""
    from .probe import stored_bytes

    if row["encoded_sha256"]:
        return stored_bytes(data, row, max_pixels)
    out = Output.of_row(row)
    return make_image(data, replace(out, format="png") if viewable and out.format == "raw" else out, opts,
                      max_pixels)


def make_image(data: bytes, out: Output, opts: ImageOptions, max_pixels: int) -> bytes:
    """The bytes a made record stores for source ``data``: upright, converted, resized and encoded
    (JPEG at ``opts.jpeg_quality``, PNG, or raw ``uint8`` H x W x C). Deterministic."""
    from PIL import ImageOps

    from .probe import _open, sniff_format, upright_orientation

    fmt = sniff_format(data)
    if fmt is None:
        raise ValueError("content is not a known image format")
    image = _open(data, fmt, max_pixels)
    orientation = upright_orientation(data, fmt, image)  # the rule inspection used for the planned size
    if fmt == "jpeg" and out.resized:
        image.draft(image.mode if image.mode in ("L", "RGB") else None,
                    _draft_size(image, out, opts, orientation in (5, 6, 7, 8)))
    image.load()
    if orientation not in (0, 1):
        image = ImageOps.exif_transpose(image)
    image = _with_channels(_eight_bit(image), out.channels)
    image = _resized(image, out, opts)
    if image.size != (out.width, out.height):
        raise ValueError(f"made a {image.size[0]}x{image.size[1]} image, {out.width}x{out.height} was planned")
    if out.format == "raw":
        return image.tobytes()
    buf = io.BytesIO()
    if out.format == "jpeg":
        image.save(buf, "JPEG", quality=opts.jpeg_quality)
    else:
        image.save(buf, "PNG")
    return buf.getvalue()
