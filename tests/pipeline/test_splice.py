"""Spliced shards (issue 22): byte ranges of the base shard plus new records, the same bytes as the
record-by-record reference path, with only the new records parsed.

Real parts: a local folder, the pipeline's stages, TensorFlow reading what was published.
"""

from __future__ import annotations

import csv
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.published import layout
from image_tfrecords.shards import splice
from image_tfrecords.shards.splice import splice_shard
from image_tfrecords.shards.writer import rewrite_shard
from image_tfrecords.staging import PLAN, RECEIPTS, SHARDS, staged
from image_tfrecords.storage import Storage, is_s3, join
from image_tfrecords.storage.documents import read_json
from tests.pipeline.test_incremental import Images, add, base_source, build, check_version, config, read


def night(tmp_path: Path, per_class: int = 12, bucket: str | None = None):
    """v1, then a night: scattered deletions, a changed image, added images; stages run up to the plan.
    With a ``bucket``, source and destination are on the S3 server."""
    storage = Storage()
    source = base_source(tmp_path, storage, bucket, per_class=per_class)
    dest = f"s3://{bucket}/out" if bucket else str(tmp_path / "out")
    build(storage, source.uri, dest, "d", "v1")
    names = sorted(source.files())
    for name in names[::7]:
        source.delete(name)
    changed = names[3]
    images = Images(tmp_path / "new")
    source.put(changed, images.take(1, Path(changed).suffix)[0][1])
    add(source, images, "triangles", "n", 4)
    cfg = config(source.uri, dest, "d", "v2")
    for stage in stages.PIPELINE[:4]:  # discover, inspect, split, plan
        stage.run(cfg, storage, **({"workers": 1} if stage.per_image else {}))
    return storage, source, cfg


@pytest.fixture(params=["local", "s3"])
def bucket_or_none(request: pytest.FixtureRequest) -> str | None:
    if request.param == "local":
        return None
    request.getfixturevalue("s3_env")
    return request.getfixturevalue("bucket")


def test_a_spliced_shard_is_the_reference_rewrite_byte_for_byte(tmp_path: Path, bucket_or_none: str | None) -> None:
    storage, _, cfg = night(tmp_path, bucket=bucket_or_none)
    rewrites = read_json(storage, staged(cfg, PLAN))["rewrite"]
    assert rewrites and all(origin["runs"] for origin in rewrites.values())
    assert any(len(origin["runs"]) > 1 for origin in rewrites.values()), "no shard lost a record in its middle"
    assert any(origin["appended"] for origin in rewrites.values()), "no shard took new records"
    _splices_are_the_reference(storage, cfg, rewrites)


def _splices_are_the_reference(storage: Storage, cfg: BuildConfig, rewrites: dict[str, dict[str, Any]]) -> None:
    """Each rewritten shard, spliced, is byte for byte the record-by-record reference, with its digest and index."""
    for shard, origin in sorted(rewrites.items()):
        shard_uri = staged(cfg, SHARDS, shard)
        reference = rewrite_shard(cfg, storage, shard, origin, read_workers=1)
        want = storage.read_bytes(shard_uri), storage.read_bytes(layout.index_file(shard_uri))
        checked = _splice_again(storage, cfg, shard, origin)
        got = storage.read_bytes(shard_uri), storage.read_bytes(layout.index_file(shard_uri))
        assert got == want, shard
        assert checked["sha256"] == reference["sha256"] == hashlib.sha256(got[0]).hexdigest()
        assert checked["index_sha256"] == reference["index_sha256"]
        assert checked["records_parsed"] == origin["appended"] == checked["num_records"] - origin["kept"]
        assert checked["bytes_copied"] + checked["bytes_written"] == checked["num_bytes"] == len(got[0])
        assert checked["bytes_copied"] <= checked["bytes_kept"] <= checked["num_bytes"]
        # on S3 the base is downloaded whole (its long runs then copied by the store); locally only its kept bytes
        assert checked["base_bytes_read"] == (origin["num_bytes"] if is_s3(cfg.dataset_uri) else checked["bytes_kept"])


