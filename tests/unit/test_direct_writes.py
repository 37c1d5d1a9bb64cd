"""storage.direct_writes: bytes written through O_DIRECT buffers are the bytes given, whatever their pieces, a
system or file system that refuses O_DIRECT gets them through the ordinary descriptor, and the page cache is taken
where cores and memory are to spare (or IMAGE_TFRECORDS_DIRECT_WRITES says so)."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from image_tfrecords.storage import direct_writes
from image_tfrecords.storage.direct_writes import ALIGN, BUFFER, DirectWriter, OrdinaryWriter, direct_writer


def _pieces(seed: int, total: int) -> list[bytes]:
    rng = random.Random(seed)
    data = rng.randbytes(total)
    cuts = sorted(rng.sample(range(1, total), 40))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, total], strict=True)]


@pytest.mark.parametrize("total", [3 * BUFFER + 12_345, 2 * BUFFER, ALIGN - 1, 5 * ALIGN])
def test_the_file_holds_the_bytes_given_in_order(tmp_path: Path, total: int) -> None:
    pieces = _pieces(total, total)
    path = tmp_path / "out.bin"
    with open(path, "w+b") as out, direct_writer(str(path), out.fileno(), direct=True) as writer:
        if not isinstance(writer, DirectWriter):
            pytest.skip("this file system refuses O_DIRECT")
        at = 0
        for piece in pieces:
            writer.write(memoryview(piece), at)
            at += len(piece)
        assert writer.close() == total
        out.seek(total)
        out.write(b"tail")  # (a splice appends its new records through the ordinary descriptor)
    assert path.read_bytes() == b"".join(pieces) + b"tail"


def test_writes_out_of_order_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    with open(path, "w+b") as out, direct_writer(str(path), out.fileno(), direct=True) as writer:
        if not isinstance(writer, DirectWriter):
            pytest.skip("this file system refuses O_DIRECT")
        writer.write(b"abc", 0)
        with pytest.raises(ValueError, match="sequential"):
            writer.write(b"def", 4)


def test_no_o_direct_means_the_ordinary_descriptor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Refused at open (no writer: the caller writes itself) or at a write (the rest through the descriptor)."""
    path = tmp_path / "out.bin"
    real_open = os.open

    def refusing_open(name: str, flags: int, *args: int) -> int:
        if flags & getattr(os, "O_DIRECT", 0):
            raise OSError(22, "Invalid argument")
        return real_open(name, flags, *args)

    with monkeypatch.context() as patch:
        patch.setattr(direct_writes.os, "open", refusing_open)
        with open(path, "w+b") as out, direct_writer(str(path), out.fileno(), direct=True) as ordinary:
            assert isinstance(ordinary, OrdinaryWriter)
            ordinary.write(b"abc", 0)
            ordinary.write(b"def", 3)
            assert ordinary.close() == 6
        assert path.read_bytes() == b"abcdef"

    from image_tfrecords.shards.splice import write_all

    pieces = _pieces(7, 2 * BUFFER + 99)
    calls = []

    def refusing_write(fd: int, data: object, at: int) -> None:
        if fd == writer_fd[0]:
            calls.append(at)
            raise OSError(22, "Invalid argument")
        write_all(fd, data, at)

    writer_fd: list[int] = []
    monkeypatch.setattr("image_tfrecords.shards.splice.write_all", refusing_write)
    with open(path, "w+b") as out:
        try:
            writer = DirectWriter(str(path), out.fileno())
        except OSError:
            pytest.skip("this file system refuses O_DIRECT")
        writer_fd.append(writer._direct)
        at = 0
        for piece in pieces:
            writer.write(piece, at)
            at += len(piece)
        writer.close()
    assert calls == [0]  # refused once, then every byte through the ordinary descriptor
    assert path.read_bytes() == b"".join(pieces)


def _machine(monkeypatch: pytest.MonkeyPatch, cores: int, available: int, total: int) -> None:
    monkeypatch.delenv(direct_writes.DIRECT_WRITES_ENV, raising=False)
    monkeypatch.setattr(direct_writes, "_cores", lambda: float(cores))
    monkeypatch.setattr(direct_writes, "_memory", lambda: (available, total))


