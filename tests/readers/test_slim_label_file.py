"""``labels.txt``: every published version carries TF-slim's label file, and the seed's reading code
(``dataset_utils.read_label_file``, see tests/slim_reader.py) names every class id in the records."""

from __future__ import annotations

import csv
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.published import layout
from image_tfrecords.published.manifest import Manifest
from image_tfrecords.stages.publish import manifest_files
from image_tfrecords.storage import Storage, is_s3, join
from tests.pipeline.test_incremental import build, where  # noqa: F401 - the (storage, destination, bucket) fixture
from tests.slim_reader import read_label_file, write_label_file
from tests.support import run_cli

LABEL, TEXT = "image/class/label", "image/class/text"  # the Example keys (docs/published-format.md)


def slim_labels(storage: Storage, version_uri: str) -> dict[int, str]:
    """``read_label_file(VERSION)``: on the folder itself when it is local, on a downloaded copy from S3."""
    if not is_s3(version_uri):
        return read_label_file(version_uri)
    with tempfile.TemporaryDirectory() as tmp:
        storage.download(join(version_uri, "labels.txt"), os.path.join(tmp, "labels.txt"))
        return read_label_file(tmp)


def record_labels(storage: Storage, version_uri: str, multi_label: bool = False) -> list[tuple[list[int], list[str]]]:
    """(class ids, class names) of every record of every shard, parsed with ``tf.data.TFRecordDataset`` and
    ``tf.io.parse_single_example``."""
    import tensorflow as tf

    manifest = json.loads(storage.read_bytes(join(version_uri, "manifest.json")))
    if multi_label:
        spec = {LABEL: tf.io.VarLenFeature(tf.int64), TEXT: tf.io.VarLenFeature(tf.string)}
    else:
        spec = {LABEL: tf.io.FixedLenFeature([], tf.int64), TEXT: tf.io.FixedLenFeature([], tf.string)}
    out: list[tuple[list[int], list[str]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for info in manifest["splits"].values():
            for shard in info["shards"]:
                path = os.path.join(tmp, shard["file"])
                storage.download(join(version_uri, shard["file"]), path)
                for raw in tf.data.TFRecordDataset(path):
                    example = tf.io.parse_single_example(raw, spec)
                    ids, names = example[LABEL], example[TEXT]
                    if multi_label:
                        ids, names = ids.values, names.values
                    out.append(([int(i) for i in tf.reshape(ids, [-1]).numpy()],
                                [n.decode() for n in tf.reshape(names, [-1]).numpy()]))
    return out


def check_label_file(storage: Storage, version_uri: str, multi_label: bool = False) -> dict[str, Any]:
    """The version's ``labels.txt``, read the seed's way, maps every class id of its records to the name the
    manifest's ``classes`` gives that id (and the record's own ``image/class/text``); returns the manifest."""
    manifest = json.loads(storage.read_bytes(join(version_uri, "manifest.json")))
    labels = slim_labels(storage, version_uri)
    assert labels == dict(enumerate(manifest["classes"]))
    records = record_labels(storage, version_uri, multi_label)
    assert len(records) == manifest["num_records"] > 0
    for ids, names in records:
        assert ids and [labels[i] for i in ids] == [manifest["classes"][i] for i in ids] == names
    return manifest


def copy_classes(sample_dir: Path, target: Path, classes: dict[str, str], per_class: int) -> None:
    """``per_class`` images of each sample class ``old`` into ``target/new`` for {old: new}."""
    for old, new in classes.items():
        (target / new).mkdir(parents=True, exist_ok=True)
        for path in sorted((sample_dir / old).iterdir())[:per_class]:
            shutil.copy(path, target / new / path.name)


def test_a_local_build_has_the_seed_label_file(sample_dir: Path, tmp_path: Path) -> None:
    result = run_cli("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", "shapes",
                     "--version", "v1", "--shard-size-mb", "0.05", "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    version = tmp_path / "shapes" / "v1"
    manifest = check_label_file(Storage(), str(version))
    assert manifest["classes"] == ["circles", "squares", "triangles"]
    seed = tmp_path / "seed"  # what TF-slim's converters write for the same classes: the same bytes
    seed.mkdir()
    write_label_file(dict(enumerate(manifest["classes"])), str(seed))
    assert (version / "labels.txt").read_bytes() == (seed / "labels.txt").read_bytes() == \
        b"0:circles\n1:squares\n2:triangles\n"


def test_full_and_incremental_builds_on_local_and_s3(where: tuple[Storage, str, str | None],  # noqa: F811
                                                     sample_dir: Path, tmp_path: Path) -> None:
    """A new class between two nights (a name with a colon and a space: the seed reader splits each line at
    its first colon and keeps the rest): the incremental version's file names the new id too."""
    storage, dest, _ = where
    source = tmp_path / "src"
    copy_classes(sample_dir, source, {"circles": "circles", "squares": "squares"}, 6)
    build(storage, str(source), dest, "d", "v1")
    first = check_label_file(storage, join(dest, "d", "v1"))
    assert first["build"]["mode"] == "full" and first["classes"] == ["circles", "squares"]
    copy_classes(sample_dir, source, {"triangles": "odd: one"}, 6)
    build(storage, str(source), dest, "d", "v2")
    second = check_label_file(storage, join(dest, "d", "v2"))
    assert second["build"]["mode"] == "incremental" and second["classes"] == ["circles", "squares", "odd: one"]
    assert storage.read_bytes(join(dest, "d", "v2", "labels.txt")) == b"0:circles\n1:squares\n2:odd: one\n"


def test_multi_label_records_use_the_same_ids(sample_dir: Path, tmp_path: Path) -> None:
    source, names = tmp_path / "src", ["cats", "dogs", "owls"]
    source.mkdir()
    images = sorted(sample_dir.rglob("*.jpg"))[:14]
    with open(source / "labels.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "labels"])
        for i, path in enumerate(images):
            shutil.copy(path, source / f"img{i:02d}.jpg")
            writer.writerow([f"img{i:02d}.jpg", "|".join(n for j, n in enumerate(names) if (i % 7 + 1) >> j & 1)])
    result = run_cli("build", "--source", str(source), "--destination", str(tmp_path / "out"), "--dataset", "ml",
                     "--version", "v1", "--workers", "1", "--no-progress")
    assert result.returncode == 0, result.stderr
    manifest = check_label_file(Storage(), str(tmp_path / "out" / "ml" / "v1"), multi_label=True)
    assert manifest["multi_label"] and manifest["classes"] == names
    records = record_labels(Storage(), str(tmp_path / "out" / "ml" / "v1"), multi_label=True)
    assert max(len(ids) for ids, _ in records) == 3  # records with several ids were checked


@pytest.mark.parametrize(("classes", "expected"), [
    (["a", "b:c", " d ", "é"], "0:a\n1:b:c\n2: d \n3:é\n".encode()),
    ([], b""),
    (["a", "two\nlines"], None),  # the seed's format cannot carry it: no file rather than a wrong one
])
def test_label_map(classes: list[str], expected: bytes | None, tmp_path: Path) -> None:
    assert layout.label_map(classes) == expected
    manifest = Manifest.parse({"version": "v", "num_records": 0, "classes": classes, "splits": {}})
    files = manifest_files(manifest)
    assert files.get(layout.LABEL_MAP) == expected
    if expected is not None:
        (tmp_path / "labels.txt").write_bytes(expected)
        assert read_label_file(str(tmp_path)) == dict(enumerate(classes))
