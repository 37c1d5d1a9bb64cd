"""DirectWriter: a new file written with O_DIRECT from aligned buffers on a thread (a spliced shard's bytes).

Real parts: the test machine's file system (skipped where it refuses O_DIRECT), real threads and writes.
"""

from __future__ import annotations

import errno
import mmap
import os
import random
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.shards import direct_file
from image_tfrecords.shards.direct_file import BLOCK, DirectWriter


@pytest.fixture
def small_buffers(monkeypatch: pytest.MonkeyPatch) -> int:
    """Buffers of 64 KiB instead of 8 MiB: many hand-overs in a few hundred KB."""
    monkeypatch.setattr(direct_file, "BUFFER", 16 * BLOCK)
    return 16 * BLOCK


def _writer(path: Path) -> DirectWriter:
    writer = DirectWriter.create(str(path))
    if writer is None:
        pytest.skip("this file system does not take O_DIRECT writes")
    return writer


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("pieces", [[], [1], [BLOCK - 1], [BLOCK], [BLOCK + 1], [16 * BLOCK], [16 * BLOCK, 1],
                                    [16 * BLOCK - 3, 3, 16 * BLOCK + 5], [7] * 1000, "random"])
def test_what_is_written_is_the_file_byte_for_byte(tmp_path: Path, small_buffers: int, pieces: Any) -> None:
    rng = random.Random(7)
    if pieces == "random":
        pieces = [rng.choice([1, 13, BLOCK - 1, BLOCK, 3 * small_buffers + 11]) for _ in range(60)]
    data = [rng.randbytes(n) for n in pieces]
    path = tmp_path / "out"
    writer = _writer(path)
    try:
        for piece in data:
            assert writer.write(memoryview(piece) if len(piece) % 2 else piece) == len(piece)
        assert writer.finish() == sum(pieces)
    finally:
        writer.close()
    assert path.read_bytes() == b"".join(data)  # no padding left after the last byte


def test_a_file_system_that_refuses_o_direct_gives_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def refuse(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", refuse)
    assert DirectWriter.create(str(tmp_path / "out")) is None


def test_a_refused_probe_write_gives_none_and_closes_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Some file systems open with O_DIRECT and refuse the writes (alignment): the probe finds out, leaks nothing."""
    def refuse(*_: Any) -> int:
        raise OSError(errno.EINVAL, "Invalid argument")

    before = _open_fds()
    monkeypatch.setattr(os, "pwrite", refuse)
    assert DirectWriter.create(str(tmp_path / "out")) is None
    assert _open_fds() == before


def test_a_failed_write_on_the_thread_is_raised_here(tmp_path: Path, small_buffers: int,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk while the thread writes: the caller sees the error (at a later write or at finish), nothing hangs,
    and close releases the file."""
    writer = _writer(tmp_path / "out")
    before = _open_fds()

    def full(*_: Any) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    source = mmap.mmap(-1, small_buffers)  # as a base shard's map is handed over
    with pytest.raises(OSError) as raised:
        for _ in range(10):
            with memoryview(source) as view:
                writer.write(view[1:])
        writer.finish()
    assert raised.value.errno == errno.ENOSPC
    source.close()  # the error's traceback holds no view of it
    writer.close()
    writer.close()  # twice is fine
    assert _open_fds() == before - 1


def test_giving_up_without_finish_stops_the_thread(tmp_path: Path, small_buffers: int) -> None:
    writer = _writer(tmp_path / "out")
    writer.write(bytes(3 * small_buffers + 5))
    writer.close()
    assert not writer._thread.is_alive()
    with pytest.raises(ValueError, match="closed"):
        writer.write(b"x")
