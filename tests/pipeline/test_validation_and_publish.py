"""Validation catches damaged staging; publishing is atomic, immutable and moves latest forward."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.published import layout
from image_tfrecords.records.tfrecord import TFRecordWriter, read_records
from image_tfrecords.storage import Storage, join


def stage_until_written(cfg: BuildConfig, storage: Storage) -> list[str]:
    """Run every stage up to shard writing; return the shard files."""
    stages.discover_stage(cfg, storage)
    stages.inspect_stage(cfg, storage)
    stages.split_stage(cfg, storage)
    plan = stages.plan_stage(cfg, storage)
    files = []
    for task in range(plan["num_tasks"]):
        files += [r["file"] for r in stages.write_task(cfg, storage, task)]
    return files


def local_cfg(sample_dir: Path, dest: Path, version: str = "v1", **kwargs) -> BuildConfig:
    return BuildConfig(source=str(sample_dir), destination=str(dest), dataset="d", version=version,
                       shard_size_mb=0.05, **kwargs)


def test_flipped_byte_fails_validation_and_nothing_is_published(sample_dir: Path, tmp_path: Path) -> None:
    cfg, storage = local_cfg(sample_dir, tmp_path), Storage()
    shard = stage_until_written(cfg, storage)[0]
    path = Path(cfg.staging_uri) / "shards" / shard
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(stages.BuildError, match=f"shard {shard} is corrupt"):
        stages.validate_stage(cfg, storage)
    assert not Path(cfg.version_uri).exists()
    assert not (tmp_path / "d" / "latest.json").exists()


def test_record_count_mismatch_fails_validation(sample_dir: Path, tmp_path: Path) -> None:
    """A shard missing its last record (consistent CRCs and receipt) is caught by the count check."""
    cfg, storage = local_cfg(sample_dir, tmp_path), Storage()
    shard = stage_until_written(cfg, storage)[0]
    path = Path(cfg.staging_uri) / "shards" / shard
    with open(path, "rb") as f:
        records = list(read_records(f))
    with open(path, "wb") as f, TFRecordWriter(f) as writer:
        for record in records[:-1]:
            writer.write(record)
    receipt_path = Path(cfg.staging_uri) / "receipts" / f"{shard}.json"
    receipt = json.loads(receipt_path.read_text())
    receipt["sha256"] = __import__("hashlib").sha256(path.read_bytes()).hexdigest()
    receipt_path.write_text(json.dumps(receipt))
    with pytest.raises(stages.BuildError, match=f"shard {shard} holds {len(records) - 1} records, the plan says "
                                                f"{len(records)}"):
        stages.validate_stage(cfg, storage)


def test_swapped_shards_fail_validation(sample_dir: Path, tmp_path: Path) -> None:
    """Valid records in the wrong shard do not pass: each record must match its plan row."""
    cfg, storage = local_cfg(sample_dir, tmp_path), Storage()
    files = stage_until_written(cfg, storage)
    train = [f for f in files if f.startswith("train-")]
    assert len(train) >= 2
    shards = Path(cfg.staging_uri) / "shards"
    a, b = (shards / train[0]).read_bytes(), (shards / train[1]).read_bytes()
    (shards / train[0]).write_bytes(b)
    (shards / train[1]).write_bytes(a)
    with pytest.raises(stages.BuildError, match="is not planned for this shard"):
        stages.validate_stage(cfg, storage)


def test_deleted_shard_fails_validation_on_s3(sample_dir: Path, bucket: str, s3_storage: Storage) -> None:
    cfg = BuildConfig(source=str(sample_dir), destination=f"s3://{bucket}", dataset="d", version="v1",
                      shard_size_mb=0.05)
    shard = stage_until_written(cfg, s3_storage)[-1]
    s3_storage.s3.delete_object(Bucket=bucket, Key=f"d/_staging/v1/shards/{shard}")
    with pytest.raises(stages.BuildError, match=f"shard {shard} is missing"):
        stages.validate_stage(cfg, s3_storage)
    assert not s3_storage.exists(f"s3://{bucket}/d/v1/_SUCCESS")


def test_publish_is_idempotent_and_versions_are_immutable(sample_dir: Path, tmp_path: Path) -> None:
    cfg, storage = local_cfg(sample_dir, tmp_path), Storage()
    stage_until_written(cfg, storage)
    stages.validate_stage(cfg, storage)
    stages.card_stage(cfg, storage)
    first = stages.publish_stage(cfg, storage)
    assert first["already_published"] is False
    published = _files(Path(cfg.version_uri))
    assert {"_SUCCESS", "manifest.json", "labels.csv", "rejects.csv", "card.md", "card.html",
            "card/records.png"} <= published.keys()
    modes = {name: (Path(cfg.version_uri) / name).stat().st_mode & 0o777 for name in published}
    assert set(modes.values()) == {0o644}, modes  # readable by everyone who may read the folder

    again = stages.publish_stage(cfg, storage)  # a retried publish after success
    assert again["already_published"] is True
    assert _files(Path(cfg.version_uri)) == published

    other = local_cfg(sample_dir, tmp_path, salt="different")  # same version, different content
    stage_until_written(other, storage)
    stages.validate_stage(other, storage)
    stages.card_stage(other, storage)
    with pytest.raises(stages.BuildError, match=r"already published .* with different content"):
        stages.publish_stage(other, storage)
    assert _files(Path(cfg.version_uri)) == published


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_latest_only_moves_forward_under_concurrency(where: str, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    if where == "s3":
        storage, root = request.getfixturevalue("s3_storage"), f"s3://{request.getfixturevalue('bucket')}/d"
    else:
        storage, root = Storage(), str(tmp_path / "d")
    versions = [f"20261101T{h:02d}0000Z" for h in range(12)]
    threads = [threading.Thread(target=layout.update_latest, args=(Storage(storage._factory), root, v))
               for v in reversed(versions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert json.loads(storage.read_bytes(join(root, "latest.json"))) == {"version": versions[-1]}
    assert layout.update_latest(storage, root, versions[0]) == versions[-1]  # an older run never wins
    assert json.loads(storage.read_bytes(join(root, "latest.json"))) == {"version": versions[-1]}


def test_version_key_is_natural() -> None:
    assert layout.version_key("v10") > layout.version_key("v9")
    assert layout.version_key("20261102T000000Z") > layout.version_key("20261101T230000Z")


def test_duplicates_and_conflicts_are_rejected_not_lost(tmp_path: Path, sample_dir: Path) -> None:
    src = tmp_path / "src"
    for cls in ("a", "b"):
        (src / cls).mkdir(parents=True)
    images = sorted(sample_dir.rglob("*.jpg"))
    (src / "a" / "one.jpg").write_bytes(images[0].read_bytes())
    (src / "a" / "one-copy.jpg").write_bytes(images[0].read_bytes())  # duplicate, same label
    (src / "a" / "two.jpg").write_bytes(images[1].read_bytes())
    (src / "b" / "two.jpg").write_bytes(images[1].read_bytes())  # same bytes, other label
    (src / "b" / "three.jpg").write_bytes(images[2].read_bytes())
    (src / "b" / "broken.jpg").write_bytes(images[3].read_bytes()[:500])
    cfg = BuildConfig(source=str(src), destination=str(tmp_path / "out"), dataset="d", version="v",
                      max_reject_fraction=1.0)
    storage = Storage()
    stage_until_written(cfg, storage)
    stages.validate_stage(cfg, storage)
    stages.card_stage(cfg, storage)
    stages.publish_stage(cfg, storage)
    rejects = (Path(cfg.version_uri) / "rejects.csv").read_text().splitlines()
    assert rejects[0] == "filename,reason,detail"
    assert sorted(rejects[1:]) == sorted([
        "a/one.jpg,duplicate,same content as a/one-copy.jpg",
        "a/two.jpg,label_conflict,\"same content labelled a, b\"",
        "b/two.jpg,label_conflict,\"same content labelled a, b\"",
        "b/broken.jpg,corrupt,OSError: Truncated File Read",
    ])
    manifest = json.loads((Path(cfg.version_uri) / "manifest.json").read_text())
    assert manifest["num_records"] == 2 and manifest["num_rejected"] == 4
    assert manifest["classes"] == ["a", "b"]
    assert manifest["rejects_by_reason"] == {"corrupt": 1, "duplicate": 1, "label_conflict": 2}


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_file_that_vanishes_before_inspection_is_rejected(where: str, sample_dir: Path, tmp_path: Path,
                                                            request: pytest.FixtureRequest) -> None:
    """Listed, then gone before it is read: a reject (unreadable), not a failed task, on both stores."""
    import shutil

    if where == "s3":
        storage, bucket = request.getfixturevalue("s3_storage"), request.getfixturevalue("bucket")
        for path in sample_dir.rglob("*"):
            if path.is_file():
                storage.write_bytes(f"s3://{bucket}/src/{path.relative_to(sample_dir).as_posix()}", path.read_bytes())
        source, dest = f"s3://{bucket}/src", f"s3://{bucket}/out"
    else:
        storage, source, dest = Storage(), str(tmp_path / "src"), str(tmp_path / "out")
        shutil.copytree(sample_dir, source)
    cfg = BuildConfig(source=source, destination=dest, dataset="d", version="v")
    stages.discover_stage(cfg, storage)
    gone = "circles/circle_000.jpg"
    if where == "s3":
        storage.s3.delete_object(Bucket=bucket, Key=f"src/{gone}")
    else:
        (Path(source) / gone).unlink()
    assert stages.inspect_stage(cfg, storage)["rejected"] == 1
    rejects = storage.read_text(join(cfg.staging_uri, "rejects-inspect.csv")).splitlines()
    assert rejects == ["filename,reason,detail", f"{gone},unreadable,file disappeared since it was listed"]


def test_same_content_in_two_splits_fails_validation(sample_dir: Path, tmp_path: Path) -> None:
    """labels.csv claiming one content in two splits (a bug upstream) is caught before publishing."""
    import csv

    cfg, storage = local_cfg(sample_dir, tmp_path), Storage()
    stage_until_written(cfg, storage)
    labels = Path(cfg.staging_uri) / "labels.csv"
    with open(labels, newline="") as f:
        reader = csv.DictReader(f)
        fields, rows = reader.fieldnames, list(reader)
    train = next(r for r in rows if r["split"] == "train")
    other = next(r for r in rows if r["split"] != "train")
    other["sha256"] = train["sha256"]
    with open(labels, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(stages.BuildError, match=r"identical image content in splits .*"
                                                rf"{train['filename']}.*{other['filename']}|"
                                                rf"identical image content in splits .*{other['filename']}"):
        stages.validate_stage(cfg, storage)
    assert not Path(cfg.version_uri).exists()
