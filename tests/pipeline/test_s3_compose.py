"""Spliced shards on S3 (issue 22): kept runs copied by the store with ``UploadPartCopy``, the rest uploaded.

Real parts: the SeaweedFS server (which enforces S3's 5 MiB minimum part and checks each part's
SHA-256), the pipeline's stages, TensorFlow reading what was published.
"""

from __future__ import annotations

import hashlib
import io
import random
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from image_tfrecords import stages
from image_tfrecords.errors import SourceChanged
from image_tfrecords.published import layout
from image_tfrecords.shards.splice import splice_shard
from image_tfrecords.shards.writer import rewrite_shard
from image_tfrecords.staging import PLAN, RECEIPTS, SHARDS, staged
from image_tfrecords.storage import Segment, Storage, join, split_s3
from image_tfrecords.storage.documents import read_json
from image_tfrecords.storage.multipart import MIN_PART, copied_bytes, plan_parts
from tests.pipeline.test_incremental import Source, build, config, read

MiB = 1 << 20


def segments_of(pieces: list[tuple[bytes, str | None, int]]) -> list[Segment]:
    return [Segment(len(data), lambda start, count, data=data: data[start:start + count], source, offset)
            for data, source, offset in pieces]


def assembled(parts, sources: dict[str, bytes]) -> bytes:
    """The object the parts make: copies from ``sources``, uploads from the worker, temporary objects first."""
    return b"".join(assembled(p.parts, sources) if p.parts is not None else
                    sources[p.source][p.offset:p.offset + p.length] if p.source else p.body() for p in parts)


def follow_s3s_rules(parts, min_part: int, max_copy: int, max_put: int) -> None:
    """Every part but the last (of the object, and of each temporary object) is at least ``min_part``."""
    assert all(p.size >= min_part for p in parts[:-1])
    for p in parts:
        if p.parts is not None:
            follow_s3s_rules(p.parts, min_part, max_copy, max_put)
        elif p.source:
            assert p.size <= max_copy
        else:
            assert p.size <= 2 * max(max_put, min_part)


@pytest.mark.parametrize("seed", range(40))
def test_planned_parts_follow_s3s_rules_and_give_the_same_bytes(seed: int) -> None:
    """Random runs of a base object and new bytes (with a 100-byte minimum part so that many shapes
    occur): every part but the last is at least the minimum, only ranges of the base are copied, and
    the parts joined are the segments joined."""
    rng = random.Random(seed)
    base = rng.randbytes(5000)
    pieces, expected = [], b""
    for _ in range(rng.randint(1, 12)):
        if rng.random() < 0.7:
            start = rng.randrange(len(base))
            stop = min(len(base), start + rng.choice([1, 30, 99, 100, 150, 250, 700]))
            pieces.append((base[start:stop], "s3://b/base", start))
        else:
            data = rng.randbytes(rng.choice([1, 50, 120, 400]))
            pieces.append((data, None, 0))
        expected += pieces[-1][0]
    parts = plan_parts(segments_of(pieces), min_part=100, max_copy=300, max_put=250)
    assert assembled(parts, {"s3://b/base": base}) == expected
    follow_s3s_rules(parts, 100, 300, 250)
    new_bytes = sum(len(d) for d, source, _ in pieces if not source)
    # through the worker: the new bytes, and at most a minimum part of the base's for a short first run and for
    # each short run right after another (topped up)
    short_runs = sum(1 for d, source, _ in pieces if source and len(d) < 100)
    assert len(expected) - copied_bytes(parts) <= new_bytes + 100 * (1 + short_runs)
    assert all(inner.parts is None for p in parts if p.parts is not None for inner in p.parts)  # never nested
    copyable = [len(d) for d, source, _ in pieces if source]
    if any(n >= 200 for n in copyable):  # a run of twice the minimum is always copied, at least in part
        assert copied_bytes(parts) > 0
    if all(len(d) >= 100 for d, source, _ in pieces if source) and pieces[0][1]:
        assert len(expected) - copied_bytes(parts) == new_bytes  # whole runs: no byte of the base through the worker


