"""One behaviour suite for every Store: LocalStore on a temporary folder, S3Store on a SeaweedFS bucket
(through a client whose listings come two keys a page, so that paging is exercised)."""

from __future__ import annotations

import errno
import hashlib
import os
import pickle
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.storage import (
    LocalStore,
    S3Store,
    Storage,
    StorageError,
    Store,
    from_s3_checksum,
    join,
    to_s3_checksum,
)
from image_tfrecords.storage import local as local_module


class SmallPages:
    """A boto3 client whose ListObjectsV2 paginator asks for two keys a page and counts the pages."""

    def __init__(self, client: Any, pages: list[int]) -> None:
        self._client, self._pages = client, pages

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def get_paginator(self, name: str) -> Any:
        paginator, pages = self._client.get_paginator(name), self._pages

        class Counting:
            def paginate(self, **kwargs: Any) -> Iterator[dict[str, Any]]:
                for page in paginator.paginate(PaginationConfig={"PageSize": 2}, **kwargs):
                    pages.append(1)
                    yield page

        return Counting()


@dataclass
class Case:
    kind: str
    store: Store
    root: str
    pages: list[int] = field(default_factory=list)  # listing pages fetched (S3 only)

    def uri(self, *parts: str) -> str:
        return join(self.root, *parts)


@pytest.fixture(params=["local", "s3"])
def case(request: pytest.FixtureRequest, tmp_path: Path) -> Case:
    if request.param == "local":
        return Case("local", LocalStore(), str(tmp_path / "root"))
    server, bucket = request.getfixturevalue("s3_server"), request.getfixturevalue("bucket")
    pages: list[int] = []
    return Case("s3", S3Store(lambda: SmallPages(server.client(), pages)), f"s3://{bucket}/root", pages)


def _write(case: Case, *keys: str) -> None:
    for key in keys:
        case.store.write_bytes(case.uri(key), f"content of {key}".encode())


def test_write_read_exists(case: Case, tmp_path: Path) -> None:
    store, uri = case.store, case.uri("a", "x.bin")
    assert not store.exists(uri)
    assert store.sha256_of(uri) is None
    with pytest.raises(FileNotFoundError):
        store.read_bytes(uri)
    with pytest.raises(FileNotFoundError), store.open_read(uri):
        pass
    data = os.urandom(3 << 20)
    store.write_bytes(uri, data)
    assert store.exists(uri) and not store.exists(case.uri("a"))  # a folder (a prefix) is not a file
    assert store.read_bytes(uri) == data
    with store.open_read(uri) as f:
        assert f.read(10) == data[:10] and f.read() == data[10:]
    store.write_bytes(uri, b"replaced")
    assert store.read_bytes(uri) == b"replaced"
    assert store.sha256_of(uri) == hashlib.sha256(b"replaced").hexdigest()
    store.download(uri, str(tmp_path / "down.bin"))
    assert (tmp_path / "down.bin").read_bytes() == b"replaced"
    with store.open_source(case.root, "a/x.bin") as (stream, size):
        assert stream.read() == b"replaced" and size in (-1, len(b"replaced"))  # -1: the listing knows it


def test_change_tag_holds_until_the_content_may_have_changed(case: Case) -> None:
    """What validation compares instead of re-hashing a shard it checked earlier in the build."""
    store, uri = case.store, case.uri("tagged.bin")
    assert store.change_tag(uri) is None
    store.write_bytes(uri, b"first")
    tag = store.change_tag(uri)
    assert tag is not None and store.change_tag(uri) == tag  # nothing changed: the same tag
    store.write_bytes(uri, b"other")  # the same size, new content
    assert store.change_tag(uri) not in (None, tag)
    if case.kind == "local":  # written in place (not through the store): still seen
        tag = store.change_tag(uri)
        with open(uri, "r+b") as f:
            f.write(b"O")
        assert store.change_tag(uri) != tag


def test_upload(case: Case, tmp_path: Path) -> None:
    path = tmp_path / "file.bin"
    path.write_bytes(os.urandom(100_000))
    case.store.upload(str(path), case.uri("up.bin"), hashlib.sha256(path.read_bytes()).hexdigest())
    assert case.store.read_bytes(case.uri("up.bin")) == path.read_bytes()


def test_iter_files(case: Case) -> None:
    _write(case, "top.bin", "a/1.bin", "a/b/2.bin", "c/3.bin", "c/4.bin")
    case.store.write_bytes(join(case.root + "2", "sibling.bin"), b"not below the root")  # same key prefix
    infos = list(case.store.iter_files(case.root))
    assert [i.key for i in infos] == ["a/1.bin", "a/b/2.bin", "c/3.bin", "c/4.bin", "top.bin"]
    assert all(i.size == len(f"content of {i.key}") and i.kind == "file" for i in infos)
    assert [i.key for i in case.store.iter_files(case.uri("c"))] == ["3.bin", "4.bin"]
    assert [i.key for i in case.store.iter_files(case.uri("a") + "/")] == ["1.bin", "b/2.bin"]


