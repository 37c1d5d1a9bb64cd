"""Nothing unchecked is published, no error is swallowed (issue 49): a night whose base shard is damaged, whose
spliced shard is damaged after it was written, or whose writes or syncs fail.

Real parts: local folders, the command line's build in this process (one worker, so that the faults injected
here reach the code that writes), TensorFlow reading what was published. The faults are real bytes flipped in
real files, or ``os.write``/``os.fsync``/``syncfs`` failing for the shard being written only.
"""

from __future__ import annotations

import csv
import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.published import layout
from image_tfrecords.stages import write as write_module
from image_tfrecords.staging import SHARDS, staged
from image_tfrecords.storage import Storage, join
from image_tfrecords.storage import local as local_module
from tests.pipeline.test_incremental import SHARD_MB, Images, add, base_source, build, check_version, read, run_main
from tests.pipeline.test_incremental import Source as IncrementalSource

SHARD_SUFFIX = ".tfrecord"


def _night(tmp_path: Path) -> tuple[Storage, IncrementalSource, Path, dict[str, list[dict[str, str]]]]:
    """v1 built into ``out``, then a night's changes to the source (every fifth image deleted, four added):
    each base shard loses records, so the night splices them. Returns v1's labels.csv rows by shard."""
    storage = Storage()
    source = base_source(tmp_path, storage, None, per_class=12)
    dest = tmp_path / "out"
    build(storage, source.uri, str(dest), "d", "v1")
    with open(dest / "d" / "v1" / layout.LABELS, newline="") as f:
        rows = list(csv.DictReader(f))
    by_shard: dict[str, list[dict[str, str]]] = {}
    for row in sorted(rows, key=lambda r: int(r["shard_position"])):
        by_shard.setdefault(row["shard"], []).append(row)
    for records in by_shard.values():
        source.delete(records[0]["filename"])  # each shard loses its first record: a splice of the rest
    add(source, Images(tmp_path / "new"), "triangles", "n", 4)
    return storage, source, dest, by_shard


def _record_start(shard: Path, position: int) -> int:
    """Where record ``position`` of ``shard`` begins (its ``.tfindex``)."""
    return int(Path(layout.index_file(str(shard))).read_text().splitlines()[position].split()[0])


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x01]))


def _nothing_published(dest: Path, version: str) -> None:
    """No ``_SUCCESS`` in the version's folder (what makes a version visible: readers and the next night go by it),
    and ``latest`` still names v1."""
    assert not (dest / "d" / version / layout.SUCCESS).exists()
    assert layout.read_latest(Storage(), str(dest / "d")) == "v1"