def test_a_short_run_joins_the_last_minimum_part_before_it_in_the_store() -> None:
    """A run shorter than the minimum between two long ones is not uploaded: it becomes a temporary object with
    the last minimum part of the run before it (so only that much is copied twice); a short first run is the
    only base bytes that go through the worker."""
    base = bytes(range(256)) * 8
    parts = plan_parts(segments_of([(base[:500], "s3://b/base", 0), (base[600:630], "s3://b/base", 600),
                                    (base[700:1100], "s3://b/base", 700), (b"new", None, 0)]), min_part=100)
    assert [(p.source, p.offset, p.length) for p in parts[:1]] == [("s3://b/base", 0, 400)]
    assert [(p.source, p.offset, p.length) for p in parts[1].parts] == [("s3://b/base", 400, 100),
                                                                        ("s3://b/base", 600, 30)]
    assert [(p.source, p.offset, p.length) for p in parts[2:3]] == [("s3://b/base", 700, 400)]
    assert parts[3].body() == b"new" and len(parts) == 4
    assert copied_bytes(parts) == 930
    first_short = plan_parts(segments_of([(base[:30], "s3://b/base", 0), (base[40:400], "s3://b/base", 40)]),
                             min_part=100)
    assert [p.source for p in first_short] == [None, "s3://b/base"]
    assert first_short[0].body() == base[:30] + base[40:110] and copied_bytes(first_short) == 290


def test_many_short_runs_side_by_side_never_nest_temporary_objects() -> None:
    """A 10 MiB run, then 600 runs of 100 KB (every other record dropped, as when a label is removed): no
    temporary object holds another (each would copy the last again: quadratic), nothing recurses, and what
    goes through the worker is bounded by the top-ups (at most one minimum part per two short runs)."""
    base_length = 10 * MiB + 1200 * 100_000
    segments = [Segment(10 * MiB, lambda start, count: bytes(count), "s3://b/base", 0)]
    segments += [Segment(100_000, lambda start, count: bytes(count), "s3://b/base", 10 * MiB + 200_000 * k)
                 for k in range(600)]
    parts = plan_parts(segments)
    assert all(inner.parts is None for p in parts if p.parts is not None for inner in p.parts)
    assert all(p.size >= MIN_PART for p in parts[:-1])
    total = 10 * MiB + 600 * 100_000
    assert sum(p.size for p in parts) == total < base_length
    assert copied_bytes(parts) <= total  # the store copies each kept byte at most once, plus the joined tails
    assert total - copied_bytes(parts) <= (600 // 2 + 1) * MIN_PART


def test_compose_copies_long_runs_in_the_store(s3_storage: Storage, bucket: str) -> None:
    """Long runs of the base object are copied server-side, short ones and new bytes uploaded; the object is
    exactly the segments, and its SHA-256 is the whole object's (from its metadata), also after a copy."""
    rng = random.Random(7)
    base_uri, dst = f"s3://{bucket}/base", f"s3://{bucket}/new"
    base = rng.randbytes(20 * MiB)
    s3_storage.write_bytes(base_uri, base)
    tag = s3_storage.s3.head_object(Bucket=bucket, Key="base")["ETag"]
    pieces = [(base[:6 * MiB], base_uri, 0), (base[7 * MiB:7 * MiB + 1000], base_uri, 7 * MiB),
              (rng.randbytes(3 * MiB), None, 0), (base[8 * MiB:20 * MiB], base_uri, 8 * MiB),
              (rng.randbytes(5000), None, 0)]
    expected = b"".join(data for data, _, _ in pieces)
    digest = hashlib.sha256(expected).hexdigest()
    copied = s3_storage.compose(dst, segments_of(pieces), digest, {base_uri: tag})
    assert s3_storage.read_bytes(dst) == expected
    # the 1000-byte run joined the first run in a temporary object; the 3 MiB upload after that object is topped
    # up to 5 MiB with the first bytes of the last run
    assert copied == 6 * MiB + 1000 + 12 * MiB - (MIN_PART - 3 * MiB)
    assert s3_storage.sha256_of(dst) == digest
    head = s3_storage.s3.head_object(Bucket=bucket, Key="new")
    assert head["ETag"].strip('"').endswith("-4")  # the temporary object (copied whole), an upload, a copy, an upload
    listed = {o["Key"] for o in s3_storage.s3.list_objects_v2(Bucket=bucket)["Contents"]}
    assert listed == {"base", "new"}  # the temporary objects are gone
    s3_storage.copy(dst, f"s3://{bucket}/published", sha256=digest)  # what publish does
    assert s3_storage.sha256_of(f"s3://{bucket}/published") == digest


def test_compose_refuses_a_base_that_changed_after_it_was_read(s3_storage: Storage, bucket: str) -> None:
    base_uri, dst = f"s3://{bucket}/base", f"s3://{bucket}/new"
    s3_storage.write_bytes(base_uri, b"a" * 12 * MiB)
    tag = s3_storage.s3.head_object(Bucket=bucket, Key="base")["ETag"]
    s3_storage.write_bytes(base_uri, b"b" * 12 * MiB)  # replaced between the read and the copy
    segments = segments_of([(b"a" * 12 * MiB, base_uri, 0), (b"new", None, 0)])
    with pytest.raises(SourceChanged, match="changed after it was read"):
        s3_storage.compose(dst, segments, hashlib.sha256(b"a" * 12 * MiB + b"new").hexdigest(), {base_uri: tag})
    assert not s3_storage.exists(dst)
    assert not s3_storage.s3.list_multipart_uploads(Bucket=bucket).get("Uploads")  # aborted


def test_compose_without_a_long_run_is_one_put(s3_storage: Storage, bucket: str) -> None:
    base_uri, dst = f"s3://{bucket}/base", f"s3://{bucket}/new"
    s3_storage.write_bytes(base_uri, b"x" * MiB)
    expected = b"x" * MiB + b"tail"
    copied = s3_storage.compose(dst, segments_of([(b"x" * MiB, base_uri, 0), (b"tail", None, 0)]),
                                hashlib.sha256(expected).hexdigest())
    assert copied == 0 and s3_storage.read_bytes(dst) == expected
    assert not s3_storage.s3.head_object(Bucket=bucket, Key="new")["ETag"].strip('"').count("-")


def noise_png(rng: np.random.Generator, side: int = 560) -> bytes:
    """About 0.9 MB of incompressible pixels: a few dozen make runs longer than S3's 5 MiB parts."""
    out = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8)).save(out, "PNG", compress_level=1)
    return out.getvalue()