def test_list_dirs(case: Case) -> None:
    _write(case, "top.bin", "a/1.bin", "a/b/2.bin", "c/3.bin", "d/e/f/4.bin", "g/5.bin", "h/6.bin")
    case.store.write_bytes(join(case.root + "2", "sibling", "x.bin"), b"not below the root")
    assert case.store.list_dirs(case.root) == ["a", "c", "d", "g", "h"]
    assert case.store.list_dirs(case.root + "/") == ["a", "c", "d", "g", "h"]
    assert case.store.list_dirs(case.uri("a")) == ["b"]
    assert case.store.list_dirs(case.uri("d", "e")) == ["f"]
    assert case.store.list_dirs(case.uri("c")) == []
    assert case.store.list_dirs(case.uri("nothing-here")) == []
    assert case.store.list_children(case.root) == (["a", "c", "d", "g", "h"], ["top.bin"])
    if case.kind == "s3":
        assert len(case.pages) > 3, "the listings were not paged"


def test_list_dirs_does_not_follow_symlinks(tmp_path: Path) -> None:
    (tmp_path / "root" / "real").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "root" / "file-link").symlink_to(tmp_path / "elsewhere")
    assert LocalStore().list_children(str(tmp_path / "root")) == (["real"], [])


def test_write_if_unchanged(case: Case) -> None:
    store, uri = case.store, case.uri("lock.json")
    assert store.read_with_tag(uri) == (None, None)
    assert store.write_if_unchanged(uri, b"first", None)
    assert not store.write_if_unchanged(uri, b"second", None)  # None: only if absent
    data, tag = store.read_with_tag(uri)
    assert data == b"first" and tag
    assert store.write_if_unchanged(uri, b"third", tag)
    assert not store.write_if_unchanged(uri, b"fourth", tag)  # moved on since that tag
    assert store.read_with_tag(uri)[0] == b"third"


