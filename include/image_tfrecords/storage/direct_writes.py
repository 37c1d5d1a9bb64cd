"""Bulk writes that skip the page cache: the kept bytes a night copies into its new shards (4.65 GB at 100,000
images), written with ``O_DIRECT`` from a few reused, aligned buffers.

Written through the page cache, each of those bytes takes a page the kernel must find, fill, track as dirty and
write back; on this project's benchmark VM that cost 0.6-0.8 CPU-seconds a GB (2.4 GB buffered: 1.5-2.0 CPU-s and
0.9-1.2 GB/s; with ``O_DIRECT`` from 16 MiB buffers: 0.07 CPU-s and 2.0-2.4 GB/s, the same 2 cores), more where the
hypervisor must back each fresh page (a first touch of memory cost about 3 us a page there). ``DirectWriter`` takes a
file's bytes in order, copies them into aligned buffers (while they are still in the CPU's cache from the hashing
pass) and a thread of its own writes each full buffer with ``O_DIRECT`` while the caller goes on; the last partial
block goes through the file's ordinary descriptor. Where ``O_DIRECT`` is refused (a file system without it, an
alignment the device does not take) it writes through the ordinary descriptor instead, from then on: the same bytes.

The bytes are on the device when ``close`` returns, not yet durable (the device's cache, the file's size and
extents): the ``fsync`` or ``syncfs`` that ends a durable write covers them as it covers buffered writes. The new
shards are not left in the page cache: the next night reads its base from disk (the prover maps it). Reading it with
``O_DIRECT`` too was tried: on this VM one stream of 4 MiB direct reads came to 0.8-0.9 GB/s against 0.7-1.4 GB/s
for the kernel's read-ahead, and the additions-only 100,000-image night on a base not cached, which it was meant
for, took 6.07 and 6.75 s against 4.85 and 5.16 s mapped (runs a quarter of an hour apart, not taken in turns).

Direct writes pay where CPU or memory is short, not where cores and memory are to spare: they wait for the device
(1.2-1.7 GB/s on the lent 16-core machines, shared by every process), where buffered writes return at the speed of
memory and the disk catches up while the metadata stages run. On such a machine (125 GB free), with direct writes,
the copies ahead of the 20,000-image night did not finish before the splices needed them (0-1 of 9), and the write
stage took 0.50-0.65 s, the night 4.2-4.7x faster than ``--full`` (against 5.8-6.1x buffered, taking turns). So
``direct_writer`` writes directly only where ``page_cache_pays`` says no: fewer than ``SPARE_CORES`` cores, or less
memory available (free, or cache the kernel can drop) than the file's bytes plus an eighth of the machine's;
``IMAGE_TFRECORDS_DIRECT_WRITES`` (``auto``, ``always``, ``never``) decides instead where it is set. Buffered writes
end by asking the kernel to start writing them (``writeback``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

from .writeback import start_writeback

DIRECT_WRITES_ENV = "IMAGE_TFRECORDS_DIRECT_WRITES"  # auto (the default), always, never
SPARE_CORES = 4  # from this many cores on, the CPU that buffered writes take is not what a night lacks
BUFFER = 4 << 20  # bytes a direct write takes (a multiple of ALIGN)
BUFFERS = 3  # buffers in turn: one filling, the others written meanwhile
ALIGN = 4096  # the offsets and lengths of direct writes (the page size: at least any device's logical block)


class DirectWriter:
    """Sequential writes of a file from offset ``at``, through ``O_DIRECT`` (see the module); ``fd``: its ordinary
    descriptor (for the last partial block, and everything where ``O_DIRECT`` is refused). ``write(data, at)`` takes
    the next bytes (``at``: where they go, always where the previous ones ended); ``close()`` writes the rest and
    waits for every write (raising what one raised). ``OSError`` from the constructor: no direct writes here."""

    def __init__(self, path: str, fd: int, at: int = 0) -> None:
        if at % ALIGN:
            raise OSError(f"a direct write cannot begin at {at}")
        self._fd, self._at, self._fill, self._error, self._direct_ok = fd, at, 0, None, True
        self._direct = os.open(path, os.O_WRONLY | getattr(os, "O_DIRECT", 0) | getattr(os, "O_CLOEXEC", 0))
        if not getattr(os, "O_DIRECT", 0):
            os.close(self._direct)
            raise OSError("this system has no O_DIRECT")
        self._free: queue.Queue[mmap.mmap] = queue.Queue()
        for _ in range(BUFFERS):
            self._free.put(mmap.mmap(-1, BUFFER))  # page-aligned, reused: no fresh pages a write
        self._todo: queue.Queue[tuple[mmap.mmap, int, int] | None] = queue.Queue()
        self._buffer = self._free.get()
        self._thread = threading.Thread(target=self._run, name="direct-writes", daemon=True)
        self._thread.start()

    def write(self, data: Any, at: int) -> None:
        with memoryview(data) as view:
            if at != self._at + self._fill:
                raise ValueError(f"direct writes are sequential: {at} is not {self._at + self._fill}")
            done = 0
            while done < len(view):
                take = min(len(view) - done, BUFFER - self._fill)
                self._buffer[self._fill:self._fill + take] = view[done:done + take]
                self._fill += take
                done += take
                if self._fill == BUFFER:
                    self._hand_over(BUFFER)
                    self._buffer = self._free.get()

    def _hand_over(self, count: int) -> None:
        if self._error is not None:
            raise self._error
        self._todo.put((self._buffer, self._at, count))
        self._at += count
        self._fill -= count

    def _run(self) -> None:
        from ..shards.splice import write_all

        while (item := self._todo.get()) is not None:
            buffer, at, count = item
            try:
                if self._error is None:
                    with memoryview(buffer) as view:
                        if self._direct_ok:
                            try:
                                write_all(self._direct, view[:count], at)
                            except OSError:  # refused (EINVAL): the ordinary descriptor, from here on
                                self._direct_ok = False
                        if not self._direct_ok:
                            write_all(self._fd, view[:count], at)
            except Exception as exc:  # (told by the next write or close)
                self._error = exc
            finally:
                self._free.put(buffer)

    def close(self) -> int:
        """Write what is left (whole blocks directly, the rest through ``fd``), wait for every write; the bytes
        written in all. Raises the first error a write met."""
        from ..shards.splice import write_all

        try:
            whole = self._fill - self._fill % ALIGN
            tail = bytes(self._buffer[whole:self._fill])
            if whole:
                self._hand_over(whole)
            self._todo.put(None)
            self._thread.join()
            if self._error is not None:
                raise self._error
            if tail:
                write_all(self._fd, tail, self._at)
                self._at += len(tail)
                self._fill = 0
            return self._at
        finally:
            self._shut()

    def _shut(self) -> None:
        if self._thread.is_alive():
            self._todo.put(None)
            self._thread.join()
        with contextlib.suppress(OSError):
            os.close(self._direct)
        self._direct = -1
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                break
        with contextlib.suppress(BufferError):
            self._buffer.close()


class OrdinaryWriter:
    """``DirectWriter``'s calls on the ordinary descriptor ``fd`` alone (through the page cache): where buffered writes
    pay, or ``O_DIRECT`` cannot be opened. ``close`` asks the kernel to start writing the bytes out."""

    def __init__(self, fd: int, at: int = 0) -> None:
        self._fd, self._first, self._at = fd, at, at

    def write(self, data: Any, at: int) -> None:
        from ..shards.splice import write_all

        write_all(self._fd, data, at)
        self._at = at + len(memoryview(data))

    def close(self) -> int:
        if self._at > self._first:
            start_writeback(self._fd, self._first, self._at - self._first)
        return self._at


def _memory() -> tuple[int, int] | None:
    """(bytes available, bytes in all) of this machine's memory (``/proc/meminfo``'s MemAvailable: free, or cache the
    kernel can drop; and MemTotal), or None."""
    try:
        with open("/proc/meminfo", "rb") as f:
            fields = dict(line.split(b":", 1) for line in f.read().splitlines() if b":" in line)
        return int(fields[b"MemAvailable"].split()[0]) * 1024, int(fields[b"MemTotal"].split()[0]) * 1024
    except (OSError, KeyError, ValueError, IndexError):
        return None


def _cores() -> float:
    """The cores this process may use: those it may run on, fewer where its cgroup's quota allows less
    (``/sys/fs/cgroup/cpu.max``, as a container's CPU limit sets it)."""
    cores = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, int(quota) / max(1, int(period)))
    except (OSError, ValueError):
        pass
    return cores


