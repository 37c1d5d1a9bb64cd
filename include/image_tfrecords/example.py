"""Encode and decode ``tf.train.Example`` protocol buffers without importing TensorFlow.

The wire format is small and stable (tensorflow/core/example/{example,feature}.proto):
Example{1: Features{1: map<string, Feature>}}, Feature oneof {1: BytesList, 2: FloatList,
3: Int64List}, each list a repeated field 1 (numbers packed). Keys are written in sorted order,
so one record always has one byte string; ``tf.io.parse_single_example`` reads it.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

FeatureValue = bytes | str | int | float | Sequence[bytes] | Sequence[int] | Sequence[float]


_INT64 = range(-(1 << 63), 1 << 63)


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: FeatureValue) -> bytes:
    values = list(value) if isinstance(value, list | tuple) else [value]
    if all(isinstance(v, bytes | str) for v in values):
        items = b"".join(_field(1, v.encode() if isinstance(v, str) else v) for v in values)
        return _field(1, items)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        if any(v not in _INT64 for v in values):
            raise ValueError(f"integer out of int64 range in {value!r}")
        return _field(3, _field(1, b"".join(_varint(v) for v in values)) if values else b"")
    if all(isinstance(v, float) for v in values):
        return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)) if values else b"")
    raise TypeError(f"unsupported feature value {value!r}")


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a ``tf.train.Example`` from ``{key: bytes | str | int | float | list}``."""
    entries = b"".join(
        _field(1, _field(1, key.encode()) + _field(2, _feature(features[key])))
        for key in sorted(features)
    )
    return _field(1, entries)


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> list[tuple[int, int, bytes | int]]:
    """(field number, wire type, payload) for each field of one message."""
    out: list[tuple[int, int, bytes | int]] = []
    pos = 0
    while pos < len(buf):
        tag, pos = _read_varint(buf, pos)
        number, wire = tag >> 3, tag & 7
        if wire == 2:
            size, pos = _read_varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated field")
            out.append((number, wire, buf[pos : pos + size]))
            pos += size
        elif wire == 0:
            value, pos = _read_varint(buf, pos)
            out.append((number, wire, value))
        elif wire == 5:
            out.append((number, wire, buf[pos : pos + 4]))
            pos += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
    return out


def decode_example(data: bytes) -> dict[str, list[bytes] | list[int] | list[float]]:
    """Parse a serialized Example into ``{key: list of values}`` (for checks and tools)."""
    result: dict[str, list[bytes] | list[int] | list[float]] = {}
    for _, _, features in _fields(data):
        for _, _, entry in _fields(features):  # type: ignore[arg-type]
            parts = {n: p for n, _, p in _fields(entry)}  # type: ignore[arg-type]
            key = parts[1].decode()  # type: ignore[union-attr]
            kind, _, payload = _fields(parts.get(2, b""))[0]  # type: ignore[arg-type]
            items = _fields(payload)  # type: ignore[arg-type]
            if kind == 1:
                result[key] = [p for _, _, p in items]  # type: ignore[misc]
            elif kind == 3:
                values: list[int] = []
                for _, wire, p in items:
                    if wire == 0:
                        values.append(p - (1 << 64) if p >= 1 << 63 else p)  # type: ignore[operator]
                    else:
                        pos = 0
                        while pos < len(p):  # type: ignore[arg-type]
                            v, pos = _read_varint(p, pos)  # type: ignore[arg-type]
                            values.append(v - (1 << 64) if v >= 1 << 63 else v)
                result[key] = values
            else:
                floats: list[float] = []
                for _, _, p in items:
                    floats.extend(struct.unpack(f"<{len(p) // 4}f", p))  # type: ignore[arg-type]
                result[key] = floats
    return result