def test_a_night_on_s3_copies_kept_runs_in_the_store(s3_storage: Storage, bucket: str, tmp_path: Path) -> None:
    """A 30 MB train shard loses two records in its middle and gains one: the night's shard is the reference
    rewrite byte for byte, its kept runs were copied by the store (bytes through the worker: the new record, and
    a top-up only where the first run is short), and TensorFlow reads the published version."""
    rng = np.random.default_rng(3)
    folder = tmp_path / "src"
    for label in ("grain", "static"):
        (folder / label).mkdir(parents=True)
        for k in range(18):
            (folder / label / f"{k:02d}.png").write_bytes(noise_png(rng))
    source = Source(folder, s3_storage, bucket)
    dest = f"s3://{bucket}/out"
    build(s3_storage, source.uri, dest, "d", "v1", shard_size_mb=64)
    v1 = read(s3_storage, join(dest, "d", "v1"))
    train = [r["filename"] for r in v1.records if r["split"] == "train"]  # in the shard's order
    assert len(v1.manifest["splits"]["train"]["shards"]) == 1 and len(train) > 20
    for name in (train[7], train[15]):
        source.delete(name)
    source.put("grain/new.png", noise_png(rng))
    cfg = config(source.uri, dest, "d", "v2", shard_size_mb=64)
    for stage in stages.PIPELINE[:4]:  # discover, inspect, split, plan
        stage.run(cfg, s3_storage, **({"workers": 1} if stage.per_image else {}))
    rewrites = read_json(s3_storage, staged(cfg, PLAN))["rewrite"]
    shard, origin = next((s, o) for s, o in rewrites.items() if s.startswith("train"))
    assert len(origin["runs"]) == 3
    shard_uri = staged(cfg, SHARDS, shard)
    reference = rewrite_shard(cfg, s3_storage, shard, origin, read_workers=1)
    want = s3_storage.read_bytes(shard_uri)
    s3_storage.delete(staged(cfg, RECEIPTS, shard + ".json"))
    s3_storage.delete(shard_uri)
    checked = splice_shard(cfg, s3_storage, shard, origin, read_workers=1)
    assert s3_storage.read_bytes(shard_uri) == want
    assert checked["sha256"] == reference["sha256"] == hashlib.sha256(want).hexdigest()
    assert checked["bytes_copied"] > 0.6 * len(want)
    assert checked["bytes_copied"] + checked["bytes_written"] == len(want)
    assert s3_storage.sha256_of(shard_uri) == checked["sha256"]
    parts = s3_storage.s3.head_object(Bucket=bucket, Key=split_s3(shard_uri)[1])["ETag"].strip('"').split("-")[1]
    assert int(parts) >= 3  # a multipart object: copied runs and uploaded bytes, not one PUT

    result = stages.run_pipeline(cfg, s3_storage)
    v2 = read(s3_storage, result["uri"])  # TensorFlow reads every record, checks each shard's SHA-256
    assert sorted(r["filename"] for r in v2.records) == sorted(source.files())
    entry = next(s for s in v2.manifest["splits"]["train"]["shards"])
    assert s3_storage.sha256_of(join(result["uri"], entry["file"])) == entry["sha256"] == checked["sha256"]
    assert v2.build["bytes_copied"] >= checked["bytes_copied"]
    assert layout.read_manifest(s3_storage, result["uri"])["build"]["shards_spliced"] >= 1


