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
- animations and multi-page files (GIF, WebP, APNG, TIFF): rejected (``multi_frame``), since
  picking one frame would silently drop the rest; decided from the first two frames only, never by
  counting them all (a 100k-page TIFF costs what a 2-page one does);
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
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# What tf.io.decode_image returns for each Pillow mode (channels=0, dtype uint8).
_JPEG_CHANNELS = {"L": 1, "RGB": 3}
_PNG_CHANNELS = {"1": 1, "L": 1, "I": 1, "I;16": 1, "I;16B": 1, "LA": 2, "RGB": 3, "RGBA": 4}
# Modes a transcode to PNG keeps as they are, and modes it converts first.
_PNG_KEEP = frozenset({"1", "L", "LA", "RGB", "RGBA", "P", "I;16", "I;16B"})
_PNG_CONVERT = {"CMYK": "RGB", "YCbCr": "RGB", "PA": "RGBA", "La": "LA", "RGBa": "RGBA", "RGBX": "RGB"}
MAX_PIXELS = 89_478_485  # Pillow's default decompression-bomb limit
MAX_JPEG_SCANS = 100  # real encoders write 1 (baseline) to ~10 (progressive) scans
_INFLATE_PIECE = 1 << 20
# Finding JPEG markers: a run of 0xFF (fill bytes) and the byte after it; the look-behind makes a search
# start only at a run's first 0xFF, so that long runs cost linear time.
_FF_RUN = re.compile(rb"\xff++(.)", re.S)
_NEXT_MARKER = re.compile(rb"\xff(?<!\xff\xff)\xff*+([^\x00])")  # between segments 0xFF00 is skipped
_SCAN_END = re.compile(rb"\xff(?<!\xff\xff)\xff*+([^\x00\xd0-\xd7])")  # in a scan 0xFF00 is data, RSTn a restart
_SCAN_DATA = bytes((0, *range(0xD0, 0xD8)))
_STANDALONE = frozenset((0x01, 0xD8, *range(0xD0, 0xD8)))  # TEM, SOI, RSTn: no length follows
# Adam7 passes: (x start, y start, x step, y step)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))
JPEG_QUALITY = 95
_ORIENTATION = 0x0112
_OBJECT_REPR = re.compile(r" ?<[^<>]* at 0x[0-9a-fA-F]+>")
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # samples per pixel by IHDR colour type


class RejectedImage(Exception):
    """A file that will not become a record; ``reason`` is a short machine-readable word."""

    def __init__(self, reason: str, detail: str = "") -> None:
        detail = _OBJECT_REPR.sub("", detail)  # no memory addresses: rejects.csv must be reproducible
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ImageFacts:
    """What the label CSV and the shard writer need to know about one image."""

    sha256: str  # of the source file
    num_bytes: int  # of the source file
    format: str  # "jpeg" | "png": what the stored bytes are
    width: int  # of the stored image, upright
    height: int
    channels: int  # as tf.io.decode_image returns them
    source_format: str  # what the source bytes are: jpeg, png, gif, bmp, webp, tiff
    transform: str = ""  # "" (stored as is) or what was done: to_png, cmyk_to_rgb, exif_rotate
    encoded_sha256: str = ""  # of the stored bytes (the source's when stored as is)
    encoded_bytes: int = 0


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


