"""What a build takes over from the version before it: inspections of unchanged files, and shards.

The *base* of a build is the previous published version (``layout.previous_version``: the newest
published version whose name sorts before this one's, so a backfill builds on the newest version
older than it). A build reuses

* the base's ``inspected.csv`` rows for files whose name, size and stamp (mtime in ns locally,
  the ETag on S3) are unchanged (but for ``RETRIED_REASONS`` rejects, which are read again), when
  the base was inspected by this release, from the same source, with the same ``max_file_mb`` and
  ``max_pixels``;
* the base's shards whose records are all still present and unchanged, when the base was built
  with the same splits, salt, compression and shard size.

``--full`` (CLI) or ``full_rebuild`` (DAG) turns both off. Lookups go through SQLite files in a
temporary folder, so memory stays flat however many files there are.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from typing import Any

from . import __version__, layout
from .config import BuildConfig
from .discovery import DISCOVERED_FIELDS
from .documents import read_rows
from .imaging import ImageOptions
from .manifest import RecordSchema
from .metadata import DEFAULT_SEPARATOR
from .storage import Storage, join

# inspected.csv: one row per file inspection read (images and rejects); ``reason`` is set for a reject
INSPECTION_FIELDS = ("filename", "num_bytes", "stamp", "sha256", "format", "width", "height", "channels",
                     "source_format", "transform", "encoded_sha256", "encoded_bytes", "reason", "detail")
# Rejects that say nothing of a file's content (it could not be read, or was swapped while listed):
# such a file is read again the next night even when its name, size and stamp are unchanged.
RETRIED_REASONS = ("unreadable", "not_a_regular_file")
COMPACTION_FACTOR = 1.5  # more shards than this times a full build's count: the build is a full rebuild
FULL_REBUILD = "rebuild in full (--full on the command line, full_rebuild in the DAG)"  # when a base is damaged


@dataclass(frozen=True)
class Base:
    """The published version a build starts from."""

    version: str
    uri: str
    manifest: dict[str, Any]

    @property
    def build(self) -> dict[str, Any]:
        return self.manifest.get("build") or {}


def base_of(cfg: BuildConfig, storage: Storage, previous: str | None) -> Base | None:
    """The base of this build (None for a first version or a full rebuild)."""
    if cfg.full or not previous:
        return None
    uri = join(cfg.dataset_uri, previous)
    return Base(previous, uri, layout.read_manifest(storage, uri))


def why_not_reuse_inspection(cfg: BuildConfig, base: Base | None) -> str:
    """Why the base's inspections cannot be taken over (``""`` when they can)."""
    if base is None:
        return "full rebuild" if cfg.full else "no previous version"
    if base.manifest.get("source") != cfg.source:
        return f"version {base.version} was built from another source"
    if base.build.get("inspector") != __version__:
        return f"version {base.version} was inspected by another release of image-tfrecords"
    params = base.manifest.get("params", {})
    if (params.get("max_file_mb"), params.get("max_pixels")) != (cfg.max_file_mb, cfg.max_pixels):
        return "max_file_mb or max_pixels changed"
    if params.get("modern_formats", True) != cfg.modern_formats:
        return "modern_formats changed"
    return ""


def why_not_reuse_shards(cfg: BuildConfig, base: Base | None, schema: RecordSchema) -> str:
    """Why the base's shards cannot be taken over (``""`` when they can): records of ``schema`` made by
    ``cfg``'s image options."""
    if base is None:
        return "full rebuild asked for" if cfg.full else "no previous version"
    params = base.manifest.get("params", {})
    if not base.build:
        return f"version {base.version} predates shard reuse (its labels.csv does not name shards)"
    if base.manifest.get("features") != schema.features():
        return f"version {base.version} has other record features"
    if base.manifest.get("image", ImageOptions().describe()) != cfg.image_options.describe():
        return f"image options changed since version {base.version}"
    if (base.manifest.get("columns", {}), base.manifest.get("label_separator", DEFAULT_SEPARATOR)) != \
            (cfg.columns, cfg.label_separator):
        return f"columns or label_separator changed since version {base.version}"
    for name in ("splits", "salt", "shard_size_mb"):
        if params.get(name) != getattr(cfg, name):
            return f"{name} changed since version {base.version}"
    if base.manifest.get("compression") != cfg.compression:
        return f"compression changed since version {base.version}"
    if not base.build.get("record_positions"):
        return f"version {base.version} predates spliced shards (its labels.csv does not give each record's place)"
    return ""


def missing_base_files(storage: Storage, base: Base) -> str:
    """What the base lacks of the files an incremental build reads (its labels.csv, any shard or
    ``.tfindex`` its manifest lists), as one phrase; ``""`` when it has them all. One listing."""
    files = set(storage.list_children(base.uri)[1])
    needed = [layout.LABELS] + [name for info in base.manifest.get("splits", {}).values()
                                for shard in info.get("shards", [])
                                for name in (shard["file"], layout.index_file(shard["file"]))]
    missing = [name for name in needed if name not in files]
    if not missing:
        return ""
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return f"version {base.version} is damaged: {missing[0]}{more} is missing"


def _database(folder: str, name: str, schema: str) -> sqlite3.Connection:
    db = sqlite3.connect(os.path.join(folder, name))
    db.execute("PRAGMA journal_mode = OFF")
    db.execute("PRAGMA synchronous = OFF")
    db.execute(schema)
    return db


