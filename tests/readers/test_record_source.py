"""``RecordSource``: random access to a published split (issue 26), in the dev venv (no torch, no Grain).

Versions are built with the command line from generated images; every record read by index is compared
with TensorFlow's read of the same shards and with labels.csv. The checks: a flipped byte (the documented
``DamagedRecordError`` naming shard and offset, or the shard's SHA-256), a shard changed with valid CRCs
(only the SHA-256 sees it), a damaged index, gzip refused. S3 through the SeaweedFS server of the tests.
The PyTorch ``DataLoader``, ``DistributedSampler`` and Grain run in test_readers_from_pip.py's fresh venv.
"""

from __future__ import annotations

import concurrent.futures
import csv
import hashlib
import io
import json
import multiprocessing
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from PIL import Image

from image_tfrecords.errors import DamagedFile, NotPublishedError, ShardChecksumError
from image_tfrecords.readers import record_source
from image_tfrecords.readers.decode import decode_image
from image_tfrecords.readers.record_source import DamagedRecordError, NotRandomAccessible, RecordSource
from image_tfrecords.records.example import encode_example, parse_example
from image_tfrecords.records.tfrecord import CorruptRecordError, frame, masked_crc
from image_tfrecords.storage import Storage, join
from tests.support import read_csv, run_cli
from tests.tf_reader import read_version

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ("train", "validation", "test")