@pytest.mark.parametrize(("cores", "available", "size", "buffered"), [
    (16, 100 << 30, 1 << 30, True),  # cores and memory to spare: the disk catches up later
    (2, 100 << 30, 1 << 30, False),  # few cores: the CPU buffered writes take is what a night lacks
    (16, 3 << 30, (1 << 30) + 1, False),  # the memory available would not hold them beside an eighth of 16 GiB
    (16, 3 << 30, 1 << 20, True),
])
def test_buffered_writes_where_cores_and_memory_are_to_spare(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cores: int, available: int, size: int, buffered: bool) -> None:
    _machine(monkeypatch, cores, available, 16 << 30)
    assert direct_writes.page_cache_pays(size) is buffered
    path = tmp_path / "out.bin"
    with open(path, "w+b") as out, direct_writer(str(path), out.fileno(), size=size) as writer:
        if not buffered and not isinstance(writer, DirectWriter):
            pytest.skip("this file system refuses O_DIRECT")
        assert isinstance(writer, OrdinaryWriter) is buffered


def test_the_variable_decides_where_set(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, 2, 1 << 30, 16 << 30)
    assert not direct_writes.page_cache_pays(1)
    monkeypatch.setenv(direct_writes.DIRECT_WRITES_ENV, "never")
    assert direct_writes.page_cache_pays(1 << 40)
    _machine(monkeypatch, 64, 1 << 40, 1 << 40)
    assert direct_writes.page_cache_pays(1)
    monkeypatch.setenv(direct_writes.DIRECT_WRITES_ENV, " Always ")
    assert not direct_writes.page_cache_pays(1)
    monkeypatch.setenv(direct_writes.DIRECT_WRITES_ENV, "auto")
    assert direct_writes.page_cache_pays(1)


def test_no_memory_figures_means_direct_writes(monkeypatch: pytest.MonkeyPatch) -> None:
    _machine(monkeypatch, 16, 0, 0)
    monkeypatch.setattr(direct_writes, "_memory", lambda: None)
    assert not direct_writes.page_cache_pays(1)


def test_this_machines_memory_is_read() -> None:
    memory = direct_writes._memory()
    if memory is None:
        pytest.skip("no /proc/meminfo here")
    available, total = memory
    assert 0 < available <= total


def test_buffered_writes_start_the_disk_on_their_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, int]] = []
    monkeypatch.setattr(direct_writes, "start_writeback", lambda fd, at, count: asked.append((at, count)) or True)
    path = tmp_path / "out.bin"
    with open(path, "w+b") as out:
        out.write(b"head")
        writer = OrdinaryWriter(out.fileno(), 4)
        writer.write(b"abc", 4)
        writer.write(b"defg", 7)
        assert writer.close() == 11
        assert OrdinaryWriter(out.fileno(), 11).close() == 11  # nothing written: nothing asked
    assert asked == [(4, 7)]
    assert path.read_bytes() == b"headabcdefg"


def test_a_cgroup_quota_counts_as_fewer_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = open
    limits = {"cpu.max": "200000 100000\n"}

    def fake_open(name: str, *args: object, **kwargs: object) -> object:
        if str(name) == "/sys/fs/cgroup/cpu.max":
            if limits["cpu.max"] is None:
                raise FileNotFoundError(name)
            import io

            return io.StringIO(limits["cpu.max"])
        return real_open(name, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(direct_writes.os, "sched_getaffinity", lambda _pid: set(range(16)), raising=False)
    monkeypatch.setattr("builtins.open", fake_open)
    assert direct_writes._cores() == 2.0
    limits["cpu.max"] = "max 100000\n"
    assert direct_writes._cores() == 16.0
    limits["cpu.max"] = None
    assert direct_writes._cores() == 16.0
    limits["cpu.max"] = "garbage"
    assert direct_writes._cores() == 16.0
