"""TFRecord framing and tf.train.Example encoding, checked against TensorFlow as the reference reader."""

from __future__ import annotations

import gzip
import io
import random
import struct
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.published.layout import shard_suffix
from image_tfrecords.records.example import decode_example, encode_example
from image_tfrecords.records.tfrecord import (
    COMPRESSIONS,
    CorruptRecordError,
    TFRecordWriter,
    frame,
    masked_crc,
    read_records,
)

TF_COMPRESSION = {"none": "", "gzip": "GZIP"}


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


def _payloads() -> list[bytes]:
    rng = random.Random(1234)
    return [
        b"",
        b"\x00",
        b"hello tfrecord",
        rng.randbytes(11),  # shorter than a header
        rng.randbytes(12),  # exactly a header's length
        rng.randbytes(4096),
        rng.randbytes(150_000),
        frame(b"a record that looks like framing"),
    ]


PAYLOADS = _payloads()


def _write(records: list[bytes], compression: str) -> bytes:
    buf = io.BytesIO()
    with TFRecordWriter(buf, compression) as writer:
        for record in records:
            writer.write(record)
        assert writer.num_records == len(records)
    return buf.getvalue()


def _tf_read(tf: Any, path: Path, compression: str) -> list[bytes]:
    dataset = tf.data.TFRecordDataset(str(path), compression_type=TF_COMPRESSION[compression])
    return [bytes(r) for r in dataset.as_numpy_iterator()]


# -- framing ---------------------------------------------------------------------------------------
def test_masked_crc_matches_crc32c_reference_vector() -> None:
    # CRC32C("123456789") = 0xE3069283 (RFC 3720); TFRecord masks it: rotr15 + 0xA282EAD8.
    crc = 0xE3069283
    assert masked_crc(b"123456789") == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def test_frame_layout() -> None:
    data = b"payload"
    framed = frame(data)
    assert len(framed) == 8 + 4 + len(data) + 4
    assert struct.unpack("<Q", framed[:8])[0] == len(data)
    assert struct.unpack("<I", framed[8:12])[0] == masked_crc(framed[:8])
    assert framed[12:-4] == data
    assert struct.unpack("<I", framed[-4:])[0] == masked_crc(data)


def test_uncompressed_output_equals_tensorflows_writer(tf: Any, tmp_path: Path) -> None:
    path = tmp_path / "tf.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in PAYLOADS:
            writer.write(record)
    assert _write(PAYLOADS, "none") == path.read_bytes()


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_tensorflow_reads_our_records(tf: Any, tmp_path: Path, compression: str) -> None:
    path = tmp_path / f"shard{shard_suffix(compression)}"
    path.write_bytes(_write(PAYLOADS, compression))
    assert _tf_read(tf, path, compression) == PAYLOADS


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_read_records_round_trips(compression: str) -> None:
    data = _write(PAYLOADS, compression)
    assert list(read_records(io.BytesIO(data), compression)) == PAYLOADS


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_read_records_reads_tensorflows_files(tf: Any, tmp_path: Path, compression: str) -> None:
    path = tmp_path / "tf-written"
    options = tf.io.TFRecordOptions(compression_type=TF_COMPRESSION[compression])
    with tf.io.TFRecordWriter(str(path), options) as writer:
        for record in PAYLOADS:
            writer.write(record)
    with open(path, "rb") as f:
        assert list(read_records(f, compression)) == PAYLOADS


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_empty_file_has_no_records(tf: Any, tmp_path: Path, compression: str) -> None:
    data = _write([], compression)
    assert list(read_records(io.BytesIO(data), compression)) == []
    path = tmp_path / "empty"
    path.write_bytes(data)
    assert _tf_read(tf, path, compression) == []


@pytest.mark.parametrize("compression", COMPRESSIONS)
def test_same_records_give_identical_bytes(compression: str) -> None:
    first = _write(PAYLOADS, compression)
    second = _write(list(PAYLOADS), compression)
    assert first == second
    assert _write(PAYLOADS[:-1], compression) != first


