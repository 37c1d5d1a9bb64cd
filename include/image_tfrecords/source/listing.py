"""Find the candidate images under a source and their labels.

Two layouts: one folder per class (the label is the first folder below the root; deeper folders
are fine), or a ``labels.csv`` in the root with columns ``filename,label``. Files that are not
images by name (hidden files, ``Thumbs.db``, text) and entries that are not regular files
(symlinks, FIFOs, devices, sockets; S3 folder markers) are skipped and counted by kind; image files
without a label, labels.csv rows that point nowhere or do not parse, names that are not UTF-8,
unreadable folders, too-deep paths and S3 keys that are not clean relative paths become rejects
with a reason. One bad entry never stops the listing.
"""

from __future__ import annotations

import csv
import hashlib
import io
import posixpath
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from ..errors import BuildError
from ..options import DEFAULT_SEPARATOR
from ..records.columns import BadValue, label_set, normal_value
from ..storage import FileInfo, Storage, StorageError, is_s3, join
from ..storage.documents import read_rows
from .localfs import MAX_KEY_BYTES, FileRun, NotARegularFile, is_clean_name

LABELS_FILE = "labels.csv"
MAX_CSV_FIELD = 1 << 20  # a labels.csv field longer than this makes its row a reject (bad_row)
DISCOVERED_FIELDS = ("filename", "label", "num_bytes", "stamp")  # discovered.csv: the candidates to inspect
MODERN_EXTENSIONS = frozenset({".heic", ".heif", ".hif", ".avif", ".jxl"})  # skipped with modern_formats off
IMAGE_EXTENSIONS = frozenset({".jpg", ".jpeg", ".jpe", ".jfif", ".png", ".gif", ".bmp", ".webp", ".tif", ".tiff",
                              ".heic", ".heif", ".hif", ".avif", ".jxl"})


@dataclass(unsafe_hash=True)  # not frozen: a frozen dataclass costs microseconds per listed file
class Candidate:
    """A file to inspect (``label`` set) or to reject (``reason`` set)."""

    filename: str
    label: str = ""
    num_bytes: int = 0
    reason: str = ""
    detail: str = ""
    stamp: str = ""  # the listing's modification stamp (FileInfo.stamp): inspection reuse compares it
    values: tuple[str, ...] = ()  # labels.csv: the declared metadata columns' values, in normal form
    group: str = ""  # labels.csv: the group column's value (stripped), which keys the split when not empty


class CandidateRun(NamedTuple):
    """Candidates of one class folder, next to each other in the listing (``discover(..., runs=True)``): each of
    ``files``' names, with its size and stamp, is a ``Candidate(files.prefix + name, label, size, stamp=stamp)``."""

    label: str
    files: FileRun

    def candidates(self) -> Iterator[Candidate]:
        prefix, label = self.files.prefix, self.label
        for name, size, stamp in zip(self.files.names, self.files.sizes, self.files.stamps, strict=True):
            yield Candidate(prefix + name, label, size, stamp=stamp)


@dataclass
class DiscoveryCounts:
    layout: str = "folders"
    multi_label: bool = False  # labels.csv with a ``labels`` column: several classes per image
    listed: int = 0
    skipped: int = 0
    after_cutoff: int = 0
    skipped_by_kind: Counter[str] = field(default_factory=Counter)  # symlink, fifo, ..., not_an_image_name
    fingerprint: Any = field(default_factory=hashlib.sha256)  # of every (name, size, mtime, kind) listed

    def skip(self, kind: str) -> None:
        self.skipped += 1
        self.skipped_by_kind[kind] += 1


def looks_like_image(filename: str, modern: bool = True) -> bool:
    """True for names with an image extension (any case), not hidden and not in a hidden folder; with
    ``modern`` False, HEIC/HEIF, AVIF and JPEG XL names are not images."""
    if filename.startswith(".") or "/." in filename:  # a hidden file, or one in a hidden folder
        return False
    dot = filename.rfind(".")
    if dot <= filename.rfind("/") + 1:  # as posixpath.splitext: ".jpg" alone has no extension
        return False
    extension = filename[dot:].lower()
    return extension in IMAGE_EXTENSIONS and (modern or extension not in MODERN_EXTENSIONS)


def _image_name(name: str, modern: bool) -> bool:
    """``looks_like_image(prefix + name, modern)`` for a ``name`` in a folder whose key ``prefix`` (``"a/b/"``) has no
    hidden folder in it."""
    dot = name.rfind(".")
    if dot <= 0 or name.startswith("."):  # no extension, or a hidden file
        return False
    extension = name[dot:].lower()
    return extension in IMAGE_EXTENSIONS and (modern or extension not in MODERN_EXTENSIONS)