def _open(data: bytes, fmt: str, max_pixels: int) -> Any:
    """Open lazily (header only) and check the pixel count before anything is decoded."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = None  # the limit is max_pixels, checked here before decoding
    image = Image.open(io.BytesIO(_jpeg_for_pillow(data) if fmt == "jpeg" else data), formats=[fmt.upper()])
    width, height = image.size
    if width <= 0 or height <= 0:
        raise RejectedImage("corrupt", f"bad dimensions {width}x{height}")
    if width * height > max_pixels:
        raise RejectedImage("too_many_pixels", f"{width}x{height} exceeds {max_pixels} pixels")
    return image


def _decode_checked(data: bytes, fmt: str, max_pixels: int) -> tuple[Any, tuple[int, int]]:
    """Open and check the whole bitstream; returns the image and its full size; raise RejectedImage if broken.

    JPEGs are decoded in draft mode; PNGs are checked without building pixels (``_check_png_stream``),
    others are fully decoded.
    """
    try:
        image = _open(data, fmt, max_pixels)
        size = image.size  # before draft mode shrinks it
        # is_animated looks at the second frame only, never counts them all; an MPO's frames are not pages
        if fmt != "jpeg" and getattr(image, "is_animated", False):
            raise RejectedImage("multi_frame", f"{fmt} with more than one frame")
        if fmt == "png":
            _check_png_stream(data)
            return image, size
        if fmt == "jpeg":
            image.draft(image.mode, (max(1, image.width // 8), max(1, image.height // 8)))
        image.load()
        return image, size
    except RejectedImage:
        raise
    except Exception as exc:  # Pillow raises many types for broken data
        raise RejectedImage("corrupt", f"{type(exc).__name__}: {exc}") from exc


def _jpeg_markers(data: bytes) -> Iterator[tuple[int, int, int]]:
    """(marker, start, end) of each marker of the primary image after SOI, up to its EOI.

    Markers are found as libjpeg finds them: 0xFF fill bytes before a marker are skipped, and in the
    entropy-coded data after an SOS, 0xFF 0x00 (a stuffed data byte) and RSTn do not end the scan.
    A segment's payload is skipped by its length, so marker-like bytes in it (an EXIF thumbnail's
    SOS and EOI) are not markers. Regular expressions keep it at C speed (a few ms per 10 MB)."""
    pos, in_scan = 2, False
    while (found := _find_marker(data, pos, in_scan)) is not None:
        marker, start = found[1][0], found.start(1) - 1
        if marker == 0xD9:  # EOI: what follows (MPO secondary images, trailers) is not this image
            yield marker, start, start + 2
            return
        end = start + 2 if marker in _STANDALONE else start + 2 + int.from_bytes(data[start + 2:start + 4], "big")
        yield marker, start, end
        pos, in_scan = end, marker == 0xDA


def _find_marker(data: bytes, pos: int, in_scan: bool) -> re.Match[bytes] | None:
    """The next marker from ``pos``: a run of 0xFF and the byte that ends it, which must not be one
    of the bytes that are data there (0x00, and RSTn inside a scan)."""
    data_bytes = _SCAN_DATA if in_scan else b"\x00"
    if data[pos:pos + 1] == b"\xff":  # a run starting at pos: the search's look-behind would see the byte before
        run = _FF_RUN.match(data, pos)
        if run is None or run[1] not in data_bytes:
            return run
        pos = run.end()
    return (_SCAN_END if in_scan else _NEXT_MARKER).search(data, pos)


def _pillow_fails_on(marker: int, payload: bytes) -> bool:
    """Header markers libjpeg (so TensorFlow) ignores or skips, on which Pillow's parser raises."""
    return (marker == 0x01  # TEM: a marker without a length
            or (marker == 0xE0 and payload.startswith(b"JFIF") and len(payload) < 7)
            or (marker == 0xEE and payload.startswith(b"Adobe") and len(payload) < 7)
            or (marker == 0xE2 and payload.startswith(b"ICC_PROFILE\0") and len(payload) < 14))


def _jpeg_for_pillow(data: bytes) -> bytes:
    """Check a JPEG's structure and return the bytes Pillow should parse.

    More than MAX_JPEG_SCANS scans (SOS markers) in the primary image is ``too_complex``: each scan is a
    pass over the whole image. Header segments that libjpeg ignores but Pillow fails on (a cut-short
    JFIF, Adobe or ICC segment, a TEM marker) are renamed to an APP15 Pillow does not parse (TEM to fill
    bytes): same length, same offsets, same scans, and the stored bytes stay the file's."""
    scans, patches = 0, []
    for marker, start, end in _jpeg_markers(data):
        scans += marker == 0xDA
        if scans > MAX_JPEG_SCANS:
            raise RejectedImage("too_complex", f"JPEG with more than {MAX_JPEG_SCANS} scans (SOS markers): "
                                               "every scan is a pass over the whole image")
        if not scans and _pillow_fails_on(marker, data[start + 4:end]):
            patches.append(start + 1)
    if not patches:
        return data
    patched = bytearray(data)
    for at in patches:
        patched[at] = 0xFF if patched[at] == 0x01 else 0xEF
    return bytes(patched)


