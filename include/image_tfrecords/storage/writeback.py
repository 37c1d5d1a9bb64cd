"""Start the kernel writing a file's dirty pages to disk without waiting for it (Linux ``sync_file_range``),
so that the ``fsync`` a durable write ends with finds little left to write: the disk works while the
process goes on hashing. Elsewhere (or if the call fails) nothing happens, and the ``fsync`` does it all.
And ``syncfs``: everything a build staged made durable at once (``Storage.defer_sync``); and ``copies_pages``: whether
a file system's ``copy_file_range`` is a copy of every page (no block sharing, no copy on a server)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import threading
from collections.abc import Callable
from typing import Any

SYNC_FILE_RANGE_WRITE = 2  # start writeback of the range's dirty pages; do not wait
# File systems whose copy_file_range copies page by page in the kernel: no reflinks, no copy on a server
PAGE_COPYING = frozenset({"ext2", "ext3", "ext4", "tmpfs", "f2fs", "jfs", "vfat", "exfat"})


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


def copies_pages(source: int, target: int) -> bool:
    """Whether ``os.copy_file_range`` from a file on device ``source`` to one on device ``target`` copies page by
    page: either is a file system that neither shares blocks nor copies on a server (``PAGE_COPYING``: ext4,
    tmpfs, ...). There a spliced shard's kept bytes are better written from the pass that hashes them. False
    where both share blocks or copy on a server (XFS, btrfs, NFS 4.2, ...) or are not known (not Linux, a device
    ``/proc/self/mountinfo`` does not list: a btrfs subvolume): the kernel may copy without reading them."""
    return any(file_system_type(os.major(device), os.minor(device)) in PAGE_COPYING for device in {source, target})


@functools.cache
def file_system_type(major: int, minor: int) -> str | None:
    """The type of the file system mounted from device ``major:minor`` (``/proc/self/mountinfo``); None when it
    is not listed or cannot be read."""
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as mounts:
            return mounted_type(mounts.read(), major, minor)
    except OSError:
        return None


def mounted_type(mountinfo: str, major: int, minor: int) -> str | None:
    """The file system type of device ``major:minor`` in the text of a ``mountinfo`` file (its third field is the
    device, the field after the `` - `` separator the type)."""
    wanted = f"{major}:{minor}"
    for line in mountinfo.splitlines():
        fields, _, rest = line.partition(" - ")
        parts = fields.split()
        if len(parts) >= 3 and parts[2] == wanted and rest.split():
            return rest.split()[0]
    return None