class Inspections:
    """The discovered files, each with the base's inspection of it when name, size and stamp still match.

    ``all()`` gives ``(discovered row, previous inspected.csv row or None)`` in listing order;
    ``unread()`` gives the discovered rows that have none (the files to read), in the same order.
    Without a base (or its inspected.csv) every file is unread and nothing is loaded.
    """

    def __init__(self, storage: Storage, discovered: str, db: sqlite3.Connection | None) -> None:
        self._storage, self._discovered, self._db = storage, discovered, db

    def all(self) -> Iterator[tuple[dict[str, str], dict[str, str] | None]]:
        if self._db is None:
            with read_rows(self._storage, self._discovered) as rows:
                yield from ((row, None) for row in rows)
            return
        width = len(DISCOVERED_FIELDS)
        for found in self._db.execute(_JOIN + " ORDER BY d.number"):
            row = dict(zip(DISCOVERED_FIELDS, found[:width], strict=True))
            yield row, (dict(zip(INSPECTION_FIELDS, found[width:], strict=True)) if found[width] is not None else None)

    def unread(self) -> Iterator[dict[str, str]]:
        if self._db is None:
            with read_rows(self._storage, self._discovered) as rows:
                yield from rows
            return
        for found in self._db.execute(_JOIN + " WHERE p.filename IS NULL ORDER BY d.number"):
            yield dict(zip(DISCOVERED_FIELDS, found[: len(DISCOVERED_FIELDS)], strict=True))


_JOIN = ("SELECT d.filename, d.label, d.num_bytes, d.stamp, p.* FROM d LEFT JOIN p ON p.filename = d.filename "
         "AND p.num_bytes = d.num_bytes AND p.stamp = d.stamp AND d.stamp != '' "
         f"AND p.reason NOT IN ({', '.join(repr(r) for r in RETRIED_REASONS)})")


@contextmanager
def inspections(storage: Storage, base: Base | None, discovered: str, folder: str) -> Iterator[Inspections]:
    """``Inspections`` of the files listed in ``discovered`` against ``base`` (None: reuse nothing)."""
    uri = join(base.uri, layout.INSPECTED) if base else None
    if uri is None or not storage.exists(uri):
        yield Inspections(storage, discovered, None)
        return
    columns = ", ".join(f"{name} TEXT" for name in INSPECTION_FIELDS)
    with closing(_database(folder, "inspected.db", f"CREATE TABLE p ({columns}, PRIMARY KEY (filename))")) as db:
        db.execute("CREATE TABLE d (number INTEGER PRIMARY KEY, filename TEXT, label TEXT, num_bytes TEXT, stamp TEXT)")
        with read_rows(storage, uri) as rows:
            db.executemany(f"INSERT OR REPLACE INTO p VALUES ({', '.join('?' * len(INSPECTION_FIELDS))})",
                           (tuple(r.get(name) or "" for name in INSPECTION_FIELDS) for r in rows))
        with read_rows(storage, discovered) as rows:
            db.executemany("INSERT INTO d VALUES (?, ?, ?, ?, ?)",
                           ((n, *(r.get(name) or "" for name in DISCOVERED_FIELDS)) for n, r in enumerate(rows)))
        yield Inspections(storage, discovered, db)


def _keys(rows: Any, fields: tuple[str, ...]) -> Iterator[tuple[str, str, list[str]]]:
    """``(filename, key, values)`` of each row of a DictReader, read as plain lists (the hot path of a join
    over every record). The key is every field that decides a record's bytes (``fields``: the build's
    record fields): equal keys mean byte-identical records (under the same image options)."""
    names = rows.fieldnames or []
    columns = [names.index(name) if name in names else None for name in fields]
    if columns == list(range(len(fields))):  # labels.csv and records.csv: the record's fields first
        width = len(fields)
        for values in rows.reader:
            yield values[0], "\x1f".join(values[:width]), values
        return
    for values in rows.reader:
        fields = ["" if i is None or i >= len(values) else values[i] for i in columns]
        yield fields[0], "\x1f".join(fields), values


def survivors(storage: Storage, base: Base, records_uri: str, folder: str,
              fields: tuple[str, ...]) -> Iterator[tuple[int, str, int]]:
    """``(row number in records_uri, base shard file, place in it)`` of every record the base holds byte for
    byte (the place is -1 when the base's labels.csv does not give it).

    Joins this build's records with the base's labels.csv by file name and record key.
    """
    with closing(_database(folder, "records.db", "CREATE TABLE cur (filename TEXT PRIMARY KEY, key TEXT, "
                           "number INTEGER)")) as db:
        db.execute("CREATE TABLE prev (filename TEXT PRIMARY KEY, key TEXT, shard TEXT, position INTEGER)")
        with read_rows(storage, records_uri) as rows:
            db.executemany("INSERT INTO cur VALUES (?, ?, ?)",
                           ((name, key, n) for n, (name, key, _) in enumerate(_keys(rows, fields))))
        with read_rows(storage, join(base.uri, layout.LABELS)) as rows:
            names = rows.fieldnames or []
            shard = names.index("shard") if "shard" in names else None
            place = names.index("shard_position") if "shard_position" in names else None

            def column(values: list[str], at: int | None) -> str:
                return values[at] if at is not None and at < len(values) else ""

            db.executemany("INSERT OR REPLACE INTO prev VALUES (?, ?, ?, ?)",
                           ((name, key, column(values, shard), int(column(values, place) or -1))
                            for name, key, values in _keys(rows, fields)))
        yield from db.execute("SELECT cur.number, prev.shard, prev.position FROM cur JOIN prev "
                              "ON prev.filename = cur.filename AND prev.key = cur.key ORDER BY cur.number")
