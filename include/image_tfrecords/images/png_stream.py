"""Checking a PNG's image data as libpng reads it, streamed, without building its pixels."""

from __future__ import annotations

import struct
from typing import Any

from ..errors import RejectedImage

_INFLATE_PIECE = 1 << 20
_PNG_SAMPLES = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}  # samples per pixel by IHDR colour type
# Adam7 passes: (x start, y start, x step, y step)
_ADAM7 = ((0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4), (1, 0, 2, 2), (0, 1, 1, 2))


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


def check_png_stream(data: bytes) -> None:
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
