"""Source images read through obstore (``storage.s3_reads``) on a real S3 server (SeaweedFS), objects uploaded as
boto3 uploads them: the bytes of the key asked for, never another's; a key obstore cannot express read with boto3;
failures as one line naming object, endpoint and bucket; one store per process and bucket, whatever the threads."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from image_tfrecords.source.reading import read_source
from image_tfrecords.storage import Storage, StorageError, StoreUnreachable, s3_reads

ODD_KEYS = ("cat/a b.jpg", "cat/ü.jpg", "cat/a%20b.jpg", "cat/a+b.jpg", "cat/x#y.jpg", "cat/q?.jpg", "cat/*.jpg",
            "cat/~t.jpg", "cat/e\u0301.jpg", "cat/tab\t.jpg")
JPEG_HEAD = b"\xff\xd8\xff\xe0"


def _put(storage: Storage, bucket: str, keys: tuple[str, ...]) -> dict[str, bytes]:
    bodies = {key: JPEG_HEAD + key.encode() * 50 for key in keys}
    for key, body in bodies.items():  # a plain put_object: boto3's default checksum (CRC32) goes with it
        storage.s3.put_object(Bucket=bucket, Key=f"src/{key}", Body=body)
    return bodies


def test_odd_keys_read_their_own_bytes(s3_storage: Storage, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = _put(s3_storage, bucket, ODD_KEYS)
    asked: list[str] = []
    real = s3_reads.open_object
    monkeypatch.setattr(s3_reads, "open_object", lambda client, uri: (asked.append(uri), real(client, uri))[1])
    for key, body in bodies.items():
        assert read_source(s3_storage, f"s3://{bucket}/src", key, 1 << 20, len(body)) == body, key
    assert len(asked) == len(ODD_KEYS)
    with pytest.raises(s3_reads.Unreadable):  # object_store refuses a control character: boto3 read it above
        real(s3_storage.s3, f"s3://{bucket}/src/cat/tab\t.jpg")


def test_the_boto3_reader_reads_the_same(s3_storage: Storage, bucket: str, monkeypatch: pytest.MonkeyPatch) -> None:
    bodies = _put(s3_storage, bucket, ODD_KEYS[:3])
    monkeypatch.setenv(s3_reads.READER_ENV, "boto3")
    monkeypatch.setattr(s3_reads, "open_object", lambda *_: pytest.fail("obstore used with the boto3 reader"))
    for key, body in bodies.items():
        assert read_source(s3_storage, f"s3://{bucket}/src", key, 1 << 20, len(body)) == body
    monkeypatch.setenv(s3_reads.READER_ENV, "curl")
    with pytest.raises(StorageError, match="IMAGE_TFRECORDS_S3_READER"):
        read_source(s3_storage, f"s3://{bucket}/src", ODD_KEYS[0], 1 << 20, 10)


def test_size_is_checked_before_the_body_is_read(s3_storage: Storage, bucket: str) -> None:
    from image_tfrecords.images.probe import RejectedImage

    _put(s3_storage, bucket, ("cat/big.jpg",))
    with pytest.raises(RejectedImage, match="exceeds"):  # listed as small: the GET's size decides
        read_source(s3_storage, f"s3://{bucket}/src", "cat/big.jpg", 100, 10)
    with pytest.raises(RejectedImage) as missing:
        read_source(s3_storage, f"s3://{bucket}/src", "cat/gone.jpg", 1 << 20, 10)
    assert missing.value.reason == "unreadable"


def test_failures_name_object_endpoint_and_bucket(s3_server: Any, s3_env: dict[str, str], bucket: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(StorageError, match="does not exist") as no_bucket:
        Storage().open_source("s3://no-such-bucket-here/src", "cat/a.jpg").__enter__()
    assert "no-such-bucket-here" in str(no_bucket.value) and "\n" not in str(no_bucket.value)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises((StorageError, StoreUnreachable)) as denied:
        Storage().open_source(f"s3://{bucket}/src", "cat/a.jpg").__enter__()
    message = str(denied.value)
    assert s3_server.endpoint in message and repr(bucket) in message and "wrong" not in message, message


def test_one_store_per_process_and_bucket(s3_storage: Storage, bucket: str) -> None:
    _put(s3_storage, bucket, ("cat/a.jpg",))
    client = s3_storage.s3
    with ThreadPoolExecutor(16) as pool:
        stores = set(map(id, pool.map(lambda _: s3_reads.obstore_for(client, bucket), range(64))))
    assert len(stores) == 1
    assert s3_reads.obstore_for(client, bucket) is not s3_reads.obstore_for(client, bucket + "-other")
    if hasattr(os, "fork"):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # a child forked after obstore was used never uses it: its I/O threads stayed in the parent
            os.write(write, b"1" if not s3_reads._stores and not s3_reads.through_obstore() else b"0")
            body = read_source(s3_storage, f"s3://{bucket}/src", "cat/a.jpg", 1 << 20, -1)  # boto3: no hang
            os.write(write, b"1" if body.startswith(JPEG_HEAD) else b"0")
            os._exit(0)
        os.waitpid(pid, 0)
        assert os.read(read, 2) == b"11"


def test_concurrency_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(s3_reads.CONCURRENCY_ENV, raising=False)
    assert s3_reads.concurrency() == s3_reads.DEFAULT_CONCURRENCY
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, "0")
    assert s3_reads.concurrency() == 1
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, "many")
    with pytest.raises(StorageError, match="whole number"):
        s3_reads.concurrency()


def test_addressing_follows_boto3s() -> None:
    assert s3_reads.addressing("https://s3.eu-west-1.amazonaws.com", "b", False) == {
        "virtual_hosted_style_request": True}
    assert s3_reads.addressing("http://127.0.0.1:9000", "b", True) == {
        "endpoint": "http://127.0.0.1:9000", "virtual_hosted_style_request": False}
    assert s3_reads.addressing("https://minio.example.com", "photos", False) == {
        "endpoint": "https://photos.minio.example.com", "virtual_hosted_style_request": True}