def _skip_kind(filename: str) -> str:
    """How a file that is not taken as an image is counted."""
    if posixpath.splitext(filename)[1].lower() in MODERN_EXTENSIONS and looks_like_image(filename):
        return "modern_format_off"
    return "not_an_image_name"


def discover(storage: Storage, source: str, counts: DiscoveryCounts | None = None,
             cutoff: datetime | None = None, columns: dict[str, str] | None = None,
             separator: str = DEFAULT_SEPARATOR, modern_formats: bool = True,
             group_column: str = "", runs: bool = False) -> Iterator[Candidate | CandidateRun]:
    """Yield every candidate under ``source`` in a stable order; fill ``counts`` as it goes.

    With a ``cutoff``, files modified after it are ignored (counted in ``after_cutoff``): the source
    as it was at that time, for scheduled runs and backfills. ``columns``: labels.csv columns to keep
    as features (``columns``), checked per row; a ``labels`` column makes the rows multi-label (class
    names split on ``separator``, the candidate's label is the sorted set joined by it).
    ``modern_formats`` False skips HEIC/HEIF, AVIF and JPEG XL names (counted as ``modern_format_off``).
    ``group_column``: the labels.csv column whose value each candidate carries as its ``group``. ``runs``: a
    class folder's files listed next to each other come as one ``CandidateRun`` (local folders, without a cutoff:
    the same candidates, in the same order, at a few list operations each).
    """
    counts = counts if counts is not None else DiscoveryCounts()
    labels_uri = join(source, LABELS_FILE)
    if _has_labels_file(storage, source, labels_uri):
        counts.layout = "labels.csv"
        yield from _from_labels_file(storage, source, labels_uri, counts, cutoff, columns or {}, separator,
                                     modern_formats, group_column)
    else:
        if group_column:
            raise BuildError(f"group_column {group_column} is a column of a labels.csv, and {source} has none "
                             "(it is read as one folder per class)")
        if columns:
            raise BuildError(f"columns {', '.join(columns)} are read from a labels.csv, and {source} has none "
                             "(it is read as one folder per class)")
        found = _from_folders(storage, source, counts, cutoff, modern_formats)
        yield from found if runs else _each(found)


def _each(found: Iterator[Candidate | CandidateRun]) -> Iterator[Candidate]:
    for candidate in found:
        if isinstance(candidate, CandidateRun):
            yield from candidate.candidates()
        else:
            yield candidate


def _has_labels_file(storage: Storage, source: str, labels_uri: str) -> bool:
    """True if the source has a labels.csv; a local one must be a regular file (never followed)."""
    if is_s3(source):
        return storage.exists(labels_uri)
    try:
        with storage.open_source(source, LABELS_FILE):
            return True
    except FileNotFoundError:
        return False
    except NotARegularFile as exc:
        raise StorageError(f"{labels_uri} is not a regular file ({exc.detail}): replace it with the file itself") \
            from None
    except OSError as exc:
        raise StorageError(f"cannot read {labels_uri}: {exc.strerror or exc}") from None


def bad_key(key: str) -> str:
    """Why an S3 key (relative to the source) cannot be a clean relative path, or ``""``.

    Keys are taken verbatim: ``a//x.png`` is never read as ``a/x.png``, another object."""
    parts = key.split("/")
    if any(part == "" for part in parts):
        return "empty path segment ('//', a leading or a trailing '/')"
    if any(part in (".", "..") for part in parts):
        return "'.' or '..' path segment"
    if "\x00" in key:
        return "NUL character in the key"
    if len(key.encode()) > MAX_KEY_BYTES:
        return f"key is longer than {MAX_KEY_BYTES} bytes"
    return ""


def _entries(storage: Storage, source: str, counts: DiscoveryCounts, cutoff: datetime | None,
             runs: bool = False) -> Iterator[FileInfo | Candidate | FileRun]:
    """The listed regular files (FileInfo; with ``runs``, a folder's stretch of them as one FileRun: on S3, and in a
    local folder where there is no cutoff) and the rejects of what cannot be read (Candidate); other kinds are
    counted as skipped.
    (``DiscoveryCounts.see`` inline: this runs once a listed file.)"""
    s3 = is_s3(source)
    fingerprint = counts.fingerprint.update
    listed = 0
    found = storage.iter_file_runs(source) if runs and (s3 or cutoff is None) else \
        storage.iter_files(source, everything=True)
    try:
        for info in _checked_runs(found, cutoff) if runs and s3 else found:
            if type(info) is FileRun:  # each as the loop below has it: a local file's stamp is its mtime in ns,
                listed += len(info.names)  # an S3 object's time is its listed one
                prefix = info.prefix
                times = info.stamps if info.modified is None else [when.isoformat() for when in info.modified]
                fingerprint("".join([f"{prefix}{name}\0{size}\0{when}\0file\0\n" for name, size, when in
                                     zip(info.names, info.sizes, times, strict=True)]).encode())
                yield info
                continue
            key, modified, problem = info.key, info.modified, info.problem
            if cutoff is not None and info.modified_at() > cutoff and not problem:
                counts.after_cutoff += 1
                continue
            listed += 1
            # a local file's time as its stamp (mtime in ns), any other's as the listing gives it
            when = info.stamp if modified is None else modified.isoformat()
            fingerprint(f"{key}\0{info.size}\0{when}\0{info.kind}\0{problem}\n".encode())
            if problem:
                yield Candidate(key, num_bytes=info.size, reason=problem, detail=info.detail)
            elif info.kind != "file":
                counts.skip(info.kind)
            elif s3 and (why := bad_key(key)):
                yield Candidate(key, num_bytes=info.size, reason="bad_key", detail=why)
            else:
                yield info
    finally:
        counts.listed += listed


