"""A local folder's listing in runs (``localfs.walk_runs``, ``discover(..., runs=True)``, discover.csv written a run at
a time) gives exactly what the listing an entry at a time gives: the same entries, candidates, rejects, counts,
fingerprint and discovered.csv bytes, on a tree with every odd thing a source holds."""

from __future__ import annotations

import contextlib
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.config import BuildConfig
from image_tfrecords.source import listing, localfs
from image_tfrecords.source.listing import CandidateRun, DiscoveryCounts, discover
from image_tfrecords.stages.discover import discover_stage
from image_tfrecords.staging import DISCOVER_REJECTS, DISCOVERED, staged
from image_tfrecords.storage import Storage
from image_tfrecords.storage.local import LocalStore

ODD_NAMES = ["a.jpg", "b.JPEG", "c.png", "comma, name.jpg", 'quote "q".jpg', "line\nbreak.jpg", "cr\rname.png",
             ".hidden.jpg", "noext", "readme.txt", "photo.heic", "photo.AVIF", "x.jxl", "Thumbs.db", ".jpg",
             "ünïcödé 名前.webp", "tail.", "z" * 200 + ".jpg"]


def _tree(root: Path) -> Path:
    """Class folders of plain and odd names, nested folders, hidden and odd folders, links, a FIFO, a socket, a
    name that is not UTF-8, files in the root, a key too long and an empty folder."""
    for label in ("roses", "tulips", "with,comma", ".hidden_class", "quo\"te"):
        for name in ODD_NAMES:
            path = root / label / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(name.encode("utf-8", "surrogateescape") * 3)
    for depth in range(3):
        deep = root / "roses" / "/".join(f"d{k}" for k in range(depth + 1))
        deep.mkdir(parents=True, exist_ok=True)
        for k in range(5):
            (deep / f"n{k}.jpg").write_bytes(b"n" * (k + 1))
        (deep / ".git").mkdir(exist_ok=True)
        (deep / ".git" / "inside.jpg").write_bytes(b"g")
    (root / "roses" / "empty").mkdir()
    (root / "root.jpg").write_bytes(b"r")
    (root / "notes.txt").write_bytes(b"n")
    os.symlink(root / "roses" / "a.jpg", root / "roses" / "link.jpg")
    os.symlink(root / "tulips", root / "linked_class")
    os.mkfifo(root / "tulips" / "pipe.jpg")
    with socket.socket(socket.AF_UNIX) as sock, contextlib.suppress(OSError):  # (a path too long for a socket)
        sock.bind(str(root / "tulips" / "sock.jpg"))
    bad = os.fsencode(root / "tulips") + b"/bad\xff\xfe.jpg"
    with open(bad, "wb") as f:
        f.write(b"bad")
    os.mkdir(os.fsencode(root) + b"/bad\xffdir")
    long_folder = root / "roses" / ("f" * 250) / ("g" * 250) / ("h" * 250)
    long_folder.mkdir(parents=True)
    (long_folder / ("i" * 200 + ".jpg")).write_bytes(b"long")
    return root


def _one_by_one(store: Any, uri: str) -> Any:
    """What the listing an entry at a time sees: ``iter_files``, never a run."""
    return store.iter_files(uri, everything=True)


def test_walk_runs_are_walk_entry_for_entry(tmp_path: Path) -> None:
    root = str(_tree(tmp_path / "src"))
    runs = list(localfs.walk_runs(root))
    assert any(isinstance(found, localfs.FileRun) and len(found.names) > 3 for found in runs)
    expanded = []
    for found in runs:
        if isinstance(found, localfs.FileRun):
            expanded += [(found.prefix + name, size, "file", "", stamp)
                         for name, size, stamp in zip(found.names, found.sizes, found.stamps, strict=True)]
        else:
            expanded.append((found.key, found.size, found.kind, found.problem, found.stamp))
    assert expanded == [(f.key, f.size, f.kind, f.problem, f.stamp) for f in localfs.walk(root)]
    assert len(expanded) > 100