def build(source: Path, dest: Path, dataset: str, version: str, *args: str) -> None:
    result = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", dataset,
                     "--version", version, "--workers", "1", "--no-progress", "--shard-size-mb", "0.05", *args)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def dest(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``DEST``: ``shapes`` v1 and v2 (another salt; latest), ``shapes-gz`` g1 (gzip)."""
    root = tmp_path_factory.mktemp("record-source")
    build(sample_dir, root, "shapes", "v1", "--salt", "one")
    build(sample_dir, root, "shapes", "v2", "--salt", "two")
    build(sample_dir, root, "shapes-gz", "g1", "--compression", "gzip")
    return root


def copy_version(dest: Path, tmp_path: Path) -> Path:
    """A copy of ``shapes/v2`` to damage (the test's own paths: no shard hashed before)."""
    copy = tmp_path / "copy" / "v2"
    shutil.copytree(dest / "shapes" / "v2", copy)
    return copy


def offsets(version: Path, shard: str) -> list[tuple[int, int]]:
    text = (version / shard.replace(".tfrecord", ".tfindex")).read_text()
    return [(int(a), int(b)) for a, b in (line.split() for line in text.splitlines())]


def first_shard(source: RecordSource) -> tuple[str, int]:
    """(file, record count) of the split's first shard."""
    shard = source.manifest.splits[source.split].shards[0]
    return shard.file, shard.num_records


# -- reading -------------------------------------------------------------------------------------------------------
def test_every_record_matches_tensorflow_and_labels_csv(dest: Path) -> None:
    version = dest / "shapes" / "v2"
    manifest, tf_records = read_version(Storage(), str(version))
    rows = read_csv(version / "labels.csv")
    for split in SPLITS:
        source = RecordSource(str(dest / "shapes"), split)  # the version latest.json names
        assert source.version == str(version)
        assert len(source) == manifest["splits"][split]["num_records"] == len(tf_records[split])
        shards = [s["file"] for s in manifest["splits"][split]["shards"]]
        where = {(r["shard"], int(r["shard_position"])): r for r in rows if r["split"] == split}
        positions = [sum(1 for r in tf_records[split][:i] if r["shard"] == theirs["shard"])
                     for i, theirs in enumerate(tf_records[split])]
        for i, theirs in enumerate(tf_records[split]):
            ours = source[i]
            assert ours["index"] == i
            assert ours["image"] == theirs["image/encoded"]
            assert ours["filename"] == theirs["image/filename"].decode()
            assert ours["label"] == theirs["image/class/label"] == manifest["classes"].index(ours["label_text"])
            assert ours["label_text"] == theirs["image/class/text"].decode()
            assert ours["format"] == theirs["image/format"].decode()
            assert (ours["height"], ours["width"], ours["channels"]) == (
                theirs["image/height"], theirs["image/width"], theirs["image/channels"])
            assert ours["sha256"] == theirs["image/sha256"].decode()
            row = where[(theirs["shard"], positions[i])]  # labels.csv: shard and place in it
            assert row["filename"] == ours["filename"] and int(row["label_id"]) == ours["label"]
            assert row["sha256"] == ours["sha256"]
            assert row["encoded_sha256"] == hashlib.sha256(ours["image"]).hexdigest()
        assert shards == sorted({r["shard"] for r in tf_records[split]}, key=shards.index)
        assert list(source) == [source[i] for i in range(len(source))]


def test_getitems_negative_indices_and_bounds(dest: Path) -> None:
    source = RecordSource(str(dest / "shapes"), "train")
    n = len(source)
    batch = source.__getitems__([5, 0, 5, n - 1, -1])
    assert batch == [source[5], source[0], source[5], source[n - 1], source[n - 1]]
    assert batch[-1]["index"] == n - 1
    assert source._getitems([2, 1]) == source.__getitems__([2, 1])  # Grain's batched read
    assert source.__getitems__([]) == []
    for bad in (n, -n - 1):
        with pytest.raises(IndexError):
            source[bad]
    assert source[np.int64(3)] == source[3]
    assert repr(source) == f"RecordSource({str(dest / 'shapes' / 'v2')!r}, 'train', records={n}, verify='shard')"


def test_version_argument_and_clear_errors(dest: Path, tmp_path: Path) -> None:
    dataset = str(dest / "shapes")
    v1 = RecordSource(dataset, "train", "v1")
    assert v1.version == f"{dataset}/v1" and len(v1) == len(read_version_split(dest / "shapes" / "v1", "train"))
    assert [r["filename"] for r in v1] != [r["filename"] for r in RecordSource(dataset, "train")]  # other salt
    assert RecordSource(f"{dataset}/v1", "test").version == f"{dataset}/v1"  # a version folder
    with pytest.raises(NotPublishedError, match=r"shapes/v9 is not a published version; published versions of "
                                                r".*shapes: v1, v2$"):
        RecordSource(dataset, "train", "v9")
    with pytest.raises(ValueError, match=r"unknown split 'training'; available splits: test, train, validation"):
        RecordSource(dataset, "training")
    with pytest.raises(ValueError, match="verify must be one of shard, none"):
        RecordSource(dataset, "train", verify="yes")
    shutil.copytree(dest / "shapes" / "v1", tmp_path / "unpublished" / "v1")
    (tmp_path / "unpublished" / "v1" / "_SUCCESS").unlink()
    with pytest.raises(NotPublishedError, match="_SUCCESS"):
        RecordSource(str(tmp_path / "unpublished" / "v1"), "train")
    with pytest.raises(NotPublishedError, match=r"latest\.json"):
        RecordSource(str(tmp_path / "nothing"), "train")


def read_version_split(version: Path, split: str) -> list[dict[str, Any]]:
    return [r for r in read_csv(version / "labels.csv") if r["split"] == split]


def test_gzip_versions_are_refused_in_one_line(dest: Path) -> None:
    with pytest.raises(NotRandomAccessible) as caught:
        RecordSource(str(dest / "shapes-gz"), "train")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(str(dest / "shapes-gz" / "g1"))
    assert "gzip-compressed" in message and "cannot be read from an offset" in message
    assert "--compression none" in message


# -- processes and threads -------------------------------------------------------------------------------------------
def _read_in_child(source: RecordSource, indices: list[int]) -> tuple[list[str], bool]:
    records = source.__getitems__(indices)
    return [r["filename"] for r in records], source._local is not None and source._local.pid == os.getpid()


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pickles_without_its_files_and_each_process_opens_its_own(dest: Path, method: str) -> None:
    source = RecordSource(str(dest / "shapes"), "train")
    expected = [r["filename"] for r in source]  # the parent has opened every shard
    assert source._local is not None and source._local.fds
    state = pickle.dumps(source)
    assert len(state) < 20_000 and b"_Local" not in state
    copy = pickle.loads(state)
    assert copy._local is None and [r["filename"] for r in copy] == expected
    chunks = [list(range(i, len(source), 3)) for i in range(3)]
    with concurrent.futures.ProcessPoolExecutor(3, mp_context=multiprocessing.get_context(method)) as pool:
        results = list(pool.map(_read_in_child, [source] * 3, chunks))
    for chunk, (names, own) in zip(chunks, results, strict=True):
        assert names == [expected[i] for i in chunk] and own  # a forked child made its own state


def test_threads_read_the_same_records(dest: Path) -> None:
    source = RecordSource(str(dest / "shapes"), "train")
    indices = [i % len(source) for i in range(7 * len(source))]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # Grain reads from threads
        names = list(pool.map(lambda i: source[i]["filename"], indices))
    assert names == [source[i]["filename"] for i in indices]


# -- checks ------------------------------------------------------------------------------------------------------------
def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))


def test_a_flipped_byte_names_the_shard_and_offset(dest: Path, tmp_path: Path) -> None:
    version = copy_version(dest, tmp_path)
    source = RecordSource(str(version), "train", verify="none")
    shard, count = first_shard(source)
    (start, length), (start2, _) = offsets(version, shard)[1], offsets(version, shard)[2]
    flip(version / shard, start + length // 2)  # record 1's data
    flip(version / shard, start2 + 3)  # record 2's length field
    with pytest.raises(DamagedRecordError, match=re.escape(
            f"damaged record in {version}/{shard} at byte offset {start} (record 1 of split 'train'): "
            "data checksum mismatch")) as caught:
        source[1]
    assert isinstance(caught.value, CorruptRecordError) and "\n" not in str(caught.value)
    with pytest.raises(DamagedRecordError, match=f"at byte offset {start2} .*: length checksum mismatch"):
        source.__getitems__([0, 2])
    assert source[0]["filename"] and source[count]["filename"]  # the other records still read

    checked = RecordSource(str(version), "train")  # verify="shard": the whole shard's SHA-256 first
    with pytest.raises(ShardChecksumError, match=re.escape(f"shard {version}/{shard} does not match its sha256")):
        checked[0]
    assert checked[count]["filename"]  # a sound shard of the split


def test_changed_records_with_valid_crcs_only_the_sha256_sees(dest: Path, tmp_path: Path) -> None:
    version = copy_version(dest, tmp_path)
    shard, _ = first_shard(RecordSource(str(version), "train"))
    start, length = offsets(version, shard)[0]
    data = bytearray((version / shard).read_bytes())
    payload = bytearray(data[start + 12:start + length - 4])
    payload[-1] ^= 0x01  # the last byte of the Example: inside its last feature's value
    data[start + length - 4:start + length] = struct.pack("<I", masked_crc(bytes(payload)))
    data[start + 12:start + length - 4] = payload
    (version / shard).write_bytes(bytes(data))
    assert frame(bytes(payload)) == bytes(data[start:start + length])  # valid framing and CRCs

    unchecked = RecordSource(str(version), "train", verify="none")
    assert unchecked[0] != RecordSource(str(dest / "shapes" / "v2"), "train")[0]  # read as it now is
    with pytest.raises(ShardChecksumError, match=re.escape(f"shard {version}/{shard} does not match its sha256")):
        RecordSource(str(version), "train")[0]

    other = RecordSource(str(version), "validation").manifest.splits["validation"].shards[0].file
    shutil.copy(version / other, version / shard)  # a whole other shard: another size
    with pytest.raises(ShardChecksumError, match=re.escape(f"shard {version}/{shard} has ")):
        RecordSource(str(version), "train", verify="none")[0]


def test_each_shard_is_hashed_once_per_process(dest: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    version = copy_version(dest, tmp_path)
    hashed: list[str] = []
    real = record_source.sha256_file
    monkeypatch.setattr(record_source, "sha256_file", lambda path: hashed.append(path) or real(path))
    source = RecordSource(str(version), "train")
    shards = [s.file for s in source.manifest.splits["train"].shards]
    assert len(shards) >= 2
    assert not hashed  # lazily: nothing before the first read
    for _ in range(2):
        list(source)
    assert sorted(hashed) == sorted(f"{version}/{s}" for s in shards)
    list(RecordSource(str(version), "train"))  # another source of this process: hashed already
    list(pickle.loads(pickle.dumps(source)))
    assert len(hashed) == len(shards)
    os.utime(version / shards[0], ns=(1, 1))  # changed since (by its stamp): hashed again
    list(RecordSource(str(version), "train"))
    assert len(hashed) == len(shards) + 1
    list(RecordSource(str(version), "test", verify="none"))
    assert len(hashed) == len(shards) + 1
    validation = RecordSource(str(version), "validation")
    validation.verify_shards()  # now, all of them: forked workers inherit what this process hashed
    assert len(hashed) == len(shards) + 1 + len(validation.manifest.splits["validation"].shards)
    monkeypatch.setattr(record_source, "sha256_file", lambda path: pytest.fail(f"{path} hashed again"))
    list(validation)


def test_a_damaged_index_is_named(dest: Path, tmp_path: Path) -> None:
    version = copy_version(dest, tmp_path)
    shard, _ = first_shard(RecordSource(str(version), "train"))
    index = version / shard.replace(".tfrecord", ".tfindex")
    lines = index.read_text().splitlines()
    index.write_text("\n".join(lines[:-1]) + "\n")  # a record short
    with pytest.raises(ShardChecksumError, match=re.escape(f"{index} does not match its sha256")):
        RecordSource(str(version), "train")[0]
    with pytest.raises(DamagedFile, match=re.escape(f"{index} does not index the {len(lines)} records")):
        RecordSource(str(version), "train", verify="none")[0]
    index.unlink()
    with pytest.raises(DamagedFile, match=re.escape(f"{index} is missing")):
        RecordSource(str(version), "train", verify="none")[0]


# -- S3 ------------------------------------------------------------------------------------------------------------
def upload(version: Path, uri: str) -> None:
    storage = Storage()
    for path in sorted(version.rglob("*")):
        if path.is_file():
            storage.upload(str(path), join(uri, path.relative_to(version).as_posix()))


class CountingStorage(Storage):
    """A Storage that counts its ranged reads (in this process)."""

    ranges: ClassVar[list[tuple[str, int, int]]] = []

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        CountingStorage.ranges.append((uri, start, length))
        return super().read_range(uri, start, length)


def test_s3_reads_like_local(dest: Path, s3_env: dict[str, str], bucket: str) -> None:
    local = dest / "shapes" / "v2"
    upload(local, f"s3://{bucket}/shapes/v2")
    Storage().write_bytes(f"s3://{bucket}/shapes/latest.json", b'{"version": "v2"}\n')
    expected = list(RecordSource(str(local), "train"))
    CountingStorage.ranges = []
    source = RecordSource(f"s3://{bucket}/shapes", "train", storage=CountingStorage())
    assert source.version == f"s3://{bucket}/shapes/v2" and len(source) == len(expected)
    assert [source[i] for i in range(len(source))] == expected
    shards = source.manifest.splits["train"].shards
    # neighbours share a request: one block per shard (each shard is far smaller than a block)
    assert len(CountingStorage.ranges) == len(shards) and all(s.num_bytes < record_source.BLOCK_SIZE for s in shards)
    order = list(np.random.default_rng(0).permutation(len(source)))
    assert pickle.loads(pickle.dumps(source)).__getitems__(order) == [expected[i] for i in order]

    CountingStorage.ranges = []
    exact = RecordSource(f"s3://{bucket}/shapes", "train", storage=CountingStorage(), block_size=0)
    assert exact.__getitems__(order) == [expected[i] for i in order]  # concurrent GETs, one per record
    assert sorted(CountingStorage.ranges) == sorted(
        (f"s3://{bucket}/shapes/v2/{s.file}", start, length) for s in shards
        for start, length in offsets(local, s.file))
    small = RecordSource(f"s3://{bucket}/shapes", "train", block_size=1024, cache_blocks=2)  # records span blocks
    assert small.__getitems__(order) == [expected[i] for i in order] and list(small) == expected
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        assert list(pool.map(lambda i: small[i], order)) == [expected[i] for i in order]
    # a forked child reads on its own, from a parent that has read: in a process of its own, as a training script
    # is (this test's process may have used obstore, which a forked child cannot inherit: storage.s3_reads)
    indices = json.dumps([int(i) for i in order])
    done = subprocess.run([sys.executable, "-c", FORKED_READER, f"s3://{bucket}/shapes", indices],
                          capture_output=True, text=True, timeout=300, env={**os.environ, **s3_env})
    assert done.returncode == 0, done.stderr[-3000:]
    names, own = json.loads(done.stdout.splitlines()[-1])
    assert names == [expected[i]["filename"] for i in order] and own


FORKED_READER = """
import concurrent.futures, json, multiprocessing, os, sys
from image_tfrecords.readers.record_source import RecordSource

def read(source, indices):
    records = source.__getitems__(indices)
    return [r["filename"] for r in records], source._local is not None and source._local.pid == os.getpid()

source = RecordSource(sys.argv[1], "train")
order = [int(i) for i in json.loads(sys.argv[2])]
assert len(source.__getitems__(order)) == len(order)  # the parent has read every shard
with concurrent.futures.ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("fork")) as pool:
    print(json.dumps(pool.submit(read, source, order).result()))
"""


def test_s3_checks(dest: Path, s3_env: dict[str, str], bucket: str, tmp_path: Path) -> None:
    version = copy_version(dest, tmp_path)
    uri = f"s3://{bucket}/shapes/v2"
    shard, _ = first_shard(RecordSource(str(version), "train"))
    start, length = offsets(version, shard)[1]
    flip(version / shard, start + length // 2)
    upload(version, uri)  # the damaged shard, published as it is (the store verifies what it was sent)
    with pytest.raises(ShardChecksumError, match=re.escape(f"shard {uri}/{shard} does not match its sha256")):
        RecordSource(uri, "train")[1]
    with pytest.raises(DamagedRecordError, match=re.escape(f"damaged record in {uri}/{shard} at byte offset {start} ")):
        RecordSource(uri, "train", verify="none")[1]
    gz = f"s3://{bucket}/shapes-gz/g1"
    upload(dest / "shapes-gz" / "g1", gz)
    with pytest.raises(NotRandomAccessible, match="--compression none"):
        RecordSource(gz, "train")


def test_store_read_range(tmp_path: Path, s3_env: dict[str, str], bucket: str) -> None:
    storage = Storage()
    data = bytes(range(256)) * 10
    for uri in (str(tmp_path / "f"), f"s3://{bucket}/f"):
        storage.write_bytes(uri, data)
        assert storage.read_range(uri, 5, 300) == data[5:305]
        assert storage.read_range(uri, 2500, 300) == data[2500:]
        assert storage.read_range(uri, 3000, 10) == b""
        with pytest.raises(FileNotFoundError):
            storage.read_range(uri + "-missing", 0, 1)


# -- record layouts ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 images with a multi-label labels.csv and metadata columns."""
    src = tmp_path_factory.mktemp("labelled") / "src"
    src.mkdir()
    rows = []
    for i in range(12):
        mode, ext = (("L", "png"), ("RGB", "jpg"), ("RGBA", "png"))[i % 3]
        Image.new(mode, (10 + 3 * i, 8 + i), (7 * i, 100, 30, 255)[:len(mode)] if len(mode) > 1 else 7 * i).save(
            src / f"{i:02d}.{ext}")
        labels = "|".join(name for c, name in enumerate(("cat", "dog", "fox")) if (i >> c) & 1) or "cat"
        rows.append({"filename": f"{i:02d}.{ext}", "labels": labels, "caption": f"picture {i}", "weight": str(i / 4),
                     "tags": "|".join(f"t{j}" for j in range(i % 3))})
    with open(src / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return src


def test_raw_multi_label_and_columns(labelled: Path, tmp_path: Path) -> None:
    build(labelled, tmp_path, "labelled", "v1", "--encoding", "raw", "--channels", "3", "--resize", "16x16",
          "--upscale", "--columns", "caption=string,weight=float,tags=string_list")
    rows = {r["filename"]: r for r in read_csv(labelled / "labels.csv")}
    seen = 0
    for split in ("train", "validation", "test"):
        try:
            source = RecordSource(str(tmp_path / "labelled"), split)
        except ValueError:
            continue  # a split the 12 images left empty
        for record in source:
            row = rows[record["filename"]]
            image = record["image"]
            assert isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.shape == (16, 16, 3)
            assert image.flags.writeable and "shape" not in record
            names = sorted(row["labels"].split("|"))
            assert [source.classes[i] for i in record["label"]] == names == record["label_text"]
            assert record["caption"] == row["caption"] and record["weight"] == pytest.approx(float(row["weight"]))
            assert record["tags"] == (row["tags"].split("|") if row["tags"] else [])
            assert np.array_equal(decode_image(image), image) and decode_image(image, 1).shape == (16, 16, 1)
            seen += 1
    assert seen == len(rows)


def test_a_column_never_hides_a_field(tmp_path: Path) -> None:
    from tests.readers.test_loader_features import features, write_version

    spec = features(columns={"index": "int64", "label_text": "string"})
    record = {"image/encoded": b"x", "image/format": b"png", "image/height": 1, "image/width": 1,
              "image/channels": 1, "image/class/label": 2, "image/class/text": b"fox", "image/filename": b"a.png",
              "image/sha256": b"0" * 64, "index": 99, "label_text": b"other"}
    version = write_version(tmp_path / "v1", {"train": [record]}, spec, columns={"index": "int64",
                                                                                   "label_text": "string"})
    with pytest.raises(DamagedFile, match="is missing"):  # written by hand: no index files yet
        RecordSource(version, "train")[0]
    data = (tmp_path / "v1" / "train-00000-of-00001.tfrecord").read_bytes()
    (tmp_path / "v1" / "train-00000-of-00001.tfindex").write_text(f"0 {len(data)}\n")
    got = RecordSource(version, "train")[0]
    assert got["index"] == 0 and got["label_text"] == "fox"
    assert got["column:index"] == 99 and got["column:label_text"] == "other"
    assert parse_example(encode_example({"a": 1})).features.feature["a"].int64_list.value[0] == 1


# -- decoding ----------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "P"])
@pytest.mark.parametrize("fmt", ["PNG", "JPEG"])
def test_decode_image(mode: str, fmt: str) -> None:
    if fmt == "JPEG" and mode in ("RGBA", "P"):
        return
    buffer = io.BytesIO()
    Image.new(mode, (7, 5), (10, 200, 30, 128)[:len(mode)] if mode in ("RGB", "RGBA") else 77).save(buffer, fmt)
    data = buffer.getvalue()
    stored = {"L": 1, "RGB": 3, "RGBA": 4, "P": 3}[mode]
    assert decode_image(data).shape == (5, 7, 3)
    assert decode_image(data, None).shape == (5, 7, stored)
    for channels in (1, 3, 4):
        out = decode_image(data, channels, image_size=(3, 2))
        assert out.shape == (3, 2, channels) and out.dtype == np.uint8 and out.flags.writeable
    if mode == "RGBA":
        assert decode_image(data, 4)[0, 0].tolist() == [10, 200, 30, 128]
    with pytest.raises(ValueError, match="channels must be"):
        decode_image(data, 2)


def test_importing_the_package_stays_light() -> None:
    code = ("import sys\nfrom image_tfrecords import RecordSource, decode_image, DamagedRecordError\n"
            "heavy = ('tensorflow', 'torch', 'grain', 'pandas', 'PIL', 'boto3')\n"
            "print(sorted(m for m in heavy if m in sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_fields_keep_only_what_is_named(dest: Path, labelled: Path, tmp_path: Path) -> None:
    full = RecordSource(str(dest / "shapes"), "train")
    assert full.fields == ["index", "filename", "label", "label_text", "image", "format", "height", "width",
                           "channels", "sha256"]
    few = RecordSource(str(dest / "shapes"), "train", fields=("label", "image"))
    assert few.fields == ["label", "image"]
    assert few[3] == {"label": full[3]["label"], "image": full[3]["image"]}
    with pytest.raises(ValueError, match=r"unknown fields 'img'; this version's records have index, filename, "):
        RecordSource(str(dest / "shapes"), "train", fields=("img",))
    build(labelled, tmp_path, "raw", "v1", "--encoding", "raw", "--channels", "1", "--resize", "longest:12")
    raw = RecordSource(str(tmp_path / "raw"), "train", fields=("filename", "width", "height"))
    assert all(set(r) == {"filename", "width", "height"} for r in raw)
    images = RecordSource(str(tmp_path / "raw"), "train", fields=("image", "width", "height"))
    assert all(r["image"].shape == (r["height"], r["width"], 1) for r in images)
