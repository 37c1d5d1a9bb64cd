"""Encode and decode ``tf.train.Example`` protocol buffers without importing TensorFlow.

The wire format is small and stable (tensorflow/core/example/{example,feature}.proto):
Example{1: Features{1: map<string, Feature>}}, Feature oneof {1: BytesList, 2: FloatList,
3: Int64List}, each list a repeated field 1 (numbers packed). Keys are written in sorted order,
so one record always has one byte string; ``tf.io.parse_single_example`` reads it.
"""

from __future__ import annotations

import functools
import struct
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

FeatureValue = bytes | str | int | float | Sequence[bytes] | Sequence[int] | Sequence[float] | array


_INT64 = range(-(1 << 63), 1 << 63)


def _varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL[value]
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


_SMALL = [bytes((i,)) for i in range(128)]


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited field."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _feature(value: FeatureValue) -> bytes:
    if isinstance(value, bytes):  # the common scalar cases first: most of the writer's time is here
        inner = b"\x0a" + _varint(len(value)) + value
        return b"\x0a" + _varint(len(inner)) + inner
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 63:
        number = _varint(value)
        return b"\x1a" + _varint(len(number) + 2) + b"\x0a" + _varint(len(number)) + number
    if isinstance(value, array):  # a typed list, so that an empty one keeps its type
        if value.typecode in "bBhHiIlLqQ":
            return _feature_ints(list(value))
        return _field(2, _field(1, struct.pack(f"<{len(value)}f", *value)) if len(value) else b"")
    values = list(value) if isinstance(value, list | tuple) else [value]
    if all(isinstance(v, bytes | str) for v in values):
        items = b"".join(_field(1, v.encode() if isinstance(v, str) else v) for v in values)
        return _field(1, items)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return _feature_ints(values)
    if all(isinstance(v, float) for v in values):
        return _field(2, _field(1, struct.pack(f"<{len(values)}f", *values)) if values else b"")
    raise TypeError(f"unsupported feature value {value!r}")


def _feature_ints(values: list[int]) -> bytes:
    if any(v not in _INT64 for v in values):
        raise ValueError(f"integer out of int64 range in {values!r}")
    return _field(3, _field(1, b"".join(_varint(v) for v in values)) if values else b"")


@functools.lru_cache(maxsize=1024)
def _key(key: str) -> bytes:
    """A map entry's key field."""
    return _field(1, key.encode())


def encode_example(features: Mapping[str, FeatureValue]) -> bytes:
    """Serialize a ``tf.train.Example`` from ``{key: bytes | str | int | float | list}``."""
    parts = []
    for key in sorted(features):
        entry = _key(key) + _field(2, _feature(features[key]))
        parts.append(b"\x0a" + _varint(len(entry)) + entry)
    return _field(1, b"".join(parts))


@functools.cache
def _example_class() -> Any:
    """The ``tf.train.Example`` message class, built from its schema with protobuf (no TensorFlow)."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    proto = descriptor_pb2.FileDescriptorProto(name="image_tfrecords/example.proto", package="image_tfrecords",
                                               syntax="proto3")
    types = descriptor_pb2.FieldDescriptorProto
    optional, repeated = types.LABEL_OPTIONAL, types.LABEL_REPEATED

    def message(name: str, *fields: tuple[str, int, int, int, str]) -> descriptor_pb2.DescriptorProto:
        msg = proto.message_type.add(name=name)
        for field_name, number, label, kind, type_name in fields:
            field = msg.field.add(name=field_name, number=number, label=label, type=kind)
            if type_name:
                field.type_name = f".image_tfrecords.{type_name}"
        return msg

    message("BytesList", ("value", 1, repeated, types.TYPE_BYTES, ""))
    message("FloatList", ("value", 1, repeated, types.TYPE_FLOAT, ""))
    message("Int64List", ("value", 1, repeated, types.TYPE_INT64, ""))
    feature = message("Feature", ("bytes_list", 1, optional, types.TYPE_MESSAGE, "BytesList"),
                      ("float_list", 2, optional, types.TYPE_MESSAGE, "FloatList"),
                      ("int64_list", 3, optional, types.TYPE_MESSAGE, "Int64List"))
    feature.oneof_decl.add(name="kind")
    for field in feature.field:
        field.oneof_index = 0
    features = message("Features", ("feature", 1, repeated, types.TYPE_MESSAGE, "Features.FeatureEntry"))
    entry = features.nested_type.add(name="FeatureEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, label=optional, type=types.TYPE_STRING)
    entry.field.add(name="value", number=2, label=optional, type=types.TYPE_MESSAGE,
                    type_name=".image_tfrecords.Feature")
    message("Example", ("features", 1, optional, types.TYPE_MESSAGE, "Features"))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("image_tfrecords.Example"))


def decode_example(data: bytes) -> dict[str, list[bytes] | list[int] | list[float]]:
    """Parse a serialized Example into ``{key: list of values}``; raise ValueError if it does not parse.

    Parsing uses protobuf's own (upb, C) parser with the Example schema: an implementation independent of
    ``encode_example``, so validation does not only confirm what the writer believes it wrote.
    """
    result: dict[str, list[bytes] | list[int] | list[float]] = {}
    for key, feature in parse_example(data).features.feature.items():
        kind = feature.WhichOneof("kind")
        result[key] = list(getattr(feature, kind).value) if kind else []
    return result


def parse_example(data: bytes) -> Any:
    """The ``tf.train.Example`` message of ``data`` (protobuf's parser, as in ``decode_example``), for readers
    that take a few known keys (``message.features.feature[key].bytes_list.value``); ValueError if it does
    not parse."""
    from google.protobuf.message import DecodeError

    example = _example_class()()
    try:
        example.ParseFromString(data)
    except DecodeError as exc:
        raise ValueError(f"not a tf.train.Example: {exc}") from exc
    return example