def test_gzip_output_is_one_deterministic_member_of_the_plain_records() -> None:
    plain = _write(PAYLOADS, "none")
    packed = _write(PAYLOADS, "gzip")
    assert gzip.decompress(packed) == plain
    assert packed[:3] == b"\x1f\x8b\x08"
    flags, mtime = packed[3], struct.unpack("<I", packed[4:8])[0]
    assert flags & 0x08 == 0, "no file name stored"
    assert mtime == 0


def test_writer_rejects_unknown_compression() -> None:
    with pytest.raises(ValueError, match="compression"):
        TFRecordWriter(io.BytesIO(), "zlib")


def test_suffix() -> None:
    assert shard_suffix("none") == ".tfrecord"
    assert shard_suffix("gzip") == ".tfrecord.gz"


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_index_lists_each_record_start_and_length(compression: str, tmp_path: Path) -> None:
    """The .tfindex the writer keeps matches what tfrecord's own tfrecord2idx computes from the file."""
    records = [b"", b"x" * 7, b"y" * 1000, b"z"]
    raw = io.BytesIO()
    with TFRecordWriter(raw, compression) as writer:
        for record in records:
            writer.write(record)
    plain = raw.getvalue() if compression == "none" else gzip.decompress(raw.getvalue())
    expected, position = [], 0
    while position < len(plain):  # tfrecord2idx's walk: 8-byte length, 4-byte CRC, data, 4-byte CRC
        (length,) = struct.unpack("<Q", plain[position:position + 8])
        expected.append(f"{position} {length + 16}\n")
        position += length + 16
    assert writer.index().decode() == "".join(expected)
    assert len(expected) == len(records)


# -- corruption ------------------------------------------------------------------------------------
THREE = [b"first record", b"second record, a little longer", b"third"]


def _flip(data: bytes, offset: int) -> bytes:
    return data[:offset] + bytes([data[offset] ^ 0x01]) + data[offset + 1 :]


def _second_record_offsets() -> dict[str, int]:
    start = len(frame(THREE[0]))
    n = len(THREE[1])
    return {"length": start + 0, "length_high_byte": start + 7, "length_crc": start + 9,
            "data_first": start + 12, "data_middle": start + 12 + n // 2, "data_last": start + 12 + n - 1,
            "data_crc": start + 12 + n + 2}


@pytest.mark.parametrize("where", list(_second_record_offsets()))
def test_flipped_byte_is_detected(tf: Any, tmp_path: Path, where: str) -> None:
    bad = _flip(_write(THREE, "none"), _second_record_offsets()[where])
    records = read_records(io.BytesIO(bad))
    assert next(records) == THREE[0]
    with pytest.raises(CorruptRecordError, match="record 1"):
        next(records)
    path = tmp_path / "bad.tfrecord"
    path.write_bytes(bad)
    with pytest.raises(tf.errors.DataLossError):
        _tf_read(tf, path, "none")


@pytest.mark.parametrize("cut", [1, 4, 5, len(THREE[2]) + 4, len(THREE[2]) + 4 + 12 + 3])
def test_truncated_file_is_detected(tf: Any, tmp_path: Path, cut: int) -> None:
    good = _write(THREE, "none")
    bad = good[:-cut]
    with pytest.raises(CorruptRecordError, match="truncated"):
        list(read_records(io.BytesIO(bad)))
    path = tmp_path / "short.tfrecord"
    path.write_bytes(bad)
    with pytest.raises(tf.errors.DataLossError):  # TensorFlow sees a record header with missing data
        _tf_read(tf, path, "none")


@pytest.mark.parametrize("keep", [1, 8, 11])
def test_truncated_header_at_end_is_detected(keep: int) -> None:
    # Fewer than 12 bytes of a next record's header (TensorFlow silently stops there).
    bad = _write(THREE, "none") + frame(b"x" * 400)[:keep]
    records = read_records(io.BytesIO(bad))
    assert [next(records) for _ in THREE] == THREE
    with pytest.raises(CorruptRecordError, match="record 3: truncated header"):
        next(records)


