"""The command line reads each S3 source image once: inspection keeps a local copy (``source.spool``) that the
write stage takes, and the published bytes are the same as when every image is read twice; a damaged copy is
read from the source again, never published."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import cli
from image_tfrecords.config import BuildConfig
from image_tfrecords.source import spool
from image_tfrecords.storage import Storage, s3_reads

OPEN_OBJECT = s3_reads.open_object


@pytest.fixture
def source(sample_dir: Path, s3_storage: Storage, bucket: str) -> str:
    for path in sorted(sample_dir.rglob("*")):
        if path.is_file():
            s3_storage.s3.upload_file(str(path), bucket, f"src/{path.relative_to(sample_dir)}")
    return f"s3://{bucket}/src"


def _build(source: str, out: Path, version: str, monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], Path]:
    reads: list[str] = []
    monkeypatch.setattr(s3_reads, "open_object", lambda client, uri: (reads.append(uri), OPEN_OBJECT(client, uri))[1])
    cfg = BuildConfig(source=source, destination=str(out), dataset="d", version=version)
    cli.build(cfg, workers=1, progress=False, storage=Storage())
    return reads, out / "d" / version


def _shards(version: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(version.glob("*.tfrecord"))}


def test_each_image_is_read_once_and_the_bytes_are_the_same(source: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    once, kept = _build(source, tmp_path / "once", "v1", monkeypatch)
    assert once and len(once) == len(set(once)), "an image read twice"
    monkeypatch.setenv(spool.SPOOL_ENV, "0")
    twice, plain = _build(source, tmp_path / "twice", "v1", monkeypatch)
    assert set(twice) == set(once) and len(twice) >= 1.5 * len(once), "without copies the write stage reads again"
    assert _shards(kept) == _shards(plain)


def test_a_damaged_copy_is_read_again_from_the_source(source: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    real_keep = spool.keep
    damaged: list[str] = []

    def keep_damaged(sha256: str, data: bytes) -> None:
        real_keep(sha256, data[:-1] + bytes([data[-1] ^ 1]))  # a flipped bit on the local disk
        damaged.append(sha256)

    monkeypatch.setattr(spool, "keep", keep_damaged)
    reads, version = _build(source, tmp_path / "out", "v1", monkeypatch)
    assert damaged and len(reads) >= 2 * len(damaged)
    monkeypatch.setattr(spool, "keep", real_keep)
    clean: dict[str, Any] = _shards(_build(source, tmp_path / "clean", "v1", monkeypatch)[1])
    assert _shards(version) == clean
