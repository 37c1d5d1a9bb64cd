"""The store interface, and what every store shares: URI helpers, listing entries, hashing wrappers and
the one conversion between hex SHA-256 digests and the base64 checksums S3 sends and verifies.

A store handles the URIs of one scheme (a local path, ``s3://bucket/key``); ``Storage`` picks the store
for a URI and delegates to it. Every URI a store receives is of its own scheme.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, BinaryIO

from ..errors import StorageError

S3_SCHEME = "s3://"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(unsafe_hash=True)  # not frozen: a frozen dataclass costs microseconds per listed file
class FileInfo:
    """A file or object found by a listing; ``key`` is relative to the listed URI.

    With ``iter_files(..., everything=True)`` a listing also yields what is not a regular file
    (``kind``: symlink, fifo, device, socket, other, or folder_marker for an empty S3 ``key/``) and
    entries that cannot be candidates at all (``problem``: a reject reason, with ``detail``).
    """

    key: str
    size: int
    modified: datetime | None  # None: a local file, whose ``stamp`` holds the time (``modified_at``)
    kind: str = "file"
    problem: str = ""
    detail: str = ""
    stamp: str = ""  # what changes when the content may have: mtime in ns locally, the ETag on S3

    def modified_at(self) -> datetime:
        """When it was last modified: ``modified``, or for a local file listed without it (a ``datetime`` a file
        is a measurable part of listing 100,000 files) its mtime from ``stamp``, to the microsecond."""
        if self.modified is not None:
            return self.modified
        return EPOCH + timedelta(microseconds=int(self.stamp) // 1000)


def is_s3(uri: str) -> bool:
    return uri.startswith(S3_SCHEME)


def join(uri: str, *parts: str) -> str:
    """Join URI parts with ``/`` (for S3 and local paths alike)."""
    out = uri.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}" if part else out
    return out


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise StorageError(f"no bucket in {uri!r}")
    return bucket, key


# -- checksums: hex SHA-256 digests (manifests, receipts) <-> S3's base64 ChecksumSHA256 -----------
def to_s3_checksum(sha256_hex: str) -> str:
    """The ``ChecksumSHA256`` value (base64 of the digest bytes) for a hex SHA-256 digest."""
    return base64.b64encode(bytes.fromhex(sha256_hex)).decode()


def from_s3_checksum(checksum: str | None) -> str | None:
    """The hex SHA-256 digest of an object's ``ChecksumSHA256``; None when there is none, or when it is
    a multipart upload's checksum of checksums (``...-N``), which is not the digest of the content."""
    if not checksum or "-" in checksum:
        return None
    return base64.b64decode(checksum).hex()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


HASH_CHUNK = 8 << 20
MAPPED_CHUNK = 4 << 20  # a mapped pass's chunk (``mapped_chunks``): how often it asks whether to stop


def sha256_file(path: str) -> str:
    """What the file at ``path`` hashes to (``sha256_read``)."""
    with open(path, "rb", buffering=0) as f:
        return sha256_read(f)[0].hexdigest()


def read_chunks(file: BinaryIO, stopped: Callable[[], bool] = lambda: False,
                chunk: int = HASH_CHUNK) -> Iterator[memoryview]:
    """What the unbuffered ``file`` holds from where it is to its end, read into one buffer in chunks of up to
    ``chunk`` bytes (each chunk is valid until the next is asked for); ``stopped()``, asked before each read, ends it
    early. A read error is an ``OSError``, never a SIGBUS (as under a map)."""
    buffer = bytearray(max(1, min(chunk, os.fstat(file.fileno()).st_size + 1)))
    with memoryview(buffer) as view:
        while not stopped() and (size := file.readinto(buffer)):
            yield view[:size]


def mapped_chunks(file: BinaryIO, stopped: Callable[[], bool] = lambda: False,
                  chunk: int = HASH_CHUNK) -> Iterator[memoryview]:
    """``read_chunks`` without the copy: the file's bytes from the page cache, mapped, in chunks of up to ``chunk``
    bytes, as far as its size when called (the prover's passes over base shards: the copy out of the page cache
    was a sixth of their CPU). Like every map of a file, a file cut short while it is mapped is a SIGBUS, not an
    error: for files a build does not expect to change (a published version's shards, which the splices map too)."""
    import mmap

    size = os.fstat(file.fileno()).st_size
    if not size:
        return
    mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
    view = memoryview(mapped)
    try:
        with contextlib.suppress(AttributeError, OSError):  # (no madvise here)
            mapped.madvise(mmap.MADV_SEQUENTIAL)
        at = 0
        while at < min(size, len(view)) and not stopped():
            yield view[at:at + chunk]
            at += chunk
    finally:
        view.release()
        with contextlib.suppress(BufferError):  # a chunk the caller still holds: unmapped once it lets go of it
            mapped.close()


def sha256_read(file: BinaryIO, stopped: Callable[[], bool] = lambda: False) -> tuple[Any, int]:
    """The SHA-256 (a ``hashlib`` object) of what the unbuffered ``file`` holds from where it is to its end, and
    the bytes read (``read_chunks``). ``hashlib`` hashes each 8 MiB chunk outside the GIL, and threads that hash
    side by side (the reuse stage's, the prover's beside the metadata stages) then seldom wait to take the GIL
    back while another thread runs Python, as they did after every 1 MiB read."""
    digest, read = hashlib.sha256(), 0
    for chunk in read_chunks(file, stopped):
        digest.update(chunk)
        read += len(chunk)
    return digest, read


class HashingWriter:
    """A binary file wrapper that hashes (SHA-256) and counts what is written through it."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.num_bytes += len(data)
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()


class HashingReader:
    """A binary stream wrapper that hashes (SHA-256) and counts what is read through it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.sha256.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self) -> None:
        """Read (and hash) whatever is left."""
        while self.read(1 << 20):
            pass


class Store(ABC):
    """Files under the URIs of one scheme. Writes are atomic: a reader sees the old content or the new one.

    Missing files: ``open_read`` (and ``read_bytes``) raise FileNotFoundError, ``exists`` is False,
    ``read_with_tag`` gives (None, None), ``delete`` and ``delete_tree`` do nothing.
    """

    def prime(self) -> None:  # noqa: B027 - most stores have nothing to prepare
        """Make any client now, before threads share the store (client factories are not thread-safe)."""

    def scratch_dir(self, uri: str) -> str | None:
        """A local folder on the same disk as ``uri``, made if needed, where a file can be written and then
        moved or linked into place without a copy; None for a remote store (use the system's temp folder)."""
        return None

    def prune(self, uri: str) -> None:  # noqa: B027 - object stores have no empty folders
        """Remove the folder ``uri`` if it is empty (nothing to do where folders are only key prefixes)."""

    def defer_sync(self, prefix: str) -> None:  # noqa: B027 - an object store's writes are durable when done
        """Let writes below ``prefix`` skip their own ``fsync`` until ``sync(prefix)`` (see ``Storage``)."""

    def is_deferred(self, uri: str) -> bool:
        """Whether writes to ``uri`` wait for ``sync`` to be durable."""
        return False

    def sync(self, prefix: str) -> None:  # noqa: B027 - nothing deferred: nothing to do
        """Make the writes below ``prefix`` whose ``fsync`` was deferred durable."""

    # -- listing ---------------------------------------------------------------------------------
    @abstractmethod
    def iter_files(self, uri: str, everything: bool = False) -> Iterator[FileInfo]:
        """Every file below ``uri`` (recursively), keys relative to it, in sorted order; ``everything``
        also yields the entries that are not regular files (see FileInfo). StorageError if ``uri`` cannot
        be listed."""

    def iter_file_runs(self, uri: str) -> Iterator[Any]:
        """``iter_files(uri, everything=True)``, where a store can, with stretches of plain regular files in one
        folder as one batch each (a local store's ``localfs.FileRun``): a listing's cost per file in bulk."""
        yield from self.iter_files(uri, everything=True)

    @abstractmethod
    def list_children(self, uri: str) -> tuple[list[str], list[str]]:
        """(sub-folder names, file names) directly below ``uri``, each sorted: one delimiter listing.
        Nothing below ``uri`` (or no such folder): two empty lists. Symlinks are never followed."""

    def list_dirs(self, uri: str) -> list[str]:
        """The names of the immediate sub-folders of ``uri``, sorted."""
        return self.list_children(uri)[0]

    # -- reading ---------------------------------------------------------------------------------
    @abstractmethod
    def open_source(self, source: str, key: str) -> AbstractContextManager[tuple[BinaryIO, int]]:
        """A source file's stream and its size (-1 when the listing knows it); a local file is opened
        confined to ``source`` (``localfs.NotARegularFile`` for anything but a regular file)."""

    @abstractmethod
    def exists(self, uri: str) -> bool:
        """True if ``uri`` is a file (an object)."""

    @abstractmethod
    def open_read(self, uri: str) -> AbstractContextManager[BinaryIO]:
        """A binary stream of the file (S3: the response body, not spooled to disk)."""

    def read_bytes(self, uri: str) -> bytes:
        with self.open_read(uri) as f:
            return f.read()

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        """``length`` bytes of the file from byte ``start`` (fewer only where the file ends first);
        FileNotFoundError if it does not exist. A store with ranged reads does better than this."""
        with self.open_read(uri) as f:
            f.read(start) if not f.seekable() else f.seek(start)
            return f.read(length)

    @abstractmethod
    def download(self, uri: str, path: str) -> str | None:
        """Copy ``uri`` to the local file ``path`` (streamed); a tag of the copied version where the store
        has one (S3: its ETag), else None."""

    @abstractmethod
    def sha256_of(self, uri: str) -> str | None:
        """The hex SHA-256 the store holds for (or hashes from) ``uri``; None if it has none."""

    def change_tag(self, uri: str) -> str | None:
        """A cheap tag that changes whenever the content may have (None if there is no such file): equal
        tags mean a checksum taken earlier still holds. The stored SHA-256 unless a store has cheaper."""
        return self.sha256_of(uri)

    @abstractmethod
    def read_with_tag(self, uri: str) -> tuple[bytes | None, str | None]:
        """Content and a version tag for ``write_if_unchanged``; (None, None) if absent."""

    # -- writing ---------------------------------------------------------------------------------
    @abstractmethod
    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write ``data`` to ``uri`` atomically (S3 verifies its SHA-256 on arrival)."""

    @abstractmethod
    def upload(self, path: str, uri: str, sha256: str) -> None:
        """Store the local file ``path``, whose hex SHA-256 is ``sha256``, at ``uri`` atomically."""

    @abstractmethod
    def write_if_unchanged(self, uri: str, data: bytes, tag: str | None) -> bool:
        """Write only if ``uri`` still has version ``tag`` (None: only if absent); False if it moved."""

    @abstractmethod
    def copy(self, src: str, dst: str, sha256: str | None = None) -> None:
        """Copy one file within this store (server-side or a hard link where possible); with ``sha256``,
        StorageError unless the copy has that digest."""

    @abstractmethod
    def delete(self, uri: str) -> None:
        """Delete one file or object."""

    @abstractmethod
    def delete_tree(self, uri: str) -> None:
        """Delete everything below ``uri``."""