def _row_layout(width: int, height: int, bits_per_pixel: int, interlaced: bool) -> list[tuple[int, int, int]]:
    """(offset, stride, rows) of each block of rows in the inflated image data: one block, or one per
    non-empty Adam7 pass. Each row is a filter byte plus its samples."""
    passes = _ADAM7 if interlaced else ((0, 0, 1, 1),)
    layout, offset = [], 0
    for x0, y0, dx, dy in passes:
        columns, rows = (width - x0 + dx - 1) // dx, (height - y0 + dy - 1) // dy
        if columns <= 0 or rows <= 0:
            continue  # an empty pass has no rows, not even filter bytes
        stride = 1 + (columns * bits_per_pixel + 7) // 8
        layout.append((offset, stride, rows))
        offset += stride * rows
    return layout


class _RowChecker:
    """Checks the filter byte of every row as inflated pieces of image data stream by."""

    def __init__(self, layout: list[tuple[int, int, int]]) -> None:
        self.layout = layout
        self.expected = sum(stride * rows for _, stride, rows in layout)
        self.seen = 0

    def feed(self, piece: bytes) -> None:
        import numpy as np

        start, end = self.seen, self.seen + len(piece)
        values = np.frombuffer(piece, np.uint8)
        for offset, stride, rows in self.layout:
            first = max(0, -(-(start - offset) // stride))
            last = min(rows, -(-(end - offset) // stride))
            if first < last and values[offset + first * stride - start:offset + last * stride - start:stride].max() > 4:
                raise RejectedImage("corrupt", "PNG row with an unknown filter type")
        self.seen = end


def _check_png_stream(data: bytes) -> None:
    """Check a PNG the way libpng reads it, without unfiltering pixels and in bounded memory.

    Every critical chunk's CRC, an IEND chunk, IDAT that inflates (zlib's Adler-32 included) to at
    least one filter byte plus one row of samples per row, for each Adam7 pass when interlaced
    (more is ignored, as libpng does), and valid filter types. IDAT is inflated 1 MB at a time as
    its chunks come, so a small file that inflates to a gigabyte costs a megabyte. ISA-L inflates
    about 6x faster than a full decode.
    """
    from isal import isal_zlib

    view = memoryview(data)
    pos, idat, header = 8, [], b""
    while True:
        if pos + 12 > len(data):
            raise RejectedImage("corrupt", "PNG ends before its IEND chunk")
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 8 + length
        if end + 4 > len(data):
            raise RejectedImage("corrupt", f"PNG chunk {kind!r} is cut short")
        critical = not kind[0] & 0x20  # libpng fails on a critical chunk's bad CRC, skips an ancillary one
        if critical and isal_zlib.crc32(data[pos + 4:end]) != struct.unpack_from(">I", data, end)[0]:
            raise RejectedImage("corrupt", f"PNG chunk {kind!r} fails its CRC")
        if kind == b"IHDR":
            header = data[pos + 8:end]
        elif kind == b"IDAT":
            idat.append(view[pos + 8:end])
        elif kind == b"IEND":
            break
        pos = end + 4
    width, height, depth, colour, _, _, interlace = struct.unpack_from(">IIBBBBB", header)
    rows = _RowChecker(_row_layout(width, height, depth * _PNG_SAMPLES[colour], interlace == 1))
    inflater = isal_zlib.decompressobj()
    for chunk in idat:  # data past the last row: libpng skips it, so do we, 1 MB at a time, to the Adler-32
        pending: Any = chunk
        while len(pending) and not inflater.eof:
            wanted = min(_INFLATE_PIECE, rows.expected - rows.seen) if rows.seen < rows.expected else _INFLATE_PIECE
            piece = inflater.decompress(pending, wanted)
            if rows.seen < rows.expected:
                rows.feed(piece[:rows.expected - rows.seen])
            pending = inflater.unconsumed_tail
            if not piece and not len(pending):
                break
    while not inflater.eof and (piece := inflater.decompress(b"", _INFLATE_PIECE)):  # output held back
        if rows.seen < rows.expected:
            rows.feed(piece[:rows.expected - rows.seen])
    if rows.seen < rows.expected:
        raise RejectedImage("corrupt", f"PNG image data holds {rows.seen} bytes, not the {rows.expected} "
                                       f"its {width}x{height} header needs")
    if not inflater.eof:
        raise RejectedImage("corrupt", "PNG image data ends before its zlib stream does")


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


def _encode(image: Any, fmt: str) -> bytes:
    """Deterministic JPEG (quality 95) or PNG bytes of a Pillow image, no metadata."""
    buf = io.BytesIO()
    if fmt == "jpeg":
        image.save(buf, "JPEG", quality=JPEG_QUALITY)
    else:
        image.save(buf, "PNG")
    return buf.getvalue()


def _needs_transcoding(data: bytes, fmt: str, image: Any) -> bool:
    """Not a JPEG/PNG, a CMYK/YCCK JPEG, or not upright: the record cannot store the file as is."""
    if fmt not in ("jpeg", "png") or image.mode in ("CMYK", "YCCK"):
        return True
    if fmt == "png" and b"eXIf" not in data:  # no EXIF, so upright (and getexif() would decode the pixels)
        return False
    return _orientation(image) not in (1, 0)


def _transcode(data: bytes, fmt: str, max_pixels: int, decoded: Any = None) -> tuple[str, str, bytes]:
    """(stored format, transform, stored bytes) for an image that ``_needs_transcoding``.

    ``decoded``: the fully decoded image of a GIF/BMP/WebP/TIFF, reused rather than decoded twice
    (JPEGs were checked at 1/8 scale and PNGs without pixels, so those are opened again)."""
    from PIL import ImageOps

    image = decoded if decoded is not None and fmt not in ("jpeg", "png") else _open(data, fmt, max_pixels)
    rotate = _orientation(image) not in (1, 0)
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


def prepare_image(data: bytes, max_pixels: int = MAX_PIXELS) -> tuple[ImageFacts, bytes]:
    """Check ``data`` and return its facts and the bytes a record stores; raise RejectedImage."""
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
            raise RejectedImage("corrupt", f"{type(exc).__name__}: {exc}") from exc
        image = None  # free the decoded pixels before the stored bytes are checked
        image, size = _decode_checked(encoded, stored_format, max_pixels)
    channels = _channels(stored_format, image)
    if not channels:
        raise RejectedImage("unsupported_format", f"{stored_format} in colour mode {image.mode}")
    width, height = size
    facts = ImageFacts(sha, len(data), stored_format, width, height, channels, fmt, transform,
                       hashlib.sha256(encoded).hexdigest() if transform else sha, len(encoded))
    return facts, encoded


def inspect_image(data: bytes, max_pixels: int = MAX_PIXELS) -> ImageFacts:
    """Check that ``data`` can become a record and describe it; raise RejectedImage."""
    return prepare_image(data, max_pixels)[0]


def stored_bytes(data: bytes, row: dict[str, str], max_pixels: int = MAX_PIXELS) -> bytes:
    """The bytes a record stores for source ``data``, checked against its labels.csv ``row``."""
    if not row.get("transform"):
        return data
    facts, encoded = prepare_image(data, max_pixels)
    if facts.encoded_sha256 != row["encoded_sha256"]:
        raise ValueError("transcoding gave different bytes than at inspection (a different Pillow?)")
    return encoded