def _checked_runs(found: Iterator[Any], cutoff: datetime | None) -> Iterator[Any]:
    """An S3 listing's FileRuns as they are where every key is clean (``bad_key``) and none was modified after
    ``cutoff``; others as a FileInfo each (the per-file path sorts them out)."""
    for info in found:
        if type(info) is FileRun and (not _clean_run(info) or (cutoff is not None and max(info.modified) > cutoff)):
            prefix = info.prefix
            for name, size, stamp, when in zip(info.names, info.sizes, info.stamps, info.modified, strict=True):
                yield FileInfo(prefix + name, size, when, stamp=stamp)
        else:
            yield info


def _clean_run(run: FileRun) -> bool:
    """Whether ``bad_key`` finds nothing wrong with any key of ``run`` (names without ``/`` in one folder), in bulk."""
    names = run.names
    if bad_key(run.prefix + "x") or "" in names or "." in names or ".." in names or "\x00" in "".join(names):
        return False
    room = MAX_KEY_BYTES - len(run.prefix.encode())
    return max(map(len, names)) * 4 <= room or all(len(name.encode()) <= room for name in names)


def _from_folders(storage: Storage, source: str, counts: DiscoveryCounts,
                  cutoff: datetime | None, modern: bool) -> Iterator[Candidate | CandidateRun]:
    for info in _entries(storage, source, counts, cutoff, runs=True):
        if isinstance(info, Candidate):
            yield info
        elif type(info) is FileRun:
            yield from _run_candidates(info, counts, modern)
        else:
            yield from _file_candidate(info.key, info.size, info.stamp, counts, modern)


def _file_candidate(key: str, size: int, stamp: str, counts: DiscoveryCounts, modern: bool) -> Iterator[Candidate]:
    """A listed regular file in a folder layout: a candidate, a reject (an image in the source root), or skipped."""
    slash = key.find("/")
    if not looks_like_image(key, modern):
        counts.skip(_skip_kind(key))
    elif slash < 0:
        yield Candidate(key, num_bytes=size, reason="no_label",
                        detail="image in the source root: put it in a class folder")
    else:
        yield Candidate(key, key[:slash], size, stamp=stamp)


def _run_candidates(run: FileRun, counts: DiscoveryCounts, modern: bool) -> Iterator[Candidate | CandidateRun]:
    """``_file_candidate`` of each file of ``run``: its images as one CandidateRun of the class the folder is in."""
    prefix = run.prefix
    if not prefix or prefix.startswith(".") or "/." in prefix:  # the source root, or a hidden folder: one by one
        for name, size, stamp in zip(run.names, run.sizes, run.stamps, strict=True):
            yield from _file_candidate(prefix + name, size, stamp, counts, modern)
        return
    images = [_image_name(name, modern) for name in run.names]
    if not all(images):
        for name, image in zip(run.names, images, strict=True):
            if not image:
                counts.skip(_skip_kind(prefix + name))
        run = FileRun(prefix, *([value for value, image in zip(values, images, strict=True) if image]
                                for values in (run.names, run.sizes, run.stamps)))
    if run.names:
        yield CandidateRun(prefix[:prefix.find("/")], run)


def _safe_relative(filename: str) -> str | None:
    """The normalised relative path, or None if it is absolute or leaves the root."""
    if not filename or filename.startswith("/") or "\\" in filename or "\x00" in filename:
        return None
    normal = posixpath.normpath(filename)
    if normal.startswith("../") or normal in ("..", "."):
        return None
    return normal


def _metadata(row: dict[str, str], columns: dict[str, str], separator: str) -> tuple[tuple[str, ...], str]:
    """The row's metadata values in normal form, and why not (``""`` when they are all good)."""
    values = []
    for name, kind in columns.items():
        try:
            values.append(normal_value(kind, row.get(name), separator))
        except BadValue as exc:
            return (), f"{name}: {exc}"
    return tuple(values), ""


