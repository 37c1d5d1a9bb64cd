"""TFRecord framing: write and read the record container TensorFlow uses.

Each record is ``uint64 length | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)``,
little-endian. Writing it ourselves (CRC32C in C via ``google-crc32c``) keeps TensorFlow out of the
shard-writing tasks; ``tf.data.TFRecordDataset`` reads the result. GZIP files are one gzip member
with a zeroed mtime and no file name, so the same records always give the same bytes.
"""

from __future__ import annotations

import gzip
import struct
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c

from ..options import COMPRESSIONS

_MASK_DELTA = 0xA282EAD8
_LENGTH = struct.Struct("<Q")
_CRC = struct.Struct("<I")


class CorruptRecordError(ValueError):
    """A TFRecord file whose framing or checksums are wrong."""


def masked_crc(data: bytes) -> int:
    """The CRC32C of ``data``, masked the way TFRecord stores it."""
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One record's bytes on disk."""
    length = _LENGTH.pack(len(data))
    return b"".join((length, _CRC.pack(masked_crc(length)), data, _CRC.pack(masked_crc(data))))


def index_text(offsets: list[tuple[int, int]]) -> bytes:
    """A ``.tfindex``: one ``start length`` line per record (``tfrecord.tools.tfrecord2idx``'s format)."""
    return "".join(f"{start} {length}\n" for start, length in offsets).encode()


class TFRecordWriter:
    """Write records to a binary file object, optionally GZIP-compressed (deterministically).

    ``offsets`` lists each record's ``(start, length)`` in the uncompressed stream: the index
    PyTorch's ``tfrecord`` package reads (``.tfindex``), known for free while writing.
    """

    def __init__(self, raw: BinaryIO, compression: str = "none") -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression must be one of {COMPRESSIONS}, not {compression!r}")
        self._gzip = (
            gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=6)
            if compression == "gzip"
            else None
        )
        self._out: BinaryIO = self._gzip or raw  # type: ignore[assignment]
        self.num_records = 0
        self.offsets: list[tuple[int, int]] = []
        self._position = 0

    def write(self, data: bytes) -> None:
        framed = frame(data)
        self._out.write(framed)
        self.offsets.append((self._position, len(framed)))
        self._position += len(framed)
        self.num_records += 1

    def index(self) -> bytes:
        """The ``.tfindex`` of the records written so far (see ``index_text``)."""
        return index_text(self.offsets)

    def close(self) -> None:
        if self._gzip is not None:
            self._gzip.close()

    def __enter__(self) -> TFRecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(raw: BinaryIO, compression: str = "none") -> Iterator[bytes]:
    """Yield each record's data, checking lengths and both CRCs; raise CorruptRecordError."""
    stream: BinaryIO = gzip.GzipFile(fileobj=raw, mode="rb") if compression == "gzip" else raw  # type: ignore[assignment]
    index = 0
    try:
        while True:
            header = stream.read(12)
            if not header:
                return
            if len(header) < 12:
                raise CorruptRecordError(f"record {index}: truncated header")
            (length,) = _LENGTH.unpack_from(header)
            (length_crc,) = _CRC.unpack_from(header, 8)
            if masked_crc(header[:8]) != length_crc:
                raise CorruptRecordError(f"record {index}: length checksum mismatch")
            body = stream.read(length + 4)
            if len(body) < length + 4:
                raise CorruptRecordError(f"record {index}: truncated data")
            data = body[:length]
            if masked_crc(data) != _CRC.unpack_from(body, length)[0]:
                raise CorruptRecordError(f"record {index}: data checksum mismatch")
            yield data
            index += 1
    except (OSError, EOFError) as exc:  # gzip errors
        raise CorruptRecordError(f"record {index}: {exc}") from exc
