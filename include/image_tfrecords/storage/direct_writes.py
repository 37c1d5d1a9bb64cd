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
"""

from __future__ import annotations

import contextlib
import mmap
import os
import queue
import threading
from collections.abc import Iterator
from typing import Any

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
    """``DirectWriter``'s calls on the ordinary descriptor ``fd`` alone: where ``O_DIRECT`` cannot be opened."""

    def __init__(self, fd: int, at: int = 0) -> None:
        self._fd, self._at = fd, at

    def write(self, data: Any, at: int) -> None:
        from ..shards.splice import write_all

        write_all(self._fd, data, at)
        self._at = at + len(memoryview(data))

    def close(self) -> int:
        return self._at


@contextlib.contextmanager
def direct_writer(path: str, fd: int, at: int = 0) -> Iterator[DirectWriter | OrdinaryWriter]:
    """A ``DirectWriter`` of the file at ``path`` (open as ``fd``), shut when the block ends (call ``close`` to
    finish its writes first); an ``OrdinaryWriter`` of ``fd`` where ``O_DIRECT`` cannot be opened."""
    try:
        writer = DirectWriter(path, fd, at)
    except OSError:
        yield OrdinaryWriter(fd, at)
        return
    try:
        yield writer
    finally:
        writer._shut()