@pytest.mark.parametrize("piece", [1, 1 << 16, 1 << 30], ids=["record-by-record", "64KiB", "whole-runs"])
def test_spliced_shards_are_the_reference_whatever_piece_their_kept_bytes_are_read_in(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, piece: int) -> None:
    """The kept bytes are read, checked, hashed and written a piece of whole records at a time: one record a piece,
    a few, or a whole run give the same shard."""
    monkeypatch.setattr(splice, "PIECE", piece)
    storage, _, cfg = night(tmp_path)
    _splices_are_the_reference(storage, cfg, read_json(storage, staged(cfg, PLAN))["rewrite"])


def test_writes_that_take_fewer_bytes_than_asked_still_give_the_reference(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``write`` that takes only part of a piece is followed by another for the rest, and no byte is hashed
    twice."""
    real_write, writes = os.write, []

    def short_write(fd: int, data: Any) -> int:
        writes.append(len(data))
        return real_write(fd, memoryview(data)[:1000])

    monkeypatch.setattr(os, "write", short_write)
    storage, _, cfg = night(tmp_path)
    _splices_are_the_reference(storage, cfg, read_json(storage, staged(cfg, PLAN))["rewrite"])
    assert any(size > 1000 for size in writes)  # pieces were cut short


def test_splices_that_share_no_prefix_or_all_of_it_with_the_base_are_the_reference(tmp_path: Path) -> None:
    """A shard that loses its first record shares no prefix with its base, a shard that only takes new records
    shares all of it: both are the reference."""
    storage = Storage()
    source = base_source(tmp_path, storage, None, per_class=12)
    dest = str(tmp_path / "out")
    build(storage, source.uri, dest, "d", "v1")
    with open(tmp_path / "out" / "d" / "v1" / layout.LABELS, newline="") as f:
        places = {(row["shard"], int(row["shard_position"])): row["filename"] for row in csv.DictReader(f)}
    first_of = sorted(shard for shard, place in places if place == 0 and shard.startswith("train"))[0]
    source.delete(places[first_of, 0])
    add(source, Images(tmp_path / "new"), "triangles", "n", 2)
    cfg = config(source.uri, dest, "d", "v2")
    for stage in stages.PIPELINE[:4]:  # discover, inspect, split, plan
        stage.run(cfg, storage, **({"workers": 1} if stage.per_image else {}))
    rewrites = read_json(storage, staged(cfg, PLAN))["rewrite"]
    assert [origin["runs"][0][0] for origin in rewrites.values() if origin["file"] == first_of] == [1], rewrites
    assert any(origin["runs"] == [[0, origin["num_records"]]] and origin["appended"] for origin in rewrites.values())
    _splices_are_the_reference(storage, cfg, rewrites)


def test_a_night_parses_only_its_new_records_and_copies_the_rest(tmp_path: Path) -> None:
    storage, source, cfg = night(tmp_path)
    result = stages.run_pipeline(cfg, storage)
    v2 = read(storage, result["uri"])
    check_version(storage, v2, source.files())
    build_facts = v2.build
    new_records = build_facts["files_inspected"]  # the added and changed images: the only files read
    assert build_facts["shards_spliced"] == build_facts["shards_rewritten"] > 0
    assert build_facts["records_parsed"] == new_records
    entries = v2.entries
    assert build_facts["bytes_copied"] + build_facts["bytes_written"] == sum(e["num_bytes"] for e in entries.values())
    assert build_facts["base_bytes_read"] == build_facts["bytes_kept"] > 0  # locally: only the kept bytes are read


@pytest.mark.parametrize("damage", ["index", "framing", "inside_a_run", "data"])
def test_a_base_whose_index_or_framing_lies_is_not_spliced(damage: str, tmp_path: Path) -> None:
    """A base .tfindex that no longer lists the records end to end, a record whose length field was changed (the
    first kept one, or one inside a kept run), or a byte of a kept record's data flipped (its data CRC fails): the
    shard is written from the source, and holds the right records."""
    storage, _, cfg = night(tmp_path)
    rewrites = read_json(storage, staged(cfg, PLAN))["rewrite"]
    shard, origin = next((s, o) for s, o in sorted(rewrites.items()) if o["kept"] > 1 and
                         (damage != "inside_a_run" or any(stop - start > 2 for start, stop in o["runs"])))
    old = Path(cfg.dataset_uri, "v1", origin["file"])
    index = Path(layout.index_file(str(old)))
    lines = index.read_text().splitlines()
    if damage == "index":
        start, length = lines[1].split()
        lines[1] = f"{int(start) + 1} {length}"
        index.write_text("\n".join(lines) + "\n")
        origin = {**origin, "index_sha256": None}  # as a base from before index digests
    else:
        data = bytearray(old.read_bytes())
        first = next(a for a, b in origin["runs"] if damage != "inside_a_run" or b - a > 2)
        start = int(lines[first + (damage == "inside_a_run")].split()[0])
        data[start + (20 if damage == "data" else 0)] ^= 0x01  # its length field, or a byte of its data
        old.write_bytes(bytes(data))
    checked = splice_shard(cfg, storage, shard, origin, read_workers=1)
    assert checked["fallback"].startswith(f"{old} is damaged")
    assert ("fails its CRC" in checked["fallback"]) == (damage == "data"), checked["fallback"]
    assert "rewritten_from" not in checked
    check = stages.validate_shard(cfg, storage, shard)
    assert check["num_records"] == checked["num_records"]


def test_records_keep_their_place_across_nights(tmp_path: Path) -> None:
    """labels.csv's shard_position is each record's line in its shard's .tfindex, night after night."""
    storage, source, cfg = night(tmp_path, per_class=8)
    stages.run_pipeline(cfg, storage)
    images = Images(tmp_path / "more", seed=5000)
    for number in range(3, 5):
        for name in sorted(source.files())[::5]:
            source.delete(name)
        add(source, images, "circles", f"n{number}", 3)
        build(storage, source.uri, cfg.destination, "d", f"v{number}")
        version = read(storage, join(cfg.dataset_uri, f"v{number}"))
        check_version(storage, version, source.files())  # checks shard_position against TensorFlow's order
        assert version.build["mode"] == "incremental"


def test_odd_file_names_survive_nights_of_rows_copied_as_text(tmp_path: Path) -> None:
    """Names with commas, quotes, a line feed and a carriage return (quoted CSV fields spanning lines):
    the nights that copy inspected.csv, records.csv and labels.csv rows on as text keep them whole."""
    storage = Storage()
    source = base_source(tmp_path, storage, None, per_class=6)
    images = Images(tmp_path / "odd")
    odd = ['circles/a,b.jpg', 'circles/say "cheese".jpg', 'squares/two\nlines.jpg', 'squares/cr\rhere.jpg',
           'triangles/"quoted".jpg']
    for name in odd:
        source.put(name, images.take(1, ".jpg")[0][1])
    dest = str(tmp_path / "out")
    build(storage, source.uri, dest, "d", "v1")
    for number, name in enumerate(odd[:2]):
        source.delete(name)
        add(source, images, "squares", f"night{number}", 2)
        build(storage, source.uri, dest, "d", f"v{number + 2}")
        version = read(storage, join(dest, "d", f"v{number + 2}"))
        check_version(storage, version, source.files())
        assert version.build["mode"] == "incremental" and version.build["inspections_reused"] > 0
        full = tmp_path / f"full{number}"
        build(storage, source.uri, str(full), "d", f"v{number + 2}", full=True)
        assert version.rows == read(storage, join(str(full), "d", f"v{number + 2}")).rows


def _splice_again(storage: Storage, cfg: BuildConfig, shard: str, origin: dict[str, Any]) -> dict[str, Any]:
    storage.delete(staged(cfg, RECEIPTS, shard + ".json"))  # not "already written": splice it
    storage.delete(staged(cfg, SHARDS, shard))
    return splice_shard(cfg, storage, shard, origin, read_workers=1)
