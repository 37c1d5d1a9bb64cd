"""``LocalStore``: files under local paths.

Listing and opening source files never follow a symlink (see ``localfs``). Every write goes to a
temporary name in the target's folder and is renamed over it; stored files are readable by everyone
(0644). A copy or an upload is a hard link where the file system allows one.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from ..errors import StorageError
from ..source import localfs
from .base import FileInfo, Store, sha256_bytes, sha256_file


class LocalStore(Store):
    """Files in local folders; URIs are paths."""

    def __init__(self) -> None:
        self._deferred: tuple[str, ...] = ()

    # -- listing ---------------------------------------------------------------------------------
    def iter_files(self, uri: str, everything: bool = False) -> Iterator[FileInfo]:
        for entry in self._walked(uri, localfs.walk):
            if everything or (entry.kind == "file" and not entry.problem):
                yield entry

    def iter_file_runs(self, uri: str) -> Iterator[FileInfo | localfs.FileRun]:
        return self._walked(uri, localfs.walk_runs)

    @staticmethod
    def _walked(uri: str, walk: Callable[[str], Iterator[Any]]) -> Iterator[Any]:
        if not os.path.isdir(uri):
            raise StorageError(f"{uri} is not a folder")
        try:
            yield from walk(uri)
        except PermissionError:
            raise StorageError(f"cannot read the folder {uri}: permission denied") from None

    def list_children(self, uri: str) -> tuple[list[str], list[str]]:
        if not os.path.isdir(uri):
            return [], []
        try:
            with os.scandir(uri) as it:
                entries = [e for e in it if not e.is_symlink()]
            return sorted(e.name for e in entries if e.is_dir()), sorted(e.name for e in entries if e.is_file())
        except PermissionError:
            raise StorageError(f"cannot read the folder {uri}: permission denied") from None

    # -- reading ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def open_source(self, source: str, key: str) -> Iterator[tuple[BinaryIO, int]]:
        """Opened confined to ``source``: no symlink is followed, and only a regular file is opened."""
        file, size = localfs.open_file(source, key)
        with file:
            yield file, size

    def exists(self, uri: str) -> bool:
        return os.path.isfile(uri)

    @contextlib.contextmanager
    def open_read(self, uri: str) -> Iterator[BinaryIO]:
        with open(uri, "rb") as f:
            yield f

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        fd = os.open(uri, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return os.pread(fd, length, start)
        finally:
            os.close(fd)

    def download(self, uri: str, path: str) -> str | None:
        shutil.copyfile(uri, path)
        return None

    def sha256_of(self, uri: str) -> str | None:
        """What the file hashes to; None if there is no such file."""
        return sha256_file(uri) if os.path.isfile(uri) else None

    def change_tag(self, uri: str) -> str | None:
        """Device, inode, size, mtime and ctime: a write, a truncation or a replacement changes one of them."""
        try:
            st = os.stat(uri)
        except FileNotFoundError:
            return None
        return f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"

    def read_with_tag(self, uri: str) -> tuple[bytes | None, str | None]:
        """Content and a tag of modification time and content hash; (None, None) if absent."""
        try:
            with open(uri, "rb") as f:  # mtime alone can miss a write in the same clock tick
                data = f.read()
                return data, f"{os.fstat(f.fileno()).st_mtime_ns}-{sha256_bytes(data)[:16]}"
        except FileNotFoundError:
            return None, None

    # -- writing ---------------------------------------------------------------------------------
    def write_bytes(self, uri: str, data: bytes) -> None:
        _atomic(uri, lambda f: f.write(data), durable=not self.is_deferred(uri))

    def upload(self, path: str, uri: str, sha256: str) -> None:
        """Hard-links ``path`` (a finished temporary file) into place where possible, else copies it."""
        durable = not self.is_deferred(uri)
        if durable:
            with open(path, "rb") as f:
                os.fsync(f.fileno())
        os.chmod(path, 0o644)  # temporary files are 0600; stored files are for every reader
        if not _link(path, uri):
            _atomic(uri, lambda f: _copy_into(path, f), durable=durable)

    # -- durability ------------------------------------------------------------------------------
    @property
    def deferred(self) -> tuple[str, ...]:
        """The folders whose writes wait for ``sync`` to be made durable."""
        return self._deferred

    def defer_sync(self, prefix: str) -> None:
        """A build's staging folder holds dozens of small files: one ``syncfs`` at the end of a task (or before
        the publish) makes them durable at the cost of one journal commit, where an ``fsync`` each costs one
        commit each (about a millisecond apiece)."""
        folder = os.path.abspath(prefix).rstrip("/") + "/"
        if folder not in self._deferred:
            self._deferred = (*self._deferred, folder)

    def sync(self, prefix: str) -> None:
        folder = os.path.abspath(prefix).rstrip("/") + "/"
        if not any(folder.startswith(d) or d.startswith(folder) for d in self._deferred):
            return
        target = prefix
        while target and not os.path.isdir(target):
            target = os.path.dirname(target.rstrip("/"))
        syncfs(target or ".")

    def is_deferred(self, uri: str) -> bool:
        return bool(self._deferred) and os.path.abspath(uri).startswith(self._deferred)

    def write_if_unchanged(self, uri: str, data: bytes, tag: str | None) -> bool:
        """Compare and write under an exclusive ``flock`` of the file's folder."""
        import fcntl

        directory = os.path.dirname(uri) or "."
        os.makedirs(directory, exist_ok=True)
        lock = os.open(directory, os.O_RDONLY)  # lock the folder: no stray lock file to publish
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _, current = self.read_with_tag(uri)
            if current != tag:
                return False
            _atomic(uri, lambda f: f.write(data))
            return True
        finally:
            os.close(lock)

    def copy(self, src: str, dst: str, sha256: str | None = None) -> None:
        """A hard link on one file system (the same file: nothing to check); else a byte copy, hashed on
        the way."""
        if _link(src, dst):
            return
        digest = hashlib.sha256()
        _atomic(dst, lambda f: _copy_into(src, f, digest))
        if sha256 is not None and digest.hexdigest() != sha256:
            raise StorageError(f"copy of {src} to {dst} has sha256 {digest.hexdigest()}, expected {sha256}")

    def delete(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(uri)

    def delete_tree(self, uri: str) -> None:
        shutil.rmtree(uri, ignore_errors=True)

    def scratch_dir(self, uri: str) -> str | None:
        os.makedirs(uri, exist_ok=True)
        return uri

    def prune(self, uri: str) -> None:
        with contextlib.suppress(OSError):
            os.rmdir(uri)


def _atomic(path: str, fill: Callable[[BinaryIO], object], durable: bool = True) -> None:
    """Write ``path`` through ``fill`` into a temporary file in its folder, fsync it (unless not ``durable``:
    a later ``syncfs`` does), rename it into place."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="-" + os.path.basename(path))
    try:
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; published files are for every reader
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _copy_into(src: str, f: BinaryIO, digest: Any = None) -> None:
    with open(src, "rb") as s:
        while chunk := s.read(1 << 20):
            f.write(chunk)
            if digest is not None:
                digest.update(chunk)


def _link(src: str, dst: str) -> bool:
    """Make ``dst`` a hard link to ``src``, atomically; False if the file system cannot (another disk)."""
    directory = os.path.dirname(dst) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(dst)}")
    try:
        os.link(src, tmp)
    except OSError:
        return False
    try:
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
    return True


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    """The C library's ``syncfs`` (Linux), or None."""
    try:
        call = ctypes.CDLL(None, use_errno=True).syncfs
    except (OSError, AttributeError):
        return None
    call.argtypes, call.restype = (ctypes.c_int,), ctypes.c_int
    return call  # type: ignore[no-any-return]


def syncfs(path: str) -> None:
    """Write every dirty page of the file system holding ``path`` (a file or folder) to disk and wait: Linux's
    ``syncfs``, whose failure (an I/O error writing back any file there) raises an ``OSError`` naming ``path``;
    ``os.sync`` where the C library has no ``syncfs`` (macOS)."""
    call = _syncfs()
    if call is None:
        os.sync()
        return
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if call(fd) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"syncfs failed: {os.strerror(error)}", path)
    finally:
        os.close(fd)