def _from_labels_file(storage: Storage, source: str, labels_uri: str, counts: DiscoveryCounts,
                      cutoff: datetime | None, columns: dict[str, str], separator: str,
                      modern: bool, group_column: str = "") -> Iterator[Candidate]:
    sizes, stamps = {}, {}
    for info in _entries(storage, source, counts, cutoff):
        if isinstance(info, Candidate):
            yield info
        else:
            sizes[info.key], stamps[info.key] = info.size, info.stamp
    seen: set[str] = set()
    with _labels_rows(storage, source, labels_uri) as reader:
        try:
            header = reader.fieldnames
        except csv.Error as exc:
            raise BuildError(f"{labels_uri} has no readable header: {exc}") from None
        found = ",".join(header or []) or "nothing"
        if not header or "filename" not in header or not {"label", "labels"} & set(header):
            raise BuildError(f"{labels_uri} must have a header with columns filename,label (found: {found}); a "
                             "labels column in place of label gives several classes per image")
        if {"label", "labels"} <= set(header):
            raise BuildError(f"{labels_uri} has both a label and a labels column: keep label (one class per image) "
                             "or labels (several)")
        if missing := [name for name in columns if name not in header]:
            raise BuildError(f"{labels_uri} has no column {', '.join(missing)}, which columns declares "
                             f"(found: {found})")
        if group_column and group_column not in header:
            raise BuildError(f"{labels_uri} has no column {group_column}, which group_column names (found: {found})")
        counts.multi_label = "labels" in header
        for row in _parsed_rows(reader):
            if isinstance(row, Candidate):
                yield row
                continue
            raw = row.get("filename") or ""
            if counts.multi_label:
                label = separator.join(label_set(row.get("labels"), separator))
            else:
                label = (row.get("label") or "").strip()
            filename = _safe_relative(raw)
            if filename is None:
                yield Candidate(raw, reason="bad_path", detail="path is empty, absolute or outside the source")
            elif filename in seen:
                yield Candidate(filename, reason="duplicate_row", detail=f"listed more than once in {LABELS_FILE}")
            elif not modern and not looks_like_image(filename, modern) and looks_like_image(filename):
                seen.add(filename)
                counts.skip("modern_format_off")
            elif filename not in sizes:
                yield Candidate(filename, reason="missing_file", detail=f"listed in {LABELS_FILE} but not found")
            else:
                seen.add(filename)
                values, why = _metadata(row, columns, separator)
                if not label:
                    yield Candidate(filename, num_bytes=sizes[filename], reason="no_label", detail="empty label")
                elif why:
                    yield Candidate(filename, num_bytes=sizes[filename], reason="bad_metadata", detail=why)
                else:
                    yield Candidate(filename, label=label, num_bytes=sizes[filename], stamp=stamps[filename],
                                    values=values, group=(row.get(group_column) or "").strip() if group_column else "")
    for filename, size in sizes.items():
        if filename == LABELS_FILE or filename in seen:
            continue
        if looks_like_image(filename, modern):
            yield Candidate(filename, num_bytes=size, reason="no_label", detail=f"not listed in {LABELS_FILE}")
        else:
            counts.skip(_skip_kind(filename))


@contextmanager
def _labels_rows(storage: Storage, source: str, uri: str) -> Iterator[csv.DictReader[str]]:
    """The labels.csv rows: locally read confined to the source (never through a symlink), from S3
    spooled to disk; text that is not UTF-8 is kept (surrogate-escaped) so its row is rejected alone."""
    csv.field_size_limit(MAX_CSV_FIELD)
    if is_s3(source):
        with read_rows(storage, uri, errors="surrogateescape") as reader:
            yield reader
        return
    with storage.open_source(source, LABELS_FILE) as (stream, _):
        yield csv.DictReader(io.TextIOWrapper(stream, encoding="utf-8-sig", errors="surrogateescape", newline=""))


def _parsed_rows(reader: csv.DictReader[str]) -> Iterator[dict[str, str] | Candidate]:
    """Each row, or a ``bad_row`` reject for one that does not parse (an oversized field) or is not UTF-8."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            yield Candidate(f"{LABELS_FILE}:{reader.line_num}", reason="bad_row",
                            detail=f"row does not parse ({exc}); the rows after it are read")
            continue
        text = "\0".join(str(v) for v in row.values() if v is not None)
        if not is_clean_name(text):
            yield Candidate(f"{LABELS_FILE}:{reader.line_num}", reason="bad_row", detail="row is not valid UTF-8")
            continue
        yield row

