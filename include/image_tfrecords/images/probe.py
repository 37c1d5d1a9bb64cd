"""Inspect one image file and decide what a record stores: the file as is, a transcoded copy, or nothing.

Decoding checks the whole bitstream, not only the header, so truncated or corrupt files are caught
before they reach a shard. JPEGs are decoded at reduced scale (Pillow's draft mode: every
entropy-coded byte is still parsed, the inverse DCT is cheap), which keeps it fast.

Policy (a record always holds a JPEG or PNG that ``tf.io.decode_image`` decodes to one upright
H x W x C image):

- JPEG (grayscale, RGB) and PNG (any bit depth, grey/RGB, with or without alpha, palette):
  stored byte for byte;
- JPEG in CMYK/YCCK: converted to RGB and re-encoded as JPEG (quality 95): not every decoder
  handles CMYK, and Adobe's inverted CMYK decodes to wrong colours in some;
- EXIF orientation 2 to 8: pixels rotated upright, re-encoded in the same format (JPEG quality 95,
  PNG lossless); width and height are the upright ones; other values (0, 9, 65535, unreadable EXIF)
  count as upright, as decoders treat them;
- GIF, BMP, WebP, TIFF with a single frame: converted losslessly to PNG;
- HEIF/HEIC, AVIF (what phones write) and JPEG XL: fully decoded, made upright, converted losslessly
  to PNG, like GIF/BMP/WebP (their decoders are registered on first use, see ``formats``; a missing
  one makes them ``unsupported_format``). Orientation is the container's, as the formats define it:
  HEIF's irot/imir are applied by libheif (the EXIF tag, which HEIF says to ignore, is reset to 1);
  AVIF's irot/imir become the EXIF orientation Pillow reports and are applied like a JPEG's; a JPEG XL
  codestream's orientation is applied by libjxl, or, for a JPEG stored losslessly in JPEG XL (decoded
  back to that JPEG), set as its EXIF orientation;
- animations and multi-page files (GIF, WebP, APNG, TIFF, AVIF sequences, animated JPEG XL):
  rejected (``multi_frame``), since picking one frame would silently drop the rest; decided from the
  first two frames only, never by counting them all (a 100k-page TIFF costs what a 2-page one does);
  a JPEG XL's animation flag is read from its header before anything is decoded;
- a HEIF with several images (bursts, collections, a still beside an image sequence): like an MPO,
  the primary image, the one phones and viewers show, is stored; a HEIF with only an image sequence
  (no still image) is an animation (``multi_frame``);
- a JPEG with secondary images (MPO: what phones and cameras write for depth maps, gain maps,
  previews; Pillow sees frames): the primary image is what every decoder shows, so it is stored as is;
- a JPEG with more than ``MAX_JPEG_SCANS`` scans: rejected (``too_complex``) before decoding; real
  encoders write about 10, and each scan costs a pass over the image (20,000 scans took minutes).
  Scans are counted by walking the markers as libjpeg does: segment payloads (an EXIF thumbnail's own
  SOS and EOI) are skipped by their length, 0xFF00 and RSTn inside a scan are data, 0xFF runs are fill;
- JPEG header segments that libjpeg ignores but Pillow's parser fails on (a cut-short JFIF, Adobe or
  ICC segment, a TEM marker) do not reject a file: Pillow reads a copy with them renamed (same
  offsets), and the stored bytes are the file's;
- anything else: rejected with a reason.

Memory per image is bounded: the pixel count is checked before any decoding (``max_pixels``), JPEGs
are decoded at 1/8 scale, and PNGs (interlaced or not) are checked by streaming their image data
through inflate 1 MB at a time, never holding their pixels. Only transcoding decodes full pixels.
(The JPEG XL decoder decodes on open, so a JPEG XL's size is read from its header first.)
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from typing import Any

from ..errors import RejectedImage
from ..options import MAX_PIXELS
from .formats import JXL_CODESTREAM, JXL_CONTAINER, PILLOW_FORMAT, decoder_problem, jxl_header
from .jpeg_markers import jpeg_for_pillow
from .png_stream import check_png_stream
from .quality import Quality, measured

# What tf.io.decode_image returns for each Pillow mode (channels=0, dtype uint8).
_JPEG_CHANNELS = {"L": 1, "RGB": 3}
_PNG_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3, "RGBA": 4}
# Modes a transcode to PNG keeps as they are, and modes it converts first.
_PNG_KEEP = frozenset({"1", "L", "LA", "RGB", "RGBA", "P", "I;16", "I;16B"})
_PNG_CONVERT = {"CMYK": "RGB", "YCbCr": "RGB", "PA": "RGBA", "La": "LA", "RGBa": "RGBA", "RGBX": "RGB"}
MODERN_FORMATS = frozenset({"heif", "avif", "jxl"})  # decoded by plugins; off with modern_formats false
JPEG_QUALITY = 95
_ORIENTATION = 0x0112


@dataclass(frozen=True)
class ImageFacts:
    """What the label CSV and the shard writer need to know about one image."""

    sha256: str  # of the source file
    num_bytes: int  # of the source file
    format: str  # "jpeg" | "png": what the stored bytes are
    width: int  # of the stored image, upright
    height: int
    channels: int  # as tf.io.decode_image returns them
    source_format: str  # what the source bytes are: jpeg, png, gif, bmp, webp, tiff, heif, avif, jxl
    transform: str = ""  # "" (stored as is) or what was done: to_png, cmyk_to_rgb, exif_rotate
    encoded_sha256: str = ""  # of the stored bytes (the source's when stored as is)
    encoded_bytes: int = 0
    phash: str = ""  # perceptual hash of the stored image, upright (``perceptual``): finds near-duplicates
    # image-quality signals and flags (``quality``), from the same thumbnail; "" where not measured
    brightness: str = ""
    contrast: str = ""
    sharpness: str = ""
    colourfulness: str = ""
    quality: str = ""


# ISO-BMFF ``ftyp`` brands (ISO/IEC 23008-12, AV1 Image File Format): coding brands, then the generic
# still-image and image-sequence brands, whose compatible brands say the codec.
_HEIF_BRANDS = frozenset({b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"hevm", b"hevs"})
_AVIF_BRANDS = frozenset({b"avif", b"avis"})
_GENERIC_BRANDS = frozenset({b"mif1", b"msf1"})
_MAX_BRANDS = 64  # compatible brands looked at


def _bmff_format(data: bytes) -> str | None:
    """heif or avif from an ISO-BMFF file's ``ftyp`` box (None for other ISO-BMFF files: MP4, CR3...)."""
    major = data[8:12]
    if major in _AVIF_BRANDS:
        return "avif"
    if major in _HEIF_BRANDS:
        return "heif"
    if major not in _GENERIC_BRANDS:
        return None
    end = min(int.from_bytes(data[:4], "big"), len(data), 16 + 4 * _MAX_BRANDS)
    compatible = {data[i:i + 4] for i in range(16, end - 3, 4)}
    return "avif" if compatible & _AVIF_BRANDS else "heif"


def _top_level_boxes(data: bytes, limit: int = 64) -> list[bytes]:
    """The types of an ISO-BMFF file's first top-level boxes."""
    kinds: list[bytes] = []
    pos = 0
    while pos + 8 <= len(data) and len(kinds) < limit:
        size = int.from_bytes(data[pos:pos + 4], "big")
        kinds.append(data[pos + 4:pos + 8])
        if size == 1 and pos + 16 <= len(data):
            size = int.from_bytes(data[pos + 8:pos + 16], "big")
        if size == 0 or size < 8:
            break
        pos += size
    return kinds


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
    if data[4:8] == b"ftyp":
        return _bmff_format(data)
    if data[:2] == JXL_CODESTREAM or data[:12] == JXL_CONTAINER:
        return "jxl"
    return None


def _check_size(width: int, height: int, max_pixels: int) -> None:
    if width <= 0 or height <= 0:
        raise RejectedImage("corrupt", f"bad dimensions {width}x{height}")
    if width * height > max_pixels:
        raise RejectedImage("too_many_pixels", f"{width}x{height} exceeds {max_pixels} pixels")


def _open(data: bytes, fmt: str, max_pixels: int) -> Any:
    """Open lazily (header only) and check the pixel count before anything is decoded.

    HEIF, AVIF and JPEG XL get their decoder registered on first use (``unsupported_format`` if it is
    missing). A JPEG XL is decoded on open, so its header is read first: size and animation flag are
    checked before, and its codestream orientation is made the one ``_orientation`` sees after."""
    from PIL import Image

    problem = decoder_problem(fmt)
    if problem:
        raise RejectedImage("unsupported_format", problem)
    jxl = None
    if fmt == "jxl":
        try:
            jxl = jxl_header(data)
        except ValueError as exc:
            raise RejectedImage("corrupt", str(exc)) from None
        _check_size(jxl.width, jxl.height, max_pixels)
        if jxl.animated:
            raise RejectedImage("multi_frame", "animated jxl")
    Image.MAX_IMAGE_PIXELS = None  # the limit is max_pixels, checked here before decoding
    try:
        image = Image.open(io.BytesIO(jpeg_for_pillow(data) if fmt == "jpeg" else data),
                           formats=[PILLOW_FORMAT.get(fmt, fmt.upper())])
    except Exception:
        if fmt == "heif" and b"moov" in _top_level_boxes(data) and b"meta" not in _top_level_boxes(data):
            raise RejectedImage("multi_frame", "heif image sequence without a still image") from None
        raise
    _check_size(*image.size, max_pixels)
    if jxl is not None:
        _set_orientation(image, jxl.orientation if getattr(image, "jpeg", False) else 1)
    return image


