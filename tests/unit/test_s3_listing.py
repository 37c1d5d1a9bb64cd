"""The parallel listing (``storage.s3_listing``) on a real S3 server (SeaweedFS) gives what one sequential listing
gives, entry for entry and in the same order: with folder markers, keys obstore cannot express, files beside the
folders, folders of several pages, and with its window smaller than the folders."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from image_tfrecords.source.localfs import FileRun
from image_tfrecords.storage import Storage, StorageError, s3_listing, s3_reads


def _entries(storage: Storage, uri: str, concurrency: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, concurrency)
    return [(i.key, i.size, i.modified.isoformat() if i.modified else None, i.kind, i.stamp, i.problem)
            for i in storage.iter_files(uri, everything=True)]


def _run_entries(storage: Storage, uri: str, concurrency: str, monkeypatch: pytest.MonkeyPatch
                 ) -> list[tuple[Any, ...]]:
    """``iter_file_runs``, each FileRun's objects as ``_entries`` gives them."""
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, concurrency)
    out: list[tuple[Any, ...]] = []
    for item in storage.iter_file_runs(uri):
        if type(item) is FileRun:
            assert item.names and all("/" not in name for name in item.names)
            out += [(item.prefix + name, size, when.isoformat(), "file", stamp, "") for name, size, stamp, when in
                    zip(item.names, item.sizes, item.stamps, item.modified, strict=True)]
        else:
            out.append((item.key, item.size, item.modified.isoformat() if item.modified else None, item.kind,
                        item.stamp, item.problem))
    return out


def _put_all(storage: Storage, bucket: str, keys: list[str]) -> None:
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda k: storage.s3.put_object(Bucket=bucket, Key=k, Body=b"" if k.endswith("/") else b"x"),
                      keys))


def test_parallel_listing_equals_the_sequential_one(s3_storage: Storage, bucket: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    keys = [f"src/cls{c:02d}/img{i:04d}.jpg" for c in range(12) for i in range(30)]
    keys += [f"src/big/img{i:05d}.jpg" for i in range(2300)]  # three pages in one folder
    keys += ["src/", "src/cls03/", "src/cls05/sub/", "src/a b.jpg", "src/cls0.jpg", "src/zz.jpg", "src/cls07/tab\t.jpg",
             "src/cls08/ü.jpg", "src-sibling/not-mine.jpg", "src/cls09/empty.jpg"]
    _put_all(s3_storage, bucket, keys)
    s3_storage.s3.put_object(Bucket=bucket, Key="src/cls09/empty.jpg", Body=b"")
    uri = f"s3://{bucket}/src"
    sequential = _entries(s3_storage, uri, "1", monkeypatch)
    assert len(sequential) == len(keys) - 1  # all but the sibling's
    monkeypatch.setattr(s3_listing, "WINDOW_PAGES", 1)
    relisted: list[str] = []
    real = s3_listing._relist
    monkeypatch.setattr(s3_listing, "_relist", lambda store, u, *rest: (relisted.append(u), real(store, u, *rest))[1])
    for concurrency in ("2", "16"):
        relisted.clear()
        assert _entries(s3_storage, uri, concurrency, monkeypatch) == sequential, concurrency
        # boto3 lists again what obstore cannot say faithfully: a marker, a tab, an empty object
        assert sorted(relisted) == [f"{uri}/cls{c:02d}/" for c in (3, 5, 7, 9)]
        # discover's listing: a page's objects directly in its folder as one FileRun, nothing else different
        assert _run_entries(s3_storage, uri, concurrency, monkeypatch) == sequential, concurrency
    assert _run_entries(s3_storage, uri, "1", monkeypatch) == sequential


def test_the_parallel_listing_lists_folders_at_once(s3_storage: Storage, bucket: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    _put_all(s3_storage, bucket, [f"src/c{c}/{i}.jpg" for c in range(6) for i in range(3)])
    listed: list[str] = []
    real = s3_listing._obstore_pages
    monkeypatch.setattr(s3_listing, "_obstore_pages", lambda store, b, folder, prefix, *rest: (
        listed.append(folder), real(store, b, folder, prefix, *rest))[1])
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, "4")
    assert len(list(s3_storage.iter_files(f"s3://{bucket}/src"))) == 18
    assert listed == [f"src/c{c}/" for c in range(6)]
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, "1")
    listed.clear()
    assert len(list(s3_storage.iter_files(f"s3://{bucket}/src"))) == 18
    assert not listed


def test_a_reader_that_stops_early_leaves_no_lister_behind(s3_storage: Storage, bucket: str,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    _put_all(s3_storage, bucket, [f"src/c{c}/{i:04d}.jpg" for c in range(4) for i in range(1200)])
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, "4")
    monkeypatch.setattr(s3_listing, "WINDOW_PAGES", 1)
    listing = s3_storage.iter_files(f"s3://{bucket}/src")
    assert next(listing).key == "c0/0000.jpg"
    listing.close()
    for _ in range(100):
        if not [t for t in threading.enumerate() if t.name.startswith("s3-list")]:
            break
        time.sleep(0.1)
    assert not [t for t in threading.enumerate() if t.name.startswith("s3-list")]


def test_a_folder_that_changes_while_relisted_fails_naming_it(s3_storage: Storage, bucket: str,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    _put_all(s3_storage, bucket, [f"src/c/{i:04d}.jpg" for i in range(1500)] + ["src/c/zz/"])
    real = s3_listing._obstore_pages

    def then_changed(store: Any, b: str, folder: str, prefix: str, *rest: Any) -> Any:
        pages = real(store, b, folder, prefix, *rest)
        yield next(pages)  # the first page is passed on; then a new key sorts before it and a marker shows
        s3_storage.s3.put_object(Bucket=bucket, Key="src/c/0000-new.jpg", Body=b"x")
        raise s3_listing._Redo

    monkeypatch.setattr(s3_listing, "_obstore_pages", then_changed)
    monkeypatch.setenv(s3_reads.CONCURRENCY_ENV, "4")
    with pytest.raises(StorageError, match="changed while it was read"):
        list(s3_storage.iter_files(f"s3://{bucket}/src"))
