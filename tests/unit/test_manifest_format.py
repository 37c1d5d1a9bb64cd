"""The typed, versioned manifest (published/manifest.py): what a build writes is what the one parser reads,
old manifests read with the meaning of their missing fields, and a damaged one is one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from image_tfrecords import cli
from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import DamagedFile
from image_tfrecords.images.transform import ImageOptions
from image_tfrecords.published import layout
from image_tfrecords.published.manifest import FORMAT_VERSION, Manifest
from image_tfrecords.storage import Storage

OLD = {  # a manifest of 0.1.0: no format_version, build, image, columns, features or labels digest
    "dataset": "d", "version": "v1", "num_records": 3, "num_rejected": 0, "num_skipped": 0,
    "rejects_by_reason": {}, "classes": ["a", "b"], "previous_version": None, "source_fingerprint": "f",
    "compression": "none",
    "splits": {"train": {"num_records": 3, "shards": [
        {"file": "train-00000-of-00001.tfrecord", "num_records": 3, "num_bytes": 30, "sha256": "ab"}]}},
}


def test_a_build_writes_what_the_parser_reads(sample_dir: Path, tmp_path: Path) -> None:
    cli.build(BuildConfig(source=str(sample_dir), destination=str(tmp_path), dataset="d", version="v1"),
              workers=1, progress=False)  # not cli.main: it installs signal handlers in this process
    raw = json.loads((tmp_path / "d" / "v1" / "manifest.json").read_text())
    assert raw["format_version"] == FORMAT_VERSION == 1
    manifest = layout.read_manifest(Storage(), str(tmp_path / "d" / "v1"))
    assert manifest.to_json() == raw  # nothing lost or added between the writer and the parser
    assert manifest.num_records == sum(s.num_records for s in manifest.splits.values()) == 60
    assert manifest.num_bytes == sum((tmp_path / "d" / "v1" / f).stat().st_size for f in manifest.shard_files)
    assert manifest.build["mode"] == "full" and manifest.labels_sha256 and manifest.features
    inspected = (tmp_path / "d" / "v1" / "inspected.csv").read_bytes()
    assert manifest.inspected_sha256 == hashlib.sha256(inspected).hexdigest()
    assert manifest["classes"] == raw["classes"]  # the JSON as read, for code that reads keys


def test_an_old_manifest_reads_with_the_meaning_of_its_missing_fields() -> None:
    manifest = Manifest.parse(OLD)
    assert manifest.format_version is None and manifest.build == {} and manifest.labels_sha256 is None
    assert manifest.inspected_sha256 is None
    assert manifest.image is None and manifest.image_options == ImageOptions().describe()  # stored as read
    assert manifest.features is None and manifest.columns == {}
    assert manifest.label_separator is None and manifest.separator == "|"
    assert manifest.splits["train"].shards[0].index_sha256 is None and manifest.num_bytes == 30
    assert manifest.to_json()["format_version"] == FORMAT_VERSION  # written anew: the current format


@pytest.mark.parametrize("damage, named", [
    (lambda m: m.pop("splits"), "'splits'"),
    (lambda m: m.update(num_records="many"), "many"),
    (lambda m: m["splits"]["train"]["shards"][0].pop("sha256"), "'sha256'"),
    (lambda m: m.update(classes=None), "NoneType"),
])
def test_a_damaged_manifest_is_one_line(damage, named: str) -> None:  # type: ignore[no-untyped-def]
    raw = json.loads(json.dumps(OLD))
    damage(raw)
    with pytest.raises(DamagedFile, match="manifest is damaged") as error:
        Manifest.parse(raw, "s3://b/d/v1/manifest.json")
    assert "s3://b/d/v1/manifest.json" in str(error.value) and named in str(error.value)
    with pytest.raises(DamagedFile, match="not a JSON object"):
        Manifest.parse([raw])
