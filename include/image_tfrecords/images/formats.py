"""Decoders for the image formats Pillow does not read by itself, registered on first use.

- HEIF/HEIC (what phones write): pillow-heif (libheif with libde265), registered as Pillow's "HEIF";
- AVIF: Pillow's own "AVIF" plugin (libavif; in Pillow's wheels since 11.3);
- JPEG XL: pillow-jxl-plugin (libjxl), registered as Pillow's "JXL".

Nothing here is imported at package import time: ``probe`` calls ``require_decoder`` for these
formats only, so a JPEG/PNG build never loads libheif or libjxl. Registration happens once per process
(thread-safe, idempotent). A missing decoder makes such files ``unsupported_format`` with a detail
naming the package, never a crash.

``jxl_header`` reads a JPEG XL file's size, orientation and animation flag from its first bytes:
the JXL plugin decodes every pixel as soon as a file is opened, so the pixel limit and the
one-frame rule must be applied before Pillow sees the file.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

# Our format name -> Pillow's format id (what ``Image.open(..., formats=[...])`` takes).
PILLOW_FORMAT = {"heif": "HEIF", "avif": "AVIF", "jxl": "JXL"}

_lock = threading.Lock()
_problems: dict[str, str] = {}  # format -> "" (registered) or why it cannot be decoded


def _register(fmt: str) -> str:
    """Register one decoder with Pillow; '' on success, else why not (one line)."""
    if fmt == "heif":
        try:
            import pillow_heif
        except ImportError as exc:
            return f"HEIF/HEIC needs the pillow-heif package ({exc})"
        pillow_heif.register_heif_opener()
        return ""
    if fmt == "avif":
        import PIL
        from PIL import features

        if not features.check("avif"):
            return f"this Pillow ({PIL.__version__}) has no AVIF support (Pillow 11.3+ wheels have it)"
        return ""
    if fmt == "jxl":
        try:
            import pillow_jxl  # noqa: F401  (registers "JXL" with Pillow on import)
        except ImportError as exc:
            return f"JPEG XL needs the pillow-jxl-plugin package ({exc})"
        return ""
    return ""


def decoder_problem(fmt: str) -> str:
    """'' when files of ``fmt`` can be decoded (registering its decoder on first call), else why not."""
    if fmt not in PILLOW_FORMAT:
        return ""
    problem = _problems.get(fmt)
    if problem is None:
        with _lock:
            problem = _problems.get(fmt)
            if problem is None:
                problem = _problems[fmt] = _register(fmt)
    return problem


def register_decoders() -> dict[str, str]:
    """Register every decoder this module knows; {format: '' if decodable, else why not}. Idempotent."""
    return {fmt: decoder_problem(fmt) for fmt in PILLOW_FORMAT}


# -- JPEG XL headers (ISO/IEC 18181-1 SizeHeader and the start of ImageMetadata) -----------------------
JXL_CODESTREAM = b"\xff\x0a"
JXL_CONTAINER = b"\x00\x00\x00\x0cJXL \r\n\x87\n"
_SIZE_DIST = ((9, 1), (13, 1), (18, 1), (30, 1))  # U32(BitsOffset(9, 1), ...) of SizeHeader
_PREVIEW_DIV8 = ((0, 16), (0, 32), (5, 1), (9, 33))
_PREVIEW_DIST = ((6, 1), (8, 65), (10, 321), (12, 1345))
_RATIOS = {1: (1, 1), 2: (12, 10), 3: (4, 3), 4: (3, 2), 5: (16, 9), 6: (5, 4), 7: (2, 1)}
_MAX_HEADER = 64  # bytes of codestream: every field read here fits in the first 30


@dataclass(frozen=True)
class JxlHeader:
    width: int  # as stored, before orientation
    height: int
    orientation: int  # 1..8, as EXIF defines them; the codestream's, which overrides any EXIF value
    animated: bool


class _Bits:
    """Reads a JPEG XL bitstream: least significant bit of each byte first."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def u(self, count: int) -> int:
        if self.pos + count > 8 * len(self.data):
            raise ValueError("JPEG XL header cut short")
        value = 0
        for i in range(count):
            value |= ((self.data[self.pos >> 3] >> (self.pos & 7)) & 1) << i
            self.pos += 1
        return value

    def u32(self, dist: tuple[tuple[int, int], ...]) -> int:
        bits, offset = dist[self.u(2)]
        return (self.u(bits) if bits else 0) + offset

    def size(self) -> tuple[int, int]:
        """A SizeHeader: (xsize, ysize)."""
        small = self.u(1)
        ysize = (self.u(5) + 1) * 8 if small else self.u32(_SIZE_DIST)
        ratio = self.u(3)
        if ratio:
            num, den = _RATIOS[ratio]
            return ysize * num // den, ysize
        return ((self.u(5) + 1) * 8 if small else self.u32(_SIZE_DIST)), ysize

    def preview(self) -> None:
        """Skip a PreviewHeader."""
        div8 = self.u(1)
        self.u32(_PREVIEW_DIV8 if div8 else _PREVIEW_DIST)
        if self.u(3) == 0:
            self.u32(_PREVIEW_DIV8 if div8 else _PREVIEW_DIST)


def _codestream_start(data: bytes) -> bytes:
    """The first bytes of the codestream: the file itself, or from its container's jxlc/jxlp boxes."""
    if data[:2] == JXL_CODESTREAM:
        return data[:_MAX_HEADER]
    if data[:12] != JXL_CONTAINER:
        raise ValueError("not a JPEG XL file")
    pos, out = 12, b""
    while pos + 8 <= len(data) and len(out) < _MAX_HEADER:
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        header = 8
        if size == 1:
            if pos + 16 > len(data):
                break
            size, header = struct.unpack(">Q", data[pos + 8:pos + 16])[0], 16
        elif size == 0:
            size = len(data) - pos
        if size < header:
            raise ValueError(f"JPEG XL box {kind!r} with bad size {size}")
        body = data[pos + header:pos + size]
        if kind == b"jxlc":
            out = body
            break
        if kind == b"jxlp":
            out += body[4:]  # a 4-byte index, then the next part of the codestream
        pos += size
    if out[:2] != JXL_CODESTREAM:
        raise ValueError("JPEG XL container without a codestream")
    return out[:_MAX_HEADER]


def jxl_header(data: bytes) -> JxlHeader:
    """Size, orientation and animation flag of a JPEG XL file; ValueError if its header is unreadable."""
    bits = _Bits(_codestream_start(data)[2:])
    width, height = bits.size()
    orientation, animated = 1, False
    if not bits.u(1) and bits.u(1):  # not all_default, then extra_fields
        orientation = bits.u(3) + 1
        if bits.u(1):  # have_intrinsic_size
            bits.size()
        if bits.u(1):  # have_preview
            bits.preview()
        animated = bool(bits.u(1))
    return JxlHeader(width, height, orientation, animated)