def page_cache_pays(size: int) -> bool:
    """Whether ``size`` more bytes are better written through the page cache than with ``O_DIRECT`` here (see the
    module): ``IMAGE_TFRECORDS_DIRECT_WRITES`` where it says ``always`` or ``never``; else (``auto``) where this process
    may use ``SPARE_CORES`` cores or more (``_cores``), where the CPU that the page cache's work takes is to spare,
    and the memory available holds ``size`` bytes beside an eighth of the machine's (no memory pressure)."""
    choice = os.environ.get(DIRECT_WRITES_ENV, "auto").strip().lower()
    if choice in ("always", "never"):
        return choice == "never"
    memory = _memory() if _cores() >= SPARE_CORES else None
    return memory is not None and memory[0] >= size + memory[1] // 8


@contextlib.contextmanager
def direct_writer(path: str, fd: int, at: int = 0, size: int = 0,
                  direct: bool | None = None) -> Iterator[DirectWriter | OrdinaryWriter]:
    """A writer of the ``size`` bytes (about) that go into the file at ``path`` (open as ``fd``) from ``at``, shut when
    the block ends (call ``close`` to finish its writes first): a ``DirectWriter`` where ``direct`` (None: unless
    ``page_cache_pays(size)``), else, and where ``O_DIRECT`` cannot be opened, an ``OrdinaryWriter`` of ``fd``."""
    writer = None
    if direct if direct is not None else not page_cache_pays(size):
        with contextlib.suppress(OSError):  # (no O_DIRECT here)
            writer = DirectWriter(path, fd, at)
    if writer is None:
        yield OrdinaryWriter(fd, at)
        return
    try:
        yield writer
    finally:
        writer._shut()