@pytest.mark.parametrize("modern", [True, False])
def test_discover_in_runs_gives_the_same_candidates_counts_and_fingerprint(tmp_path: Path, modern: bool,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(_tree(tmp_path / "src"))
    fast_counts = DiscoveryCounts()
    fast = list(discover(Storage(), root, fast_counts, modern_formats=modern, runs=True))
    assert any(isinstance(found, CandidateRun) for found in fast)
    fast = [c for found in fast for c in (found.candidates() if isinstance(found, CandidateRun) else [found])]
    monkeypatch.setattr(LocalStore, "iter_file_runs", _one_by_one)
    slow_counts = DiscoveryCounts()
    slow = list(discover(Storage(), root, slow_counts, modern_formats=modern))
    assert fast == slow
    assert sum(not c.reason for c in fast) > 50 and any(c.reason for c in fast)
    for field in ("layout", "listed", "skipped", "after_cutoff", "skipped_by_kind"):
        assert getattr(fast_counts, field) == getattr(slow_counts, field), field
    assert fast_counts.fingerprint.hexdigest() == slow_counts.fingerprint.hexdigest()


def test_discover_stage_writes_the_same_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = str(_tree(tmp_path / "src"))
    storage = Storage()

    def staged_files(dest: str) -> tuple[bytes, bytes, dict[str, Any]]:
        cfg = BuildConfig(source=root, destination=str(tmp_path / dest), dataset="ds", version="v1")
        summary = discover_stage(cfg, storage)
        return (storage.read_bytes(staged(cfg, DISCOVERED)), storage.read_bytes(staged(cfg, DISCOVER_REJECTS)),
                summary)

    fast = staged_files("fast")
    monkeypatch.setattr(LocalStore, "iter_file_runs", _one_by_one)
    slow = staged_files("slow")
    assert fast == slow
    assert fast[0].count(b"\n") > 50
    assert b'"with,comma/a.jpg","with,comma",' in fast[0] and b'"roses/comma, name.jpg",roses,' in fast[0]


S3_KEYS = [f"{label}/{name}" for label in ("roses", "tulips", "with,comma", ".hidden_class", 'quo"te')
           for name in ODD_NAMES if "\r" not in name] + \
    [f"roses/d0/n{k}.jpg" for k in range(5)] + [f"roses/d0/d1/n{k}.jpg" for k in range(3)] + \
    ["roses/d0/.git/inside.jpg", "root.jpg", "notes.txt", "roses/" + "f" * 240 + ".jpg", "roses/" + "é" * 120 + ".png",
     "tulips/tab\t.jpg", "tulips/marker/", "tulips/empty.jpg"] + \
    [f"lilies/{name}" for name in ("a.jpg", "b.png", ".h.jpg", "readme.txt", "sub/c.jpg", "sub/.git/d.jpg", "z.webp",
                                    "photo.heic", "x.jxl")] + \
    [f"big/{i:05d}.jpg" for i in range(2100)]  # three pages (folders of odd names are listed again with boto3)


@pytest.mark.parametrize("with_cutoff", [False, True])
def test_s3_discover_in_runs_gives_what_one_by_one_gives(bucket: str, s3_storage: Storage, tmp_path: Path,
                                                         with_cutoff: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    import time
    from concurrent.futures import ThreadPoolExecutor
    from datetime import UTC, datetime

    from image_tfrecords.storage.s3 import S3Store

    later = [key for key in S3_KEYS if key.startswith("tulips/") or key in ("roses/d0/n0.jpg", "big/02099.jpg")]

    def put(key: str) -> None:
        s3_storage.s3.put_object(Bucket=bucket, Key=f"src/{key}", Body=b"" if key.endswith(("/", "empty.jpg"))
                                 else key.encode()[:40] or b"x")

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, [key for key in S3_KEYS if key not in later]))
    time.sleep(1.2)  # S3 times are to the millisecond; the cutoff falls between the two batches
    cutoff = datetime.now(UTC) if with_cutoff else None
    time.sleep(1.2)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, later))
    source = f"s3://{bucket}/src"

    def found() -> tuple[list[Any], DiscoveryCounts]:
        counts = DiscoveryCounts()
        out = list(discover(s3_storage, source, counts, cutoff, runs=True))
        return out, counts

    monkeypatch.setenv("IMAGE_TFRECORDS_S3_CONCURRENCY", "4")
    fast, fast_counts = found()
    runs = [f for f in fast if isinstance(f, CandidateRun)]
    assert sum(len(r.files.names) for r in runs) >= 2000 and any(r.label == "lilies" for r in runs)
    fast = [c for f in fast for c in (f.candidates() if isinstance(f, CandidateRun) else [f])]
    monkeypatch.setattr(S3Store, "iter_file_runs", _one_by_one)
    slow, slow_counts = found()
    assert fast == slow
    for field in ("layout", "listed", "skipped", "after_cutoff", "skipped_by_kind"):
        assert getattr(fast_counts, field) == getattr(slow_counts, field), field
    assert fast_counts.fingerprint.hexdigest() == slow_counts.fingerprint.hexdigest()
    assert fast_counts.after_cutoff == (len(later) if with_cutoff else 0)
    monkeypatch.setenv("IMAGE_TFRECORDS_S3_CONCURRENCY", "1")  # the sequential listing, one by one: the same
    again, again_counts = found()
    assert again == slow and again_counts.fingerprint.hexdigest() == slow_counts.fingerprint.hexdigest()


@pytest.mark.parametrize("names", [["a.jpg", "b.jpg"], ["a.jpg", ""], ["a.jpg", "."], ["..", "a.jpg"], ["a\0.jpg"],
                                   ["f" * 1000 + ".jpg"], ["é" * 505 + ".jpg"], ["é" * 300 + ".jpg"], ["x" * 1010]])
@pytest.mark.parametrize("prefix", ["roses/", "a/b/", "a/./", "a//", "r" * 20 + "/"])
def test_a_clean_run_is_one_whose_every_key_bad_key_passes(names: list[str], prefix: str) -> None:
    run = localfs.FileRun(prefix, names, [1] * len(names), ["e"] * len(names), [None] * len(names))
    assert listing._clean_run(run) == all(not listing.bad_key(prefix + name) for name in names)