def test_a_flipped_byte_in_a_kept_record_of_a_base_shard_is_never_published(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """A byte of a kept record's image, flipped in the base shard (its length and framing intact): the record's
    data CRC fails in the splice, and, as docs/incremental.md promises for a damaged base, that shard is written
    from the source instead; the log names the base file and the manifest the shard. What TensorFlow reads is
    the source's images, as a full build of it holds them."""
    storage, source, dest, by_shard = _night(tmp_path)
    shard, records = sorted(by_shard.items())[0]
    base = dest / "d" / "v1" / shard
    kept = records[1]  # its first record is deleted: the second is the first kept
    _flip(base, _record_start(base, int(kept["shard_position"])) + 40)
    status, _out, err = run_main(capsys, "--source", source.uri, "--destination", str(dest), "--dataset", "d",
                                "--version", "v2", "--shard-size-mb", str(SHARD_MB))
    assert status == 0, err
    assert f"{base} is damaged: the record at byte" in caplog.text and "fails its CRC" in caplog.text, caplog.text
    version = read(storage, join(str(dest), "d", "v2"))
    assert version.build["mode"] == "incremental"
    assert version.build["shards_from_source_after_damage"], version.build
    check_version(storage, version, source.files())  # every record is the source's image, read by TensorFlow
    full = tmp_path / "full"
    build(storage, source.uri, str(full), "d", "v2", full=True)
    assert version.rows == read(storage, join(str(full), "d", "v2")).rows


def test_a_spliced_shard_damaged_after_it_was_written_fails_the_build(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A byte of a spliced shard flipped once the splice has staged it (and its check): the validate stage finds
    the file changed since it was checked, reads it again, and the build fails naming the shard; nothing of v2 is
    published."""
    storage, source, dest, _ = _night(tmp_path)
    real, damaged = write_module.splice_shard, []

    def splice_then_damage(cfg: Any, storage: Storage, shard: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
        result = real(cfg, storage, shard, *args, **kwargs)
        if not damaged:
            staged_shard = Path(staged(cfg, SHARDS, shard))
            _flip(staged_shard, _record_start(staged_shard, 0) + 40)
            damaged.append(shard)
        return result

    monkeypatch.setattr(write_module, "splice_shard", splice_then_damage)
    with pytest.raises(Exception, match="corrupt") as raised:
        build(storage, source.uri, str(dest), "d", "v2")
    assert damaged and damaged[0] in str(raised.value), raised.value
    _nothing_published(dest, "v2")


def _failing_for_shards(real: Callable[..., Any], error: int, calls: list[str]) -> Callable[..., Any]:
    """``real`` (``os.write`` or ``os.fsync``), raising ``error`` for a descriptor open on a shard file."""

    def call(fd: int, *args: Any) -> Any:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if path.endswith(SHARD_SUFFIX):
            calls.append(path)
            raise OSError(error, os.strerror(error))
        return real(fd, *args)

    return call


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell the shard's writes")
@pytest.mark.parametrize("error", [errno.EIO, errno.ENOSPC], ids=["EIO", "ENOSPC"])
def test_a_failed_write_fails_the_build_naming_the_shard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], error: int) -> None:
    """``write`` of a spliced shard fails (a disk error, a full disk): the build fails with one line naming the
    file, and nothing of v2 is published."""
    _, source, dest, _ = _night(tmp_path)
    calls: list[str] = []
    monkeypatch.setattr(os, "write", _failing_for_shards(os.write, error, calls))
    status, _out, err = run_main(capsys, "--source", source.uri, "--destination", str(dest), "--dataset", "d",
                                "--version", "v2", "--shard-size-mb", str(SHARD_MB))
    assert calls and status == 1, (calls, status, err)
    assert any(line.startswith("error: ") and Path(calls[0]).name in line for line in err.splitlines()), err
    _nothing_published(dest, "v2")


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to tell the shard's writes")
def test_a_failed_fsync_of_a_spliced_shard_raises_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a splice makes its shard durable itself (staging not deferred to one syncfs), a failing ``fsync``
    raises an OSError naming the shard file; nothing is staged for it."""
    from image_tfrecords import stages
    from image_tfrecords.shards.splice import splice_shard
    from image_tfrecords.staging import PLAN, RECEIPTS
    from image_tfrecords.storage.documents import read_json
    from tests.pipeline.test_incremental import config

    storage, source, dest, _ = _night(tmp_path)
    cfg = config(source.uri, str(dest), "d", "v2")
    for stage in stages.PIPELINE[:4]:  # discover, inspect, split, plan
        stage.run(cfg, storage, **({"workers": 1} if stage.per_image else {}))
    shard, origin = sorted(read_json(storage, staged(cfg, PLAN))["rewrite"].items())[0]
    calls: list[str] = []
    monkeypatch.setattr(os, "fsync", _failing_for_shards(os.fsync, errno.EIO, calls))
    assert not storage.is_deferred(staged(cfg, SHARDS, shard))
    with pytest.raises(OSError) as raised:
        splice_shard(cfg, storage, shard, origin, read_workers=1)
    assert raised.value.errno == errno.EIO and Path(str(raised.value.filename)).name == shard, raised.value
    assert not storage.exists(staged(cfg, SHARDS, shard)) and not storage.exists(staged(cfg, RECEIPTS, shard + ".json"))


def test_a_failed_syncfs_of_the_staging_fails_the_build_naming_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The build's staged files are made durable by one ``syncfs`` before the publish: when it fails (an I/O error
    writing any of them back), the build fails naming the staging folder, and nothing of v2 is published."""
    import ctypes

    if local_module._syncfs() is None:
        pytest.skip("no syncfs in this C library")

    def failing(fd: int) -> int:
        ctypes.set_errno(errno.EIO)
        return -1

    storage, source, dest, _ = _night(tmp_path)
    monkeypatch.setattr(local_module, "_syncfs", lambda: failing)
    with pytest.raises(OSError, match="syncfs failed") as raised:
        build(storage, source.uri, str(dest), "d", "v2")
    assert raised.value.errno == errno.EIO and "/d/" in str(raised.value.filename), raised.value
    _nothing_published(dest, "v2")