def test_short_runs_side_by_side_on_s3_match_the_reference_rewrite(s3_storage: Storage, bucket: str,
                                                                    tmp_path: Path) -> None:
    """A train shard loses every other record of its first half (kept runs of one 0.9 MB record each, side by
    side, the first one short too): the spliced shard is the record-by-record rewrite byte for byte on the real
    server, what goes through the worker is bounded by minimum parts (not one per short run), and no temporary
    object is left behind."""
    rng = np.random.default_rng(11)
    folder = tmp_path / "src"
    for label in ("grain", "static"):
        (folder / label).mkdir(parents=True)
        for k in range(18):
            (folder / label / f"{k:02d}.png").write_bytes(noise_png(rng))
    source = Source(folder, s3_storage, bucket)
    dest = f"s3://{bucket}/out"
    build(s3_storage, source.uri, dest, "d", "v1", shard_size_mb=64)
    v1 = read(s3_storage, join(dest, "d", "v1"))
    train = [r["filename"] for r in v1.records if r["split"] == "train"]  # in the shard's order
    assert len(v1.manifest["splits"]["train"]["shards"]) == 1 and len(train) > 20
    for name in train[1:14:2]:
        source.delete(name)
    cfg = config(source.uri, dest, "d", "v2", shard_size_mb=64)
    for stage in stages.PIPELINE[:4]:  # discover, inspect, split, plan
        stage.run(cfg, s3_storage, **({"workers": 1} if stage.per_image else {}))
    rewrites = read_json(s3_storage, staged(cfg, PLAN))["rewrite"]
    shard, origin = next((s, o) for s, o in rewrites.items() if s.startswith("train"))
    assert len(origin["runs"]) == 8 and all(stop - start == 1 for start, stop in origin["runs"][:7])
    shard_uri = staged(cfg, SHARDS, shard)
    rewrite_shard(cfg, s3_storage, shard, origin, read_workers=1)
    want = s3_storage.read_bytes(shard_uri)
    s3_storage.delete(staged(cfg, RECEIPTS, shard + ".json"))
    s3_storage.delete(shard_uri)
    checked = splice_shard(cfg, s3_storage, shard, origin, read_workers=1)
    assert "fallback" not in checked
    assert s3_storage.read_bytes(shard_uri) == want
    assert checked["sha256"] == hashlib.sha256(want).hexdigest() == s3_storage.sha256_of(shard_uri)
    assert checked["bytes_copied"] + checked["bytes_written"] == len(want)
    # the first short runs go out topped up to one minimum part, the next joins it in a temporary object, the one
    # after that is topped up from the long last run (whose rest is copied): two minimum parts through the worker
    assert checked["bytes_written"] <= 2 * MIN_PART and checked["bytes_copied"] > 0
    keys = [o["Key"] for o in s3_storage.s3.list_objects_v2(Bucket=bucket)["Contents"]]
    assert not [key for key in keys if ".part-" in key]