def _decode_checked(data: bytes, fmt: str, max_pixels: int) -> tuple[Any, tuple[int, int]]:
    """Open and check the whole bitstream; returns the image and its full size; raise RejectedImage if broken.

    JPEGs are decoded in draft mode; PNGs are checked without building pixels (``_check_png_stream``),
    others are fully decoded.
    """
    try:
        image = _open(data, fmt, max_pixels)
        size = image.size  # before draft mode shrinks it
        # is_animated looks at the second frame only, never counts them all; an MPO's frames are not pages,
        # nor are a HEIF's images (the primary one is open)
        if fmt not in ("jpeg", "heif") and getattr(image, "is_animated", False):
            raise RejectedImage("multi_frame", f"{fmt} with more than one frame")
        if fmt == "png":
            check_png_stream(data)
            return image, size
        if fmt == "jpeg":
            image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
        return image, size
    except RejectedImage:
        raise
    except Exception as exc:  # Pillow raises many types for broken data
        raise RejectedImage("corrupt", _failure(fmt, exc)) from exc


def _failure(fmt: str, exc: Exception) -> str:
    """One line saying why a decoder failed (libjxl's binding says only "Generic Error" and how to debug it)."""
    if fmt == "jxl" and isinstance(exc, RuntimeError):
        return "RuntimeError: libjxl cannot decode it (truncated or corrupt)"
    return " ".join(f"{type(exc).__name__}: {exc}".split())


def _channels(fmt: str, image: Any) -> int:
    if fmt == "png" and image.mode == "P":
        return 4 if "transparency" in image.info else 3
    return (_JPEG_CHANNELS if fmt == "jpeg" else _PNG_CHANNELS).get(image.mode, 0)


def _orientation(image: Any) -> int:
    """The EXIF orientation, 1 (upright) when absent, unreadable or not one of the eight defined values."""
    try:
        value = int(image.getexif().get(_ORIENTATION, 1) or 1)
    except Exception:  # unreadable EXIF: treat as upright
        return 1
    return value if 1 <= value <= 8 else 1


def _set_orientation(image: Any, orientation: int) -> None:
    """Make ``orientation`` the EXIF orientation that ``_orientation`` and ``ImageOps.exif_transpose`` see.

    For JPEG XL: libjxl applies the codestream orientation to the pixels it decodes (so 1 is left),
    while a JPEG stored losslessly in JPEG XL comes back as that JPEG, not yet rotated."""
    exif = image.getexif()  # cached on the image: later getexif() calls return this object
    if exif.get(_ORIENTATION, 1) != orientation:
        exif[_ORIENTATION] = orientation


def _encode(image: Any, fmt: str) -> bytes:
    """Deterministic JPEG (quality 95) or PNG bytes of a Pillow image, no metadata."""
    buf = io.BytesIO()
    if fmt == "jpeg":
        image.save(buf, "JPEG", quality=JPEG_QUALITY)
    else:
        image.save(buf, "PNG")
    return buf.getvalue()


def upright_orientation(data: bytes, fmt: str, image: Any) -> int:
    """The EXIF orientation a record applies to ``image`` (opened from ``data``): a PNG without an
    ``eXIf`` chunk is upright (its text chunks may hold EXIF that decoders ignore, and getexif() would
    decode the pixels to find it)."""
    if fmt == "png" and b"eXIf" not in data:
        return 1
    return _orientation(image)


def _needs_transcoding(data: bytes, fmt: str, image: Any) -> bool:
    """Not a JPEG/PNG, a CMYK/YCCK JPEG, or not upright: the record cannot store the file as is."""
    if fmt not in ("jpeg", "png") or image.mode in ("CMYK", "YCCK"):
        return True
    return upright_orientation(data, fmt, image) not in (1, 0)


