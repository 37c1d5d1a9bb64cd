"""Start the kernel writing a file's dirty pages to disk without waiting for it (Linux ``sync_file_range``),
so that the ``fsync`` a durable write ends with finds little left to write: the disk works while the
process goes on hashing. Elsewhere (or if the call fails) nothing happens, and the ``fsync`` does it all.
And ``syncfs``: everything a build staged made durable at once (``Storage.defer_sync``)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

SYNC_FILE_RANGE_WRITE = 2  # start writeback of the range's dirty pages; do not wait


@functools.cache
def _sync_file_range() -> Callable[..., Any] | None:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        call = ctypes.CDLL(None, use_errno=True).sync_file_range
        call.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
        call.restype = ctypes.c_int
        return call  # type: ignore[no-any-return]
    return None


def start_writeback(fd: int, offset: int = 0, count: int = 0) -> bool:
    """Ask for ``count`` bytes from ``offset`` of the open file ``fd`` (0: to its end) to be written out now;
    False where that cannot be asked (not Linux, or the file cannot be duplicated). Never waits for the disk:
    the kernel holds the call itself while the disk's queue is full (nine 93 MB shards spliced at once on a
    16-core machine: 0.3-0.4 s each), so it is made on a thread of its own, on a duplicate of ``fd`` that
    the thread closes. What it has not written when a durable write ends is the ``fsync``'s or ``syncfs``'s."""
    call = _sync_file_range()
    if call is None:
        return False
    try:
        duplicate = os.dup(fd)
    except OSError:
        return False

    def write_out() -> None:
        try:
            call(duplicate, offset, count, SYNC_FILE_RANGE_WRITE)
        finally:
            os.close(duplicate)

    threading.Thread(target=write_out, name="writeback", daemon=True).start()
    return True


@functools.cache
def _syncfs() -> Callable[..., Any] | None:
    with contextlib.suppress(OSError, AttributeError, TypeError):
        call = ctypes.CDLL(None, use_errno=True).syncfs
        call.argtypes = (ctypes.c_int,)
        call.restype = ctypes.c_int
        return call  # type: ignore[no-any-return]
    return None


def syncfs(path: str) -> None:
    """Write every dirty page of the file system holding ``path`` (a file or folder) to disk and wait
    (Linux ``syncfs``; elsewhere, or if it fails, ``os.sync`` does it for every file system)."""
    call = _syncfs()
    if call is not None:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if call(fd) == 0:
                return
        finally:
            os.close(fd)
    os.sync()