@pytest.mark.parametrize("cut", [1, 8, 40])
def test_truncated_gzip_is_detected(cut: int) -> None:
    bad = _write(PAYLOADS, "gzip")[:-cut]
    with pytest.raises(CorruptRecordError):
        list(read_records(io.BytesIO(bad), "gzip"))


def test_corrupt_gzip_is_detected_by_both(tf: Any, tmp_path: Path) -> None:
    good = _write(PAYLOADS, "gzip")
    bad = _flip(good, len(good) // 2)
    with pytest.raises(CorruptRecordError):
        list(read_records(io.BytesIO(bad), "gzip"))
    path = tmp_path / "bad.tfrecord.gz"
    path.write_bytes(bad)
    with pytest.raises(tf.errors.DataLossError):
        _tf_read(tf, path, "gzip")


# -- tf.train.Example ------------------------------------------------------------------------------
FEATURES: dict[str, Any] = {
    "bytes": b"\x00\xff raw \x80",
    "text": "héllo wörld ✓",
    "int": 42,
    "zero": 0,
    "negative": -7,
    "max_int64": 2**63 - 1,
    "min_int64": -(2**63),
    "large": 1_234_567_890_123,
    "float": 1.5,
    "negative_float": -0.25,
    "ints": [3, -1, 2**40, 0],
    "floats": [0.5, -2.25, 1024.0],
    "bytes_list": [b"a", b"", b"\x00c"],
    "str_list": ["x", "yé"],
    "tuple_ints": (7, 8),
}


def _tf_feature(tf: Any, value: Any) -> Any:
    values = list(value) if isinstance(value, list | tuple) else [value]
    if all(isinstance(v, bytes | str) for v in values):
        return tf.train.Feature(bytes_list=tf.train.BytesList(
            value=[v.encode() if isinstance(v, str) else v for v in values]))
    if all(isinstance(v, int) for v in values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def _tf_example(tf: Any, features: dict[str, Any]) -> Any:
    return tf.train.Example(features=tf.train.Features(
        feature={key: _tf_feature(tf, features[key]) for key in sorted(features)}))


def test_parse_single_example_gives_the_values_back(tf: Any) -> None:
    spec = {
        "bytes": tf.io.FixedLenFeature([], tf.string),
        "text": tf.io.FixedLenFeature([], tf.string),
        "int": tf.io.FixedLenFeature([], tf.int64),
        "zero": tf.io.FixedLenFeature([], tf.int64),
        "negative": tf.io.FixedLenFeature([], tf.int64),
        "max_int64": tf.io.FixedLenFeature([], tf.int64),
        "min_int64": tf.io.FixedLenFeature([], tf.int64),
        "large": tf.io.FixedLenFeature([], tf.int64),
        "float": tf.io.FixedLenFeature([], tf.float32),
        "negative_float": tf.io.FixedLenFeature([], tf.float32),
        "ints": tf.io.FixedLenFeature([4], tf.int64),
        "floats": tf.io.VarLenFeature(tf.float32),
        "bytes_list": tf.io.VarLenFeature(tf.string),
        "str_list": tf.io.FixedLenFeature([2], tf.string),
        "tuple_ints": tf.io.VarLenFeature(tf.int64),
    }
    parsed = tf.io.parse_single_example(encode_example(FEATURES), spec)
    assert parsed["bytes"].numpy() == FEATURES["bytes"]
    assert parsed["text"].numpy().decode() == FEATURES["text"]
    for key in ("int", "zero", "negative", "max_int64", "min_int64", "large"):
        assert int(parsed[key].numpy()) == FEATURES[key], key
    assert float(parsed["float"].numpy()) == 1.5
    assert float(parsed["negative_float"].numpy()) == -0.25
    assert parsed["ints"].numpy().tolist() == FEATURES["ints"]
    assert tf.sparse.to_dense(parsed["floats"]).numpy().tolist() == FEATURES["floats"]
    assert tf.sparse.to_dense(parsed["bytes_list"]).numpy().tolist() == FEATURES["bytes_list"]
    assert [v.decode() for v in parsed["str_list"].numpy()] == FEATURES["str_list"]
    assert tf.sparse.to_dense(parsed["tuple_ints"]).numpy().tolist() == [7, 8]


def test_empty_list_parses_as_empty_var_len_feature(tf: Any) -> None:
    parsed = tf.io.parse_single_example(encode_example({"k": [], "n": 1}),
                                        {"k": tf.io.VarLenFeature(tf.string),
                                         "n": tf.io.FixedLenFeature([], tf.int64)})
    assert parsed["k"].values.numpy().tolist() == []
    assert int(parsed["n"].numpy()) == 1


def test_pipeline_example_is_byte_identical_to_tensorflows(tf: Any) -> None:
    # The keys the shard writer uses (no key is a prefix of another).
    features = {
        "image/encoded": bytes(range(256)) * 3,
        "image/format": "jpeg",
        "image/height": 480,
        "image/width": 640,
        "image/channels": 3,
        "image/class/label": 2,
        "image/class/text": "roses",
        "image/filename": "roses/2024/a b,'c\".jpg",
        "image/sha256": "ab" * 32,
    }
    ours = encode_example(features)
    reference = _tf_example(tf, features)
    assert ours == reference.SerializeToString(deterministic=True)
    assert tf.train.Example.FromString(ours) == reference


@pytest.mark.parametrize("key", sorted(FEATURES))
def test_each_feature_kind_is_byte_identical_to_tensorflows(tf: Any, key: str) -> None:
    features = {key: FEATURES[key]}
    assert encode_example(features) == _tf_example(tf, features).SerializeToString(deterministic=True)


def test_all_features_equal_tensorflows_message(tf: Any) -> None:
    # TensorFlow's protobuf (upb) orders map keys differently when one key is a prefix of another
    # ("int" / "ints"), so compare the parsed messages rather than bytes here.
    ours = encode_example(FEATURES)
    assert tf.train.Example.FromString(ours) == _tf_example(tf, FEATURES)


def test_key_order_does_not_change_the_bytes() -> None:
    keys = list(FEATURES)
    expected = encode_example(FEATURES)
    rng = random.Random(5)
    for _ in range(5):
        rng.shuffle(keys)
        assert encode_example({k: FEATURES[k] for k in keys}) == expected
    assert encode_example(dict(reversed(FEATURES.items()))) == expected


def _expected_decoded(value: Any) -> list[Any]:
    values = list(value) if isinstance(value, list | tuple) else [value]
    return [v.encode() if isinstance(v, str) else v for v in values]


def test_decode_example_round_trips() -> None:
    decoded = decode_example(encode_example(FEATURES))
    assert decoded == {key: _expected_decoded(value) for key, value in FEATURES.items()}


def test_decode_example_reads_tensorflows_serialization(tf: Any) -> None:
    decoded = decode_example(_tf_example(tf, FEATURES).SerializeToString())
    assert decoded == {key: _expected_decoded(value) for key, value in FEATURES.items()}


def test_decode_example_floats_are_float32() -> None:
    assert decode_example(encode_example({"f": 0.1}))["f"] == [struct.unpack("<f", struct.pack("<f", 0.1))[0]]


@pytest.mark.parametrize("value", [True, None, {"a": 1}, [1, 1.5], [b"a", 1], 3 + 4j])
def test_unsupported_values_raise_type_error(value: Any) -> None:
    with pytest.raises(TypeError):
        encode_example({"k": value})


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 2**64])
def test_out_of_range_int_is_rejected(value: int) -> None:
    with pytest.raises((ValueError, OverflowError, TypeError)):
        encode_example({"k": value})


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _ld(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def test_decode_example_unpacked_negative_int(tf: Any) -> None:
    # Protobuf parsers must accept repeated int64 both packed and unpacked; TensorFlow does.
    int64_list = _varint(1 << 3 | 0) + _varint(-5) + _varint(1 << 3 | 0) + _varint(3)
    data = _ld(1, _ld(1, _ld(1, b"k") + _ld(2, _ld(3, int64_list))))
    assert list(tf.train.Example.FromString(data).features.feature["k"].int64_list.value) == [-5, 3]
    assert decode_example(data) == {"k": [-5, 3]}