def _transcode(data: bytes, fmt: str, max_pixels: int, decoded: Any = None) -> tuple[str, str, bytes]:
    """(stored format, transform, stored bytes) for an image that ``_needs_transcoding``.

    ``decoded``: the fully decoded image of a GIF/BMP/WebP/TIFF/HEIF/AVIF/JPEG XL, reused rather than decoded twice
    (JPEGs were checked at 1/8 scale and PNGs without pixels, so those are opened again)."""
    from PIL import ImageOps

    image = decoded if decoded is not None and fmt not in ("jpeg", "png") else _open(data, fmt, max_pixels)
    rotate = upright_orientation(data, fmt, image) not in (1, 0)
    if fmt == "jpeg" and image.mode in ("CMYK", "YCCK"):
        image.load()
        image = image.convert("RGB")
        if rotate:
            image = ImageOps.exif_transpose(image)
        return "jpeg", "cmyk_to_rgb" + ("+exif_rotate" if rotate else ""), _encode(image, "jpeg")
    if fmt in ("jpeg", "png"):  # so it is not upright
        image.load()
        return fmt, "exif_rotate", _encode(ImageOps.exif_transpose(image), fmt)
    image.load()
    if rotate:
        image = ImageOps.exif_transpose(image)
    if image.mode in _PNG_CONVERT:
        image = image.convert(_PNG_CONVERT[image.mode])
    elif image.mode not in _PNG_KEEP:
        raise RejectedImage("unsupported_format", f"{fmt} in colour mode {image.mode}")
    return "png", "to_png" + ("+exif_rotate" if rotate else ""), _encode(image, "png")


def prepare_image(data: bytes, max_pixels: int = MAX_PIXELS, png_pixels: bool = True) -> tuple[ImageFacts, bytes]:
    """Check ``data`` and return its facts and the bytes a record stores; raise RejectedImage. ``png_pixels``
    False: a PNG stored as it is (checked without decoding its pixels) gets no perceptual hash and no quality
    signals (decoding it for them costs several times its check)."""
    if not data:
        raise RejectedImage("empty_file")
    fmt = sniff_format(data)
    if fmt is None:
        raise RejectedImage("not_an_image", "content is not a known image format")
    image, size = _decode_checked(data, fmt, max_pixels)
    sha = hashlib.sha256(data).hexdigest()
    stored_format, transform, encoded = fmt, "", data
    if _needs_transcoding(data, fmt, image):
        try:
            stored_format, transform, encoded = _transcode(data, fmt, max_pixels, image)
        except RejectedImage:
            raise
        except Exception as exc:
            raise RejectedImage("corrupt", _failure(fmt, exc)) from exc
        image = None  # free the decoded pixels before the stored bytes are checked
        image, size = _decode_checked(encoded, stored_format, max_pixels)
    channels = _channels(stored_format, image)
    if not channels:
        raise RejectedImage("unsupported_format", f"{stored_format} in colour mode {image.mode}")
    width, height = size
    phash, quality = _thumbnail_facts(image, stored_format, width, height, channels,
                                      png_pixels or stored_format != "png")
    facts = ImageFacts(sha, len(data), stored_format, width, height, channels, fmt, transform,
                       hashlib.sha256(encoded).hexdigest() if transform else sha, len(encoded), phash,
                       **quality)
    return facts, encoded


_UNMEASURED = Quality().columns()
HASHED_PNG_PIXELS = 4_000_000  # larger PNGs get no perceptual hash: decoding one costs 4+ bytes a pixel


def _thumbnail_facts(image: Any, fmt: str, width: int, height: int, channels: int,
                     decode_png: bool = True) -> tuple[str, dict[str, str]]:
    """The perceptual hash and the quality columns of the stored image (upright: one that is not was
    transcoded): from the 1/8-scale decode of a JPEG, the decoded pixels of other formats; a PNG, checked
    without its pixels, is decoded here when ``decode_png`` and it has at most ``HASHED_PNG_PIXELS``. ``""``
    (no near-duplicate search, no signals) for another PNG, or when Pillow cannot convert it: the image
    itself passed its checks, so it is kept."""
    if fmt == "png" and (not decode_png or image.width * image.height > HASHED_PNG_PIXELS):
        return "", _UNMEASURED  # decoding it would cost what the row-by-row check avoided
    try:
        if fmt == "png":
            image.load()
        return measured(image, width, height, channels)  # one pass over the pixels for both
    except Exception:
        return "", _UNMEASURED


def inspect_image(data: bytes, max_pixels: int = MAX_PIXELS, png_pixels: bool = True) -> ImageFacts:
    """Check that ``data`` can become a record and describe it; raise RejectedImage (``png_pixels``: see
    ``prepare_image``)."""
    return prepare_image(data, max_pixels, png_pixels)[0]


def stored_bytes(data: bytes, row: dict[str, str], max_pixels: int = MAX_PIXELS) -> bytes:
    """The bytes a record stores for source ``data``, checked against its labels.csv ``row``."""
    if not row.get("transform"):
        return data
    facts, encoded = prepare_image(data, max_pixels)
    if facts.encoded_sha256 != row["encoded_sha256"]:
        raise ValueError("transcoding gave different bytes than at inspection (a different Pillow?)")
    return encoded