def test_copy(case: Case, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(case, "staging/x.bin", "final/x.bin")
    digest = hashlib.sha256(b"content of staging/x.bin").hexdigest()
    case.store.copy(case.uri("staging", "x.bin"), case.uri("final", "x.bin"), digest)  # replaces what is there
    case.store.copy(case.uri("staging", "x.bin"), case.uri("final", "y.bin"))
    assert case.store.read_bytes(case.uri("final", "x.bin")) == case.store.read_bytes(case.uri("final", "y.bin")) \
        == b"content of staging/x.bin"
    monkeypatch.setattr(local_module, "_link", lambda src, dst: False)  # a local copy to another disk: hashed
    with pytest.raises(StorageError, match="expected"):
        case.store.copy(case.uri("staging", "x.bin"), case.uri("final", "z.bin"), "0" * 64)


def test_delete_and_delete_tree(case: Case) -> None:
    _write(case, "x/1.bin", "x/y/2.bin", "xy/3.bin", "keep.bin")
    case.store.delete_tree(case.uri("x"))
    assert [i.key for i in case.store.iter_files(case.root)] == ["keep.bin", "xy/3.bin"]
    case.store.delete_tree(case.uri("x"))  # nothing there: nothing happens
    case.store.delete(case.uri("keep.bin"))
    case.store.delete(case.uri("keep.bin"))
    assert not case.store.exists(case.uri("keep.bin"))
    assert [i.key for i in case.store.iter_files(case.root)] == ["xy/3.bin"]


def test_scratch_dir_and_prune(case: Case) -> None:
    """A local store offers a scratch folder on the same disk and removes empty folders; S3 needs neither."""
    _write(case, "full/1.bin")
    scratch = case.store.scratch_dir(case.uri("scratch"))
    case.store.prune(case.uri("full"))  # not empty: kept
    assert case.store.exists(case.uri("full", "1.bin"))
    if case.root.startswith("s3://"):
        assert scratch is None
        return
    assert scratch == case.uri("scratch") and os.path.isdir(scratch)
    case.store.prune(scratch)
    assert not os.path.exists(scratch)


def test_storage_picks_the_store_for_each_uri(tmp_path: Path) -> None:
    storage = Storage(lambda: pytest.fail("no client is needed"))
    assert isinstance(storage._store_for("s3://bucket/key"), S3Store)
    assert isinstance(storage._store_for(str(tmp_path)), LocalStore)
    storage.prime(str(tmp_path))  # a local URI needs no client
    (tmp_path / "a").write_bytes(b"x")
    with pytest.raises(StorageError, match="between local and S3"):
        storage.copy(str(tmp_path / "a"), "s3://bucket/a")
    made: list[int] = []
    storage = Storage(lambda: made.append(1) or object())
    storage.prime("s3://bucket/key")
    assert made == [1] and storage.s3 is storage.s3 and made == [1]
    copy = pickle.loads(pickle.dumps(Storage()))  # no client travels; the copy makes its own
    assert copy._s3._client is None and copy.list_dirs(str(tmp_path)) == []


def test_the_s3_checksum_conversion() -> None:
    digest = hashlib.sha256(b"abc").hexdigest()
    assert to_s3_checksum(digest) == "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0="
    assert from_s3_checksum(to_s3_checksum(digest)) == digest
    assert from_s3_checksum(None) is None and from_s3_checksum("") is None
    assert from_s3_checksum("ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=-3") is None  # multipart: not a digest


def test_the_test_server_has_room_for_a_bucket_per_test(s3_server: Any) -> None:
    """Each bucket is a SeaweedFS collection holding volumes of its own. With the default volume count
    (free disk / 1 GB), a CI machine with 45 GB free failed every PUT of the suite's 45th bucket, so
    the server this project starts sets it: at least 1,000 volumes, whatever the disk."""
    import json
    import urllib.request

    if s3_server.pid is None:
        pytest.skip("an existing S3 server (IMAGE_TFRECORDS_S3_ENDPOINT): its volumes are its own")
    with urllib.request.urlopen(f"http://127.0.0.1:{s3_server.ports[0]}/dir/status", timeout=10) as response:
        topology = json.loads(response.read())["Topology"]
    assert topology["Max"] >= 1000, topology


def test_deferred_writes_skip_their_fsync_and_sync_makes_them_durable(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Below a deferred prefix, writes and uploads make no fsync of their own; ``sync`` makes one syncfs of
    their file system; writes elsewhere still fsync each; a pickled Storage keeps the prefixes."""
    fsyncs: list[int] = []
    synced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(local_module.os, "fsync", lambda fd: (fsyncs.append(fd), real_fsync(fd))[1])
    monkeypatch.setattr(local_module, "syncfs", synced.append)
    storage = Storage()
    staging, final = tmp_path / "d" / "_staging" / "v1", tmp_path / "d" / "v1"
    storage.defer_sync(str(staging))
    storage.write_bytes(str(staging / "a.json"), b"{}")
    path = tmp_path / "rows.csv"
    path.write_bytes(b"x\n1\n")
    storage.upload(str(path), str(staging / "rows.csv"))
    assert fsyncs == [] and synced == []
    assert storage.read_bytes(str(staging / "a.json")) == b"{}"
    assert storage.read_bytes(str(staging / "rows.csv")) == b"x\n1\n"
    storage.write_bytes(str(final / "_SUCCESS"), b"ok\n")  # not deferred: its own fsync, as before
    assert len(fsyncs) == 1
    storage.sync(str(final))  # nothing deferred there, nothing to do
    assert synced == []
    storage.sync(str(staging))
    assert synced == [str(staging)]
    again = pickle.loads(pickle.dumps(storage))
    again.write_bytes(str(staging / "b.json"), b"[]")
    assert len(fsyncs) == 1
    assert again._local.deferred == storage._local.deferred


def test_syncfs_runs_on_this_file_system(tmp_path: Path) -> None:
    from image_tfrecords.storage.local import syncfs

    (tmp_path / "f").write_bytes(b"x")
    syncfs(str(tmp_path))  # a folder
    syncfs(str(tmp_path / "f"))  # a file
    with pytest.raises(FileNotFoundError):
        syncfs(str(tmp_path / "missing"))


def test_a_failing_syncfs_raises_naming_the_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error writing back the staged files (``syncfs`` returns -1 with EIO) fails the sync naming the folder:
    never an ``os.sync`` that reports nothing."""
    import ctypes

    from image_tfrecords.storage import local

    def failing(fd: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    if local._syncfs() is None:
        pytest.skip("no syncfs in this C library")
    monkeypatch.setattr(local, "_syncfs", lambda: failing)
    monkeypatch.setattr(os, "sync", lambda: pytest.fail("os.sync was called"))
    storage = Storage()
    storage.defer_sync(str(tmp_path))
    with pytest.raises(OSError, match="syncfs failed") as raised:
        storage.sync(str(tmp_path))
    assert raised.value.errno == errno.EIO and raised.value.filename == str(tmp_path)


@pytest.mark.parametrize("size", [0, 1, 4095, 4096, 4097, 3 * 4096 + 5])
def test_sha256_file_hashes_every_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    """Files hashed through one reused buffer (chunks of 4 KiB here): the digest of the whole file, whatever its
    size against the chunk's."""
    from image_tfrecords.storage import base

    monkeypatch.setattr(base, "HASH_CHUNK", 4096)
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert base.sha256_file(str(path)) == hashlib.sha256(data).hexdigest()
