"""Find the candidate images under a source and their labels.

Two layouts: one folder per class (the label is the first folder below the root; deeper folders
are fine), or a ``labels.csv`` in the root with columns ``filename,label``. Files that are not
images by name (hidden files, ``Thumbs.db``, text) are skipped and counted; image files without a
label, and labels.csv rows that point nowhere, become rejects with a reason.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .csvio import read_rows
from .storage import FileInfo, Storage, join

LABELS_FILE = "labels.csv"
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff"})


@dataclass(frozen=True)
class Candidate:
    """A file to inspect (``label`` set) or to reject (``reason`` set)."""

    filename: str
    label: str = ""
    num_bytes: int = 0
    reason: str = ""
    detail: str = ""


@dataclass
class DiscoveryCounts:
    layout: str = "folders"
    listed: int = 0
    skipped: int = 0
    after_cutoff: int = 0
    fingerprint: Any = field(default_factory=hashlib.sha256)  # of every (name, size, mtime) listed

    def see(self, info: FileInfo, cutoff: datetime | None) -> bool:
        """Count a listed file; False if it is newer than the snapshot cutoff (then it is ignored)."""
        if cutoff is not None and info.modified > cutoff:
            self.after_cutoff += 1
            return False
        self.listed += 1
        self.fingerprint.update(f"{info.key}\0{info.size}\0{info.modified.isoformat()}\n".encode())
        return True


def looks_like_image(filename: str) -> bool:
    """True for names with an image extension (any case), not hidden and not in a hidden folder."""
    if any(part.startswith(".") for part in filename.split("/")):
        return False
    return posixpath.splitext(filename)[1].lower() in IMAGE_EXTENSIONS


def discover(storage: Storage, source: str, counts: DiscoveryCounts | None = None,
             cutoff: datetime | None = None) -> Iterator[Candidate]:
    """Yield every candidate under ``source`` in a stable order; fill ``counts`` as it goes.

    With a ``cutoff``, files modified after it are ignored (counted in ``after_cutoff``): the source
    as it was at that time, for scheduled runs and backfills.
    """
    counts = counts if counts is not None else DiscoveryCounts()
    labels_uri = join(source, LABELS_FILE)
    if storage.exists(labels_uri):
        counts.layout = "labels.csv"
        yield from _from_labels_file(storage, source, labels_uri, counts, cutoff)
    else:
        yield from _from_folders(storage, source, counts, cutoff)


def _from_folders(storage: Storage, source: str, counts: DiscoveryCounts,
                  cutoff: datetime | None) -> Iterator[Candidate]:
    for info in storage.iter_files(source):
        if not counts.see(info, cutoff):
            continue
        if not looks_like_image(info.key):
            counts.skipped += 1
        elif "/" not in info.key:
            yield Candidate(info.key, num_bytes=info.size, reason="no_label",
                            detail="image in the source root: put it in a class folder")
        else:
            yield Candidate(info.key, label=info.key.split("/", 1)[0], num_bytes=info.size)


def _safe_relative(filename: str) -> str | None:
    """The normalised relative path, or None if it is absolute or leaves the root."""
    if not filename or filename.startswith("/") or "\\" in filename or "\x00" in filename:
        return None
    normal = posixpath.normpath(filename)
    if normal.startswith("../") or normal in ("..", "."):
        return None
    return normal


def _from_labels_file(storage: Storage, source: str, labels_uri: str, counts: DiscoveryCounts,
                      cutoff: datetime | None) -> Iterator[Candidate]:
    sizes = {}
    for info in storage.iter_files(source):
        if counts.see(info, cutoff):
            sizes[info.key] = info.size
    seen: set[str] = set()
    with read_rows(storage, labels_uri) as reader:
        if not reader.fieldnames or not {"filename", "label"} <= set(reader.fieldnames):
            found = ",".join(reader.fieldnames or []) or "nothing"
            raise ValueError(f"{labels_uri} must have a header with columns filename,label (found: {found})")
        for row in reader:
            raw, label = (row.get("filename") or ""), (row.get("label") or "").strip()
            filename = _safe_relative(raw)
            if filename is None:
                yield Candidate(raw, reason="bad_path", detail="path is empty, absolute or outside the source")
            elif filename in seen:
                yield Candidate(filename, reason="duplicate_row", detail=f"listed more than once in {LABELS_FILE}")
            elif filename not in sizes:
                yield Candidate(filename, reason="missing_file", detail=f"listed in {LABELS_FILE} but not found")
            else:
                seen.add(filename)
                if label:
                    yield Candidate(filename, label=label, num_bytes=sizes[filename])
                else:
                    yield Candidate(filename, num_bytes=sizes[filename], reason="no_label", detail="empty label")
    for filename, size in sizes.items():
        if filename == LABELS_FILE or filename in seen:
            continue
        if looks_like_image(filename):
            yield Candidate(filename, num_bytes=size, reason="no_label", detail=f"not listed in {LABELS_FILE}")
        else:
            counts.skipped += 1
