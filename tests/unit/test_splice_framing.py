"""Splicing trusts a base shard's index and framing only when they agree: the column checks of
``shards.splice`` (``_index``, ``_check_framing``) on real TFRecord bytes, sound and damaged."""

from __future__ import annotations

import io

import pytest

from image_tfrecords.records.tfrecord import TFRecordWriter
from image_tfrecords.shards.splice import DamagedBase, _check_framing, _index, _kept


def _shard(count: int = 6) -> tuple[bytes, bytes, list[tuple[int, int]]]:
    out = io.BytesIO()
    writer = TFRecordWriter(out)
    for number in range(count):
        writer.write(bytes([number]) * (10 + 7 * number))
    return out.getvalue(), writer.index(), writer.offsets


def test_a_sound_index_parses_to_its_records_and_every_kept_record_is_framed() -> None:
    data, index, offsets = _shard()
    starts, lengths = _index(index, len(offsets))
    assert list(zip(starts.tolist(), lengths.tolist(), strict=True)) == offsets
    _check_framing(memoryview(data), starts, lengths, _kept([[0, 2], [3, 6]]))  # raises nothing
    _check_framing(memoryview(data), starts, lengths, _kept([]))
    assert _kept([[1, 3], [4, 5]]).tolist() == [1, 2, 4]


@pytest.mark.parametrize("index, why", [
    (b"0 26\n26 33\n", "does not parse"),  # two records where the manifest says six
    (b"0 26\n26 x\n" + b"0 1\n" * 4, "does not parse"),
    (b"0 26 1\n26\n" + b"0 1\n" * 4, "tfindex does not"),  # tokens that pair up, lines that do not
])
def test_an_index_that_does_not_parse_as_its_records_is_damage(index: bytes, why: str) -> None:
    with pytest.raises(DamagedBase, match=why):
        _index(index, 6)


def test_an_index_with_a_gap_or_a_short_record_is_damage() -> None:
    _, index, offsets = _shard()
    gap = [(start + (5 if number == 3 else 0), length) for number, (start, length) in enumerate(offsets)]
    short = [(start, 12 if number == len(offsets) - 1 else length) for number, (start, length) in enumerate(offsets)]
    for bad in (gap, short):
        text = "".join(f"{a} {b}\n" for a, b in bad).encode()
        with pytest.raises(DamagedBase, match="end to end"):
            _index(text, len(offsets))
    assert _index(index, len(offsets))[0][0] == 0


@pytest.mark.parametrize("byte", [0, 9])  # the length field, then its CRC
def test_a_kept_record_whose_header_was_changed_is_damage(byte: int) -> None:
    data, index, offsets = _shard()
    starts, lengths = _index(index, len(offsets))
    damaged = bytearray(data)
    damaged[offsets[4][0] + byte] ^= 0x01
    with pytest.raises(DamagedBase, match=f"at byte {offsets[4][0]} "):
        _check_framing(memoryview(bytes(damaged)), starts, lengths, _kept([[0, 6]]))
    _check_framing(memoryview(bytes(damaged)), starts, lengths, _kept([[0, 4], [5, 6]]))  # record 4 not kept


def test_with_a_proven_index_the_first_record_of_each_run_is_checked() -> None:
    """An index proven by its published digest: the framing of each run's first record is checked (the base's
    SHA-256 proves the bytes between); an index from before index digests: every kept record's."""
    from image_tfrecords.shards.splice import _framed

    runs = [[0, 3], [4, 6]]
    assert _framed(runs, True).tolist() == [0, 4]
    assert _framed(runs, False).tolist() == [0, 1, 2, 4, 5]
    data, index, offsets = _shard()
    starts, lengths = _index(index, len(offsets))
    damaged = bytearray(data)
    damaged[offsets[4][0]] ^= 0x01  # the first record of the second run
    with pytest.raises(DamagedBase, match=f"at byte {offsets[4][0]} "):
        _check_framing(memoryview(bytes(damaged)), starts, lengths, _framed(runs, True))
