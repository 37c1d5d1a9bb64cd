"""Walking a JPEG's markers as libjpeg does: count its scans, and hide from Pillow the header
segments libjpeg ignores but Pillow's parser fails on."""

from __future__ import annotations

import re
from collections.abc import Iterator

from ..errors import RejectedImage

MAX_JPEG_SCANS = 100  # real encoders write 1 (baseline) to ~10 (progressive) scans
# Finding JPEG markers: a run of 0xFF (fill bytes) and the byte after it; the look-behind makes a search
# start only at a run's first 0xFF, so that long runs cost linear time.
_FF_RUN = re.compile(rb"\xff++(.)", re.S)
_NEXT_MARKER = re.compile(rb"\xff(?<!\xff\xff)\xff*+([^\x00])")  # between segments 0xFF00 is skipped
_SCAN_END = re.compile(rb"\xff(?<!\xff\xff)\xff*+([^\x00\xd0-\xd7])")  # in a scan 0xFF00 is data, RSTn a restart
_SCAN_DATA = bytes((0, *range(0xD0, 0xD8)))
_STANDALONE = frozenset((0x01, 0xD8, *range(0xD0, 0xD8)))  # TEM, SOI, RSTn: no length follows


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


def jpeg_for_pillow(data: bytes) -> bytes:
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
