"""Checks of the source and destination before any work starts: each failure is one clear line.

A destination that is a file, read-only, full or inside the source (where the next build would
ingest it as a new class) fails the build before anything is written, so the previous published
version and ``latest.json`` are untouched.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile

from ..config import BuildConfig
from ..storage import StorageError, is_s3, join, split_s3


def _inside(inner: str, outer: str) -> bool:
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def destination_inside_source(cfg: BuildConfig) -> bool:
    """True if published files would land under the source (local paths resolved, S3 by bucket and prefix)."""
    if is_s3(cfg.source) != is_s3(cfg.destination):
        return False
    if is_s3(cfg.source):
        (sbucket, sprefix), (dbucket, dprefix) = split_s3(cfg.source), split_s3(cfg.dataset_uri)
        return sbucket == dbucket and (not sprefix.strip("/") or _inside(dprefix.strip("/"), sprefix.strip("/")))
    return _inside(os.path.realpath(cfg.dataset_uri), os.path.realpath(cfg.source))


def os_error_line(exc: OSError, where: str) -> str:
    """One line for an OSError about a location (no traceback)."""
    what = exc.strerror or type(exc).__name__
    if exc.errno == errno.ENOSPC:
        what = "no space left on the device"
    name = exc.filename or where
    return f"{what}: {name}"


def check_locations(cfg: BuildConfig) -> None:
    """Raise StorageError with one line if the destination cannot take this build."""
    if destination_inside_source(cfg):
        raise StorageError(f"destination {cfg.dataset_uri} is inside the source {cfg.source}: the next build "
                           "would read the published files as images; pick a destination outside it")
    if is_s3(cfg.destination):
        return  # S3: the lock's conditional write is the first write and reports access problems
    path = cfg.destination
    probe = path
    while probe and not os.path.lexists(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "."
    if probe and not os.path.isdir(probe):
        raise StorageError(f"destination {cfg.destination}: {probe} is a file, not a folder")
    staging = os.path.dirname(cfg.staging_uri)
    try:
        os.makedirs(staging, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=staging, prefix=".probe-")
        try:
            os.write(fd, b"\0" * 4096)
            os.fsync(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    except OSError as exc:
        raise StorageError(f"cannot write to the destination: {os_error_line(exc, staging)}") from None
    with contextlib.suppress(OSError):  # leave no empty _staging/ behind a failed check... or a passed one
        os.rmdir(staging)


def check_temp_dir() -> None:
    """Raise StorageError if the temporary folder (TMPDIR) cannot take a small file."""
    where = tempfile.gettempdir()
    try:
        with tempfile.TemporaryFile() as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        raise StorageError(f"cannot write to the temporary folder (TMPDIR): {os_error_line(exc, where)}") from None


__all__ = ["check_locations", "check_temp_dir", "destination_inside_source", "join", "os_error_line"]
