"""Splicing trusts a base shard's index and framing only when they agree: the checks of ``shards.splice``
(``_base_index``, ``check_framing``) on real TFRecord bytes, sound and damaged."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from image_tfrecords.records.tfrecord import TFRecordWriter
from image_tfrecords.shards.splice import DamagedBase, _base_index, check_framing
from image_tfrecords.storage import Storage


def _shard(count: int = 6) -> tuple[bytes, bytes, list[tuple[int, int]]]:
    out = io.BytesIO()
    writer = TFRecordWriter(out)
    for number in range(count):
        writer.write(bytes([number]) * (10 + 7 * number))
    return out.getvalue(), writer.index(), writer.offsets


def _index_of(tmp_path: Path, index: bytes, count: int, num_bytes: int,
              runs: list[list[int]] | None = None) -> tuple[list[int], list[int]]:
    shard = tmp_path / "train-00000-of-00001.tfrecord"
    shard.with_suffix(".tfindex").write_bytes(index)
    origin = {"num_records": count, "num_bytes": num_bytes, "runs": runs if runs is not None else [[0, count]]}
    return _base_index(Storage(), str(shard), origin)


def test_a_sound_index_parses_to_its_records_and_every_record_is_framed(tmp_path: Path) -> None:
    data, index, offsets = _shard()
    starts, lengths = _index_of(tmp_path, index, len(offsets), len(data))
    assert list(zip(starts, lengths, strict=True)) == offsets
    check_framing(data, lengths)  # raises nothing
    check_framing(data[starts[3]:], lengths[3:], starts[3])


@pytest.mark.parametrize("index, why", [
    (b"0 26\n26 33\n", "does not parse"),  # two records where the manifest says six
    (b"0 26\n26 x\n" + b"0 1\n" * 4, "does not parse"),
    (b"0 26 1\n26\n" + b"0 1\n" * 4, "does not"),  # tokens that pair up, lines that do not
])
def test_an_index_that_does_not_parse_as_its_records_is_damage(index: bytes, why: str, tmp_path: Path) -> None:
    data, _, offsets = _shard()
    with pytest.raises(DamagedBase, match=why):
        _index_of(tmp_path, index, len(offsets), len(data))


def test_an_index_with_a_gap_a_short_record_or_foreign_runs_is_damage(tmp_path: Path) -> None:
    data, index, offsets = _shard()
    gap = [(start + (5 if number == 3 else 0), length) for number, (start, length) in enumerate(offsets)]
    short = [(start, 12 if number == len(offsets) - 1 else length) for number, (start, length) in enumerate(offsets)]
    for bad in (gap, short):
        text = "".join(f"{a} {b}\n" for a, b in bad).encode()
        with pytest.raises(DamagedBase, match="end to end"):
            _index_of(tmp_path, text, len(offsets), len(data))
    with pytest.raises(DamagedBase, match="not records of it"):
        _index_of(tmp_path, index, len(offsets), len(data), runs=[[0, 3], [2, 7]])
    assert _index_of(tmp_path, index, len(offsets), len(data))[0][0] == 0


@pytest.mark.parametrize("byte, why", [(0, "not framed"), (9, "CRC"), (20, "CRC")])  # length, its CRC, the data
def test_a_record_whose_bytes_were_changed_is_damage(byte: int, why: str) -> None:
    data, _, offsets = _shard()
    lengths = [length for _, length in offsets]
    damaged = bytearray(data)
    damaged[offsets[4][0] + byte] ^= 0x01
    with pytest.raises(DamagedBase, match=f"at byte {offsets[4][0]} .*{why}"):
        check_framing(bytes(damaged), lengths)
    check_framing(bytes(damaged)[:offsets[4][0]], lengths[:4])  # the records before it are sound
