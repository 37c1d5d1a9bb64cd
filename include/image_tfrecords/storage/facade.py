"""``Storage``: the one object callers use, for local paths and ``s3://bucket/key`` URIs alike.

It picks the store for each URI (``LocalStore`` or ``S3Store``, see ``base.Store`` for what each
operation promises) and delegates to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import Any, BinaryIO

from ..errors import StorageError
from .base import FileInfo, Store, is_s3, sha256_file
from .local import LocalStore
from .multipart import Segment
from .s3 import ClientFactory, S3Store, default_s3_client


class Storage:
    """Read, list and write files under local paths or ``s3://`` URIs.

    ``s3_client_factory`` makes the boto3 client (once, on first use; default: ``default_s3_client``).
    A Storage pickles without its client: each process makes its own.
    """

    def __init__(self, s3_client_factory: ClientFactory | None = None) -> None:
        self._factory = s3_client_factory or default_s3_client
        self._local = LocalStore()
        self._s3 = S3Store(self._factory)

    def __getstate__(self) -> dict[str, Any]:
        return {"_factory": self._factory, "_deferred": self._local.deferred}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._factory = state["_factory"]
        self._local = LocalStore()
        for prefix in state.get("_deferred", ()):
            self._local.defer_sync(prefix)
        self._s3 = S3Store(self._factory)

    def _store_for(self, uri: str) -> Store:
        return self._s3 if is_s3(uri) else self._local

    @property
    def s3(self) -> Any:
        """The boto3 client (made now if it was not yet)."""
        return self._s3.client

    def prime(self, uri: str) -> None:
        """Make the client ``uri`` needs now, before threads share this Storage (factories are not thread-safe)."""
        self._store_for(uri).prime()

    # -- listing ---------------------------------------------------------------------------------
    def iter_files(self, uri: str, everything: bool = False) -> Iterator[FileInfo]:
        """Every file below ``uri`` (recursively), keys relative to it, in sorted order.

        Local symlinks are never followed (see ``localfs``). By default only regular files are
        yielded; ``everything`` also yields the other entries a source listing must account for.
        """
        return self._store_for(uri).iter_files(uri, everything)

    def iter_file_runs(self, uri: str) -> Iterator[Any]:
        """``iter_files(uri, everything=True)`` with a local folder's stretches of plain regular files as one
        ``localfs.FileRun`` each (in the same order: the listing's fast path)."""
        return self._store_for(uri).iter_file_runs(uri)

    def list_dirs(self, uri: str) -> list[str]:
        """The immediate sub-folders of ``uri``, sorted (S3: one delimiter listing)."""
        return self._store_for(uri).list_dirs(uri)

    def list_children(self, uri: str) -> tuple[list[str], list[str]]:
        """(sub-folder names, file names) directly below ``uri``, sorted (S3: one delimiter listing)."""
        return self._store_for(uri).list_children(uri)

    # -- reading ---------------------------------------------------------------------------------
    def open_source(self, source: str, key: str) -> AbstractContextManager[tuple[BinaryIO, int]]:
        """A source file's stream and size (-1: S3, the listing knows it). Local files are opened confined
        to ``source``: no symlink is followed, and only a regular file is opened (``localfs.NotARegularFile``
        otherwise)."""
        return self._store_for(source).open_source(source, key)

    def exists(self, uri: str) -> bool:
        return self._store_for(uri).exists(uri)

    def read_bytes(self, uri: str) -> bytes:
        """The file's bytes; FileNotFoundError if it does not exist (local or S3 alike)."""
        return self._store_for(uri).read_bytes(uri)

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode("utf-8")

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        """``length`` bytes of the file from byte ``start`` (fewer where it ends first; S3: one ranged GET);
        FileNotFoundError if it does not exist."""
        return self._store_for(uri).read_range(uri, start, length)

    def open_read(self, uri: str) -> AbstractContextManager[BinaryIO]:
        """A binary stream of the file (S3: the response body, not spooled to disk); FileNotFoundError
        if it does not exist."""
        return self._store_for(uri).open_read(uri)

    def download(self, uri: str, path: str) -> str | None:
        """Copy ``uri`` to the local file ``path`` (streamed); the copied object's ETag on S3, else None."""
        return self._store_for(uri).download(uri, path)

    def compose(self, dst: str, segments: list[Segment], sha256: str, if_match: dict[str, str] | None = None
                ) -> int:
        """Write the S3 object ``dst`` from ``segments``, copying large ranges of other objects server-side
        (``S3Store.compose``); the bytes the store copied."""
        if not is_s3(dst):
            raise StorageError(f"compose writes S3 objects, not {dst}")
        return self._s3.compose(dst, segments, sha256, if_match)

    def sha256_of(self, uri: str) -> str | None:
        """The SHA-256 the store holds for an S3 object, or that a local file hashes to."""
        return self._store_for(uri).sha256_of(uri)

    def change_tag(self, uri: str) -> str | None:
        """A cheap tag that changes whenever the file's content may have (a stat locally, the stored SHA-256
        on S3); None if there is no such file."""
        return self._store_for(uri).change_tag(uri)

    def read_with_tag(self, uri: str) -> tuple[bytes | None, str | None]:
        """Content and a version tag (ETag or mtime) for compare-and-swap; (None, None) if absent."""
        return self._store_for(uri).read_with_tag(uri)

    # -- writing ---------------------------------------------------------------------------------
    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write ``data`` to ``uri`` atomically; S3 verifies its SHA-256 on arrival."""
        self._store_for(uri).write_bytes(uri, data)

    def upload(self, path: str, uri: str, sha256: str | None = None) -> None:
        """Store the local file ``path`` at ``uri`` atomically, verified by its SHA-256 (hashed here when not
        given, where the store checks it: a local store links the file, and has nothing to check)."""
        store = self._store_for(uri)
        store.upload(path, uri, sha256 or ("" if store is self._local else sha256_file(path)))

    def defer_sync(self, prefix: str) -> None:
        """Writes below ``prefix`` (a staging folder) skip their one-by-one ``fsync``: ``sync(prefix)`` makes
        them durable together, before anything that relies on them surviving a crash (the end of a task, the
        publish). Only local stores have anything to defer; a pickled Storage keeps the prefixes."""
        self._store_for(prefix).defer_sync(prefix)

    def is_deferred(self, uri: str) -> bool:
        """Whether a write to ``uri`` leaves its ``fsync`` to ``sync`` (see ``defer_sync``): a writer that
        fsyncs a file itself before storing it there can skip that too."""
        return self._store_for(uri).is_deferred(uri)

    def sync(self, prefix: str) -> None:
        """Make every write below ``prefix`` durable (see ``defer_sync``); nothing to do where none was deferred."""
        self._store_for(prefix).sync(prefix)

    def write_if_unchanged(self, uri: str, data: bytes, tag: str | None) -> bool:
        """Write only if ``uri`` still has version ``tag`` (None: only if absent); False if it moved."""
        return self._store_for(uri).write_if_unchanged(uri, data, tag)

    def copy(self, src: str, dst: str, sha256: str | None = None) -> None:
        """Copy one file within the same kind of storage: server-side on S3, a hard link on one local disk.

        With ``sha256``, the copy is checked against it (S3 hashes it server-side; a hard link is the same
        file; a local byte copy is hashed on the way) and StorageError is raised on a mismatch.
        """
        store = self._store_for(src)
        if self._store_for(dst) is not store:
            raise StorageError("copy between local and S3 storage is not supported")
        store.copy(src, dst, sha256)

    def delete(self, uri: str) -> None:
        """Delete one file or object; nothing happens if it does not exist."""
        self._store_for(uri).delete(uri)

    def delete_tree(self, uri: str) -> None:
        """Delete everything below ``uri``."""
        self._store_for(uri).delete_tree(uri)

    def scratch_dir(self, uri: str) -> str | None:
        """A local folder where files for ``uri`` can be written and then linked into place; None on S3."""
        return self._store_for(uri).scratch_dir(uri)

    def prune(self, uri: str) -> None:
        """Remove the local folder ``uri`` if it is empty (S3 has no empty folders)."""
        self._store_for(uri).prune(uri)
