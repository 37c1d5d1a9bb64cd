"""The tf.data loader against datasets the CLI published into a real SeaweedFS server (and a local copy)."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.loader import NotPublishedError, info, label_names, load_split
from image_tfrecords.storage import Storage, join
from tests.test_cli import run_cli
from tools.seaweedfs import S3Server

SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def module_s3_env(s3_server: S3Server) -> Iterator[dict[str, str]]:
    """boto3's standard environment pointed at the test server, for the whole module."""
    env = s3_server.env()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env


@pytest.fixture(scope="module")
def published(s3_server: S3Server, sample_dir: Path, module_s3_env: dict[str, str]) -> str:
    """``s3://BUCKET``: dataset ``shapes`` (v1, then v2 with another salt: latest) and ``shapes-gz`` (g1, gzip)."""
    bucket = f"loader-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    env = {**os.environ, **module_s3_env}
    builds = [("shapes", "v1", "one", "none"), ("shapes", "v2", "two", "none"), ("shapes-gz", "g1", "one", "gzip")]
    for dataset, version, salt, compression in builds:
        result = run_cli("build", "--source", str(sample_dir), "--destination", f"s3://{bucket}", "--dataset", dataset,
                         "--version", version, "--salt", salt, "--compression", compression, "--shard-size-mb", "0.05",
                         "--workers", "2", "--no-progress", env=env)
        assert result.returncode == 0, result.stderr
    return f"s3://{bucket}"


def labels(version_uri: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(Storage().read_text(join(version_uri, "labels.csv")))))


def expected_encoded(version_uri: str, split: str) -> Counter[tuple[str, int]]:
    return Counter((r["encoded_sha256"], int(r["label_id"])) for r in labels(version_uri) if r["split"] == split)


def expected_shapes(version_uri: str, split: str) -> Counter[tuple[tuple[int, int, int], int]]:
    return Counter(((int(r["height"]), int(r["width"]), int(r["channels"])), int(r["label_id"]))
                   for r in labels(version_uri) if r["split"] == split)


def encoded_pairs(ds: Any) -> Counter[tuple[str, int]]:
    return Counter((hashlib.sha256(image.numpy()).hexdigest(), int(label)) for image, label in ds)


def copy_tree(src: str, dst: str, skip: tuple[str, ...] = ()) -> None:
    storage = Storage()
    for item in storage.iter_files(src):
        if item.key not in skip:
            storage.copy(join(src, item.key), join(dst, item.key))


def test_every_split_yields_its_records_encoded(published: str) -> None:
    version = f"{published}/shapes/v1"
    manifest = info(version)
    assert len(manifest["splits"]["train"]["shards"]) > 1, "the interleave needs several shards"
    for split in SPLITS:
        ds = load_split(version, split, decode=False, cycle_length=2)
        pairs = encoded_pairs(ds)
        assert sum(pairs.values()) == manifest["splits"][split]["num_records"]
        assert pairs == expected_encoded(version, split)


def test_decoded_images_have_the_labelled_shapes(published: str) -> None:
    import tensorflow as tf

    version = f"{published}/shapes/v1"
    for split in SPLITS:
        ds = load_split(version, split, shuffle_files=True, seed=7)
        assert ds.element_spec[0].dtype == tf.uint8 and ds.element_spec[1].dtype == tf.int64
        got = Counter((tuple(image.shape), int(label)) for image, label in ds)
        assert got == expected_shapes(version, split)


def test_gzip_dataset(published: str) -> None:
    version = f"{published}/shapes-gz/g1"
    manifest = info(version)
    assert manifest["compression"] == "gzip"
    assert all(s["file"].endswith(".tfrecord.gz") for i in manifest["splits"].values() for s in i["shards"])
    for split in SPLITS:
        assert encoded_pairs(load_split(version, split, decode=False)) == expected_encoded(version, split)
    shapes = Counter((tuple(image.shape), int(label)) for image, label in load_split(version, "train"))
    assert shapes == expected_shapes(version, "train")


def test_dataset_uri_reads_latest_version(published: str) -> None:
    dataset = f"{published}/shapes"
    assert info(dataset)["version"] == "v2"
    v1, v2 = expected_encoded(f"{dataset}/v1", "train"), expected_encoded(f"{dataset}/v2", "train")
    assert v1 != v2, "the two versions must differ for this test to mean something"
    assert encoded_pairs(load_split(dataset, "train", decode=False)) == v2


def test_label_names(published: str) -> None:
    assert label_names(f"{published}/shapes") == ["circles", "squares", "triangles"]
    assert label_names(f"{published}/shapes-gz/g1") == info(f"{published}/shapes-gz/g1")["classes"]


