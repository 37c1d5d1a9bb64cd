"""S3 keys are taken verbatim: keys that are not clean relative paths are rejects, never read as another key.

SeaweedFS normalises ``a//x.png`` to ``a/x.png`` on upload (it keeps one object), so these tests use moto,
which keeps every key as real S3 does: ``a/x.png`` and ``a//x.png`` are two objects.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import cli
from image_tfrecords.config import BuildConfig
from image_tfrecords.storage import Storage


def _png(seed: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.frombytes("RGB", (7, 5), bytes((seed * 37 + i) % 256 for i in range(105))).save(buf, "PNG")
    return buf.getvalue()


@pytest.fixture
def moto_s3(monkeypatch: pytest.MonkeyPatch) -> Any:
    from moto import mock_aws

    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s", "AWS_REGION": "us-east-1",
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("IMAGE_TFRECORDS_S3_READER", "boto3")  # moto answers boto3 only (obstore: test_s3_reads)
    with mock_aws():
        import boto3

        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket="photos")
        yield client


def test_unclean_keys_are_rejects_and_never_read_as_another_key(moto_s3: Any, tmp_path: Path) -> None:
    objects = {f"src/circles/{i}.png": _png(i) for i in range(6)} | {f"src/squares/{i}.png": _png(10 + i)
                                                                    for i in range(6)}
    odd = {"src/circles//0.png": _png(90), "src//circles/1.png": _png(91), "src/circles/./2.png": _png(92),
           "src/circles/../3.png": _png(93), "src/circles/e/": _png(94), "src/squares/x/": b""}
    for key, data in {**objects, **odd}.items():
        moto_s3.put_object(Bucket="photos", Key=key, Body=data)
    kept = {o["Key"] for o in moto_s3.list_objects_v2(Bucket="photos", Prefix="src/")["Contents"]}
    assert set(odd) <= kept, "moto keeps every key verbatim, as S3 does"

    cfg = BuildConfig(source="s3://photos/src", destination=str(tmp_path / "out"), dataset="d", version="v1",
                      max_reject_fraction=1)
    cli.build(cfg, workers=1, progress=False, storage=Storage())
    version = tmp_path / "out" / "d" / "v1"
    with open(version / "rejects.csv", newline="") as f:
        rejects = {row["filename"]: row["reason"] for row in csv.DictReader(f)}
    assert rejects == {"circles//0.png": "bad_key", "/circles/1.png": "bad_key", "circles/./2.png": "bad_key",
                       "circles/../3.png": "bad_key", "circles/e/": "bad_key"}
    with open(version / "labels.csv", newline="") as f:
        labels = {row["filename"]: row for row in csv.DictReader(f)}
    assert set(labels) == {key[len("src/"):] for key in objects}
    for key, data in objects.items():  # each record holds its own object's bytes
        assert labels[key[len("src/"):]]["sha256"] == hashlib.sha256(data).hexdigest()
    shards = b"".join(p.read_bytes() for p in version.glob("*.tfrecord"))
    for key, data in odd.items():
        if data:
            assert data not in shards, key
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["skipped_by_kind"] == {"folder_marker": 1}