def test_unknown_split_names_the_available_ones(published: str) -> None:
    with pytest.raises(ValueError, match=r"unknown split 'training'.*test, train, validation"):
        load_split(f"{published}/shapes", "training")


def test_unpublished_version_and_missing_dataset_are_refused(published: str) -> None:
    copy_tree(f"{published}/shapes/v1", f"{published}/unpublished/shapes/v1", skip=("_SUCCESS",))
    with pytest.raises(NotPublishedError, match="_SUCCESS"):
        load_split(f"{published}/unpublished/shapes/v1", "train")
    with pytest.raises(NotPublishedError, match=r"latest\.json"):
        load_split(f"{published}/no-such-dataset", "train")


def test_tampered_shard_fails_naming_it(published: str, tmp_path: Path) -> None:
    import tensorflow as tf

    copy = f"{published}/tampered/shapes/v1"
    copy_tree(f"{published}/shapes/v1", copy)
    shards = info(copy)["splits"]
    victim = shards["train"]["shards"][0]["file"]
    other = shards["validation"]["shards"][0]  # valid records: only the checksum can tell
    Storage().write_bytes(join(copy, victim), Storage().read_bytes(join(copy, other["file"])))

    cache = tmp_path / "cache"
    with pytest.raises(tf.errors.OpError, match=re.escape(f"shard {copy}/{victim} does not match its sha256")):
        list(load_split(copy, "train", cache_dir=str(cache), decode=False))
    cached = [p.name for p in cache.rglob("*") if p.is_file()]
    assert victim not in cached and not [n for n in cached if n.startswith(".tmp-")]

    unchecked = load_split(copy, "train", cache_dir=str(tmp_path / "unchecked"), decode=False, verify=False)
    train = shards["train"]
    assert sum(1 for _ in unchecked) == train["num_records"] - train["shards"][0]["num_records"] + other["num_records"]


def test_cache_is_reused_and_repaired(published: str, tmp_path: Path) -> None:
    version = f"{published}/shapes/v1"
    cache = tmp_path / "cache"
    expected = expected_encoded(version, "train")
    assert encoded_pairs(load_split(version, "train", cache_dir=str(cache), decode=False)) == expected
    files = sorted(cache.rglob("*.tfrecord"))
    assert [p.name for p in files] == [s["file"] for s in info(version)["splits"]["train"]["shards"]]
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}

    assert encoded_pairs(load_split(version, "train", cache_dir=str(cache), decode=False)) == expected
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files} == stamps, "a cached shard was fetched again"

    files[0].write_bytes(b"not the shard")  # a damaged cache copy is fetched again, not trusted
    assert encoded_pairs(load_split(version, "train", cache_dir=str(cache), decode=False)) == expected
    shard = info(version)["splits"]["train"]["shards"][0]
    assert hashlib.sha256(files[0].read_bytes()).hexdigest() == shard["sha256"]
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files[1:]} == {p: stamps[p] for p in files[1:]}


def test_local_folder_dataset(published: str, tmp_path: Path) -> None:
    import tensorflow as tf

    storage = Storage()
    local = tmp_path / "shapes"
    for item in storage.iter_files(f"{published}/shapes"):
        (local / item.key).parent.mkdir(parents=True, exist_ok=True)
        storage.download(f"{published}/shapes/{item.key}", str(local / item.key))
    for split in SPLITS:
        assert encoded_pairs(load_split(str(local), split, decode=False)) == expected_encoded(str(local / "v2"), split)
    assert label_names(str(local)) == ["circles", "squares", "triangles"]

    shard = info(str(local))["splits"]["test"]["shards"][0]["file"]
    (local / "v2" / shard).write_bytes((local / "v1" / shard).read_bytes())  # other salt: other records
    with pytest.raises(tf.errors.OpError, match=re.escape(f"shard {local}/v2/{shard} does not match")):
        list(load_split(str(local), "test", decode=False))


def test_explicit_storage_without_environment(published: str, s3_server: S3Server,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    storage = Storage(s3_server.client)
    version = f"{published}/shapes/v1"
    ds = load_split(f"{published}/shapes", "validation", decode=False, storage=storage)
    assert info(f"{published}/shapes", storage)["version"] == "v2"
    assert sum(1 for _ in ds) == info(f"{published}/shapes", storage)["splits"]["validation"]["num_records"]
    assert label_names(version, storage) == ["circles", "squares", "triangles"]


def test_importing_the_loader_does_not_import_tensorflow() -> None:
    code = "import sys, image_tfrecords.loader; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr
