"""What a build takes over from the version before it: inspections of unchanged files, and shards.

The *base* of a build is the previous published version (``layout.previous_version``: the newest
published version whose name sorts before this one's, so a backfill builds on the newest version
older than it). A build reuses

* the base's ``inspected.csv`` rows for files whose name, size and stamp (mtime in ns locally,
  the ETag on S3) are unchanged (but for ``RETRIED_REASONS`` rejects, which are read again), when
  the base was inspected by this release, from the same source, with the same ``max_file_mb`` and
  ``max_pixels``;
* the base's shards whose records are all still present and unchanged, when the base was built
  with the same record features and the same value of every option that rebuilds shards (an
  ``effect`` in ``options.REBUILDS``: image options, columns, splits, salt, shard size, compression...).

``--full`` (CLI) or ``full_rebuild`` (DAG) turns both off. Lookups are hash joins on 128-bit digests
of the keys (the base's rows wait in a temporary file), so memory holds about 100 bytes per file.
"""

from __future__ import annotations

import csv
import hashlib
import mmap
import os
from array import array
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

from ..config import BuildConfig, measures_png
from ..images.transform import FILTER, ImageOptions
from ..options import OPTIONS, default
from ..published import layout
from ..published.manifest import Manifest
from ..records.schema import RecordSchema
from ..source.listing import DISCOVERED_FIELDS
from ..storage import Storage, is_s3, join
from ..storage.csv_blocks import Quoted, blocks, within
from ..storage.documents import csv_field, list_rows, raw_rows
from ..storage.span_map import SpanMap

# inspected.csv: one row per file inspection read (images and rejects); ``reason`` is set for a reject
INSPECTION_FIELDS = ("filename", "num_bytes", "stamp", "sha256", "format", "width", "height", "channels",
                     "source_format", "transform", "encoded_sha256", "encoded_bytes", "phash", "brightness",
                     "contrast", "sharpness", "colourfulness", "quality", "reason", "detail")
# Rejects that say nothing of a file's content (it could not be read, or was swapped while listed):
# such a file is read again the next night even when its name, size and stamp are unchanged.
RETRIED_REASONS = ("unreadable", "not_a_regular_file")
COMPACTION_FACTOR = 1.5  # more shards than this times a full build's count: the build is a full rebuild
# The release whose inspection rules this one keeps: inspected.csv rows of a version inspected by it are
# taken over. Bump it (to the package version) when inspection concludes otherwise for some file.
INSPECTOR = "0.7.2"  # 0.6.0: rows carry the perceptual hash (phash); 0.7.0: the quality signals and flags;
# 0.7.1: both from one copy of the thumbnail's pixels (unrounded grey levels: values move in the 2nd decimal);
# 0.7.2: both from exact integer sums in one C call (hash bits and 3rd decimals move for a few images)
FULL_REBUILD = "rebuild in full (--full on the command line, full_rebuild in the DAG)"  # when a base is damaged


@dataclass(frozen=True)
class Base:
    """The published version a build starts from."""

    version: str
    uri: str
    manifest: Manifest

    @property
    def build(self) -> Mapping[str, Any]:
        return self.manifest.build


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
    if base.manifest.source != cfg.source:
        return f"version {base.version} was built from another source"
    if base.build.get("inspector") != INSPECTOR:
        return f"version {base.version} was inspected by another release of image-tfrecords"
    params = base.manifest.params
    if (params.get("max_file_mb"), params.get("max_pixels")) != (cfg.max_file_mb, cfg.max_pixels):
        return "max_file_mb or max_pixels changed"
    if params.get("modern_formats", True) != cfg.modern_formats:
        return "modern_formats changed"
    if measures_png(params.get("near_duplicate_bits", 0), params.get("quality_reject", "")) != cfg.png_pixels:
        return ("PNG pixels are measured now and were not then, or the other way round (near_duplicate_bits, "
                "quality_reject)")
    return ""


def why_not_reuse_shards(cfg: BuildConfig, base: Base | None, schema: RecordSchema) -> str:
    """Why the base's shards cannot be taken over (``""`` when they can): records of ``schema`` made by
    ``cfg``, whose options that rebuild shards (``Option.rebuilds``) must have the values the base records."""
    if base is None:
        return "full rebuild asked for" if cfg.full else "no previous version"
    if not base.build:
        return f"version {base.version} predates shard reuse (its labels.csv does not name shards)"
    if base.manifest.features != schema.features():
        return f"version {base.version} has other record features"
    if base.manifest.image_options.get("filter") != FILTER:
        return f"the resize filter changed since version {base.version}"
    for option in OPTIONS:
        if option.rebuilds and recorded(base.manifest, option.name) != getattr(cfg, option.name):
            return f"{option.name} changed since version {base.version}"
    if not base.build.get("record_positions"):
        return f"version {base.version} predates spliced shards (its labels.csv does not give each record's place)"
    return ""


# Where a manifest records an option outside its ``params`` (the field that readers of old versions know)
_RECORDED: dict[str, Callable[[Manifest], Any]] = {
    "compression": lambda manifest: manifest.compression,
    "columns": lambda manifest: dict(manifest.columns),
    "label_separator": lambda manifest: manifest.separator,
    **{f.name: (lambda manifest, name=f.name: manifest.image_options.get(name)) for f in fields(ImageOptions)},
}


def recorded(manifest: Manifest, name: str) -> Any:
    """The value of option ``name`` that a published version was built with, as its manifest records it. An
    option its ``params`` do not name is newer than the version: it had its default (None where the version
    records no params at all)."""
    if name in _RECORDED:
        return _RECORDED[name](manifest)
    return manifest.params.get(name, default(name)) if manifest.params else None


def missing_base_files(storage: Storage, base: Base) -> str:
    """What the base lacks of the files an incremental build reads (its labels.csv, any shard or
    ``.tfindex`` its manifest lists), as one phrase; ``""`` when it has them all. One listing."""
    files = set(storage.list_children(base.uri)[1])
    needed = [layout.LABELS] + [name for file in base.manifest.shard_files for name in (file, layout.index_file(file))]
    missing = [name for name in needed if name not in files]
    if not missing:
        return "" if labels_as_published(storage, base) else \
            f"version {base.version} is damaged: its {layout.LABELS} is not the one it published"
    more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
    return f"version {base.version} is damaged: {missing[0]}{more} is missing"


def labels_as_published(storage: Storage, base: Base) -> bool:
    """Whether the base's labels.csv hashes to the SHA-256 its manifest gives (True for a manifest from
    before 0.5.0, which gives none): the places of its records, which splicing trusts, are then the
    published ones."""
    want = base.manifest.labels_sha256
    return not want or storage.sha256_of(join(base.uri, layout.LABELS)) == want


def _digest(text: str) -> bytes:
    """A 128-bit digest of a join key: equal keys give equal digests, and two keys among millions sharing one
    is not a thing that happens (2^-128 a pair), so the joins below compare digests, not keys."""
    return hashlib.blake2b(text.encode("utf-8", "surrogateescape"), digest_size=16).digest()


class _Spill:
    """Rows (their CSV text) written to a temporary file, read back by the number ``add`` returns: the
    joins keep only a digest and a number per row in memory."""

    def __init__(self, folder: str, name: str) -> None:
        self._path = os.path.join(folder, name)
        self._file = open(self._path, "wb")  # noqa: SIM115 - closed by close()
        self._map: mmap.mmap | None = None
        self._size = 0

    def add(self, text: str) -> int:
        data = text.encode("utf-8", "surrogateescape")
        where = self._size << 32 | len(data)  # offset and length in one (unbounded) int
        self._file.write(data)
        self._size += len(data)
        return where

    def seal(self) -> None:
        self._file.close()
        if self._size:
            with open(self._path, "rb") as f:
                self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def get(self, where: int) -> str:
        offset, length = where >> 32, where & 0xFFFFFFFF
        assert self._map is not None
        return self._map[offset:offset + length].decode("utf-8", "surrogateescape")

    def close(self) -> None:
        self._file.close()
        if self._map is not None:
            self._map.close()


class Inspections:
    """The discovered files, each with the base's inspection of it when name, size and stamp still match.

    ``all()`` gives ``(discovered row, previous inspected.csv row or None)`` in listing order (as lists);
    ``unread()`` gives the discovered rows that have none (the files to read), in the same order.
    Without a base (or its inspected.csv) every file is unread and nothing is loaded. A hash join: the
    base's rows wait in a temporary file, and memory holds a digest and a number per row.
    """

    def __init__(self, storage: Storage, discovered: str, known: dict[bytes, int] | None = None,
                 spill: _Spill | None = None) -> None:
        self._storage, self._discovered, self._known, self._spill = storage, discovered, known, spill
        self._found: array[int] | None = None  # each row's match (-1: none), once a pass has looked all up

    def all(self) -> Iterator[tuple[list[str], str | None]]:
        """Each discovered row's values (``DISCOVERED_FIELDS``) and the base's inspection of it (its
        inspected.csv row's text, ``INSPECTION_FIELDS``), or None: plain lists and text, as this runs over
        every file."""
        for values, where in self._matched():
            yield values, (None if where < 0 else self._spill.get(where))  # type: ignore[union-attr]

    def unread(self) -> Iterator[dict[str, str]]:
        for values, where in self._matched():
            if where < 0:
                yield dict(zip(DISCOVERED_FIELDS, values, strict=False))

    def _matched(self) -> Iterator[tuple[list[str], int]]:
        """Each discovered row's values and where the base's inspection of it is (-1: none). The first pass
        to read every row looks them up and keeps the answers (8 bytes a row) for the passes after it."""
        found, known = self._found, array("q")
        with list_rows(self._storage, self._discovered) as rows:
            _check_header(rows.fieldnames, self._discovered)
            for number, values in enumerate(rows.reader):
                if found is not None and number < len(found):
                    yield values, found[number]
                    continue
                where = self._lookup(values)
                known.append(-1 if where is None else where)
                yield values, known[-1]
        if found is None:
            self._found = known

    def _lookup(self, values: list[str]) -> int | None:
        """Where the base's inspection of the discovered row ``values`` (filename, label, num_bytes, stamp) is."""
        if self._known is None or not values[3]:  # no stamp: nothing proves the file unchanged
            return None
        return self._known.get(_digest(f"{values[0]}\0{values[2]}\0{values[3]}"))


def _check_header(names: Any, uri: str) -> None:
    if tuple(names or ()) != DISCOVERED_FIELDS:
        raise ValueError(f"{uri} has columns {names}, expected {DISCOVERED_FIELDS}")


@contextmanager
def inspections(storage: Storage, base: Base | None, discovered: str, folder: str) -> Iterator[Inspections]:
    """``Inspections`` of the files listed in ``discovered`` against ``base`` (None: reuse nothing)."""
    uri = join(base.uri, layout.INSPECTED) if base else None
    if uri is None or not storage.exists(uri):
        yield Inspections(storage, discovered)
        return
    spill = _Spill(folder, "inspected.rows")
    known: dict[bytes, int] = {}
    reason = INSPECTION_FIELDS.index("reason")
    try:
        with raw_rows(storage, uri) as (header, texts):
            if header != ",".join(INSPECTION_FIELDS):  # not this release's columns: read nothing of it
                yield Inspections(storage, discovered)
                return
            for text in texts:
                if text.endswith(",,") and not text.startswith('"'):  # an image, its name needs no quotes
                    first = text.index(",")
                    second = text.index(",", first + 1)
                    key = text[:second].replace(",", "\0") + "\0" + text[second + 1:text.index(",", second + 1)]
                else:  # a reject, or a name in quotes: parse the row
                    values = next(csv.reader([text]))
                    if values[reason] in RETRIED_REASONS:
                        continue
                    key = f"{values[0]}\0{values[1]}\0{values[2]}"
                known[_digest(key)] = spill.add(text)  # filename, num_bytes, stamp
        spill.seal()
        yield Inspections(storage, discovered, known, spill)
    finally:
        spill.close()


def carried_inspections(storage: Storage, base: Base | None, discovered: str, folder: str
                        ) -> tuple[Any, Any, str] | None:
    """``inspections`` read as columns (``csv_blocks``): for each row of ``discovered``, where the base's
    inspection of it is in the base's inspected.csv (``offset << 32 | length`` of its row, -1 for none) and its
    size, and the path of that file (local: a copy in ``folder`` from S3); None when either table is to be read
    row by row. The join is on the keys' text (file name, size and stamp), in a ``SpanMap``: about 150 bytes of
    memory per base row."""
    import numpy as np

    uri = join(base.uri, layout.INSPECTED) if base else None
    if uri is None or not storage.exists(uri):
        return None
    path = uri
    if is_s3(uri):
        path = os.path.join(folder, "inspected.csv")
        storage.download(uri, path)
    known = SpanMap()
    retried = np.array([reason.encode() for reason in RETRIED_REASONS])
    reason = INSPECTION_FIELDS.index("reason")
    found, sizes = [], []
    try:
        with blocks(storage, path, ",".join(INSPECTION_FIELDS)) as parts:
            for part in parts:
                rows = np.flatnonzero(~within(part.column(reason), retried))  # those read again have no say
                starts, stops = part.starts[rows, 0], part.stops[rows, -1]
                # "name,size,stamp" (no field holds a comma here)
                known.add(part.data, starts, part.stops[rows, 2], (part.offset + starts) << 32 | (stops - starts))
        with blocks(storage, discovered, ",".join(DISCOVERED_FIELDS)) as parts:
            for part in parts:  # name, then ",size,stamp" (the label's end is the comma before the size)
                where = known.get(part.data, part.starts[:, 0], part.stops[:, 0], part.stops[:, 1], part.stops[:, 3])
                where[part.stops[:, 3] == part.starts[:, 3]] = -1  # no stamp: nothing proves the file unchanged
                found.append(where)
                sizes.append(part.integers(2))
    except (Quoted, ValueError):  # (a size not written as a plain decimal, a damaged row: not this table)
        return None
    if not found:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), path
    return np.concatenate(found), np.concatenate(sizes), path


def _keys(rows: Any, fields: tuple[str, ...]) -> Iterator[tuple[str, str, list[str]]]:
    """``(filename, key, values)`` of each row of a ``ListRows``, read as plain lists (the join's path for a table
    with quoted fields, or from a release with other columns). The key is every field that decides a record's
    bytes (``fields``: the build's record fields): equal keys mean byte-identical records (under the same image
    options)."""
    names = rows.fieldnames or []
    columns = [names.index(name) if name in names else None for name in fields]
    if columns == list(range(len(fields))):  # labels.csv and records.csv: the record's fields first
        width = len(fields)
        for values in rows.reader:
            yield values[0], _join_key(values[:width]), values
        return
    for values in rows.reader:
        fields = ["" if i is None or i >= len(values) else values[i] for i in columns]
        yield fields[0], _join_key(fields), values


def _join_key(fields: list[str]) -> str:
    """A record's join key: its record fields, in the build's order, as this package's CSV rows give them (so
    the text of a row's first fields is its key, as the column path takes it). Two keys are equal only for equal
    fields."""
    line = ",".join(fields)
    if '"' in line or "\n" in line or "\r" in line or line.count(",") != len(fields) - 1:
        return ",".join(csv_field(value) if value else "" for value in fields)
    return line


def record_key(values: list[str], width: int) -> bytes:
    """The join key of a records.csv or labels.csv row whose first ``width`` fields are the build's record fields
    (as ``_keys`` takes them): the bytes the column path takes from a row of the same fields as they are."""
    return _join_key(values[:width]).encode("utf-8", "surrogateescape")


def base_records(storage: Storage, base: Base, fields: tuple[str, ...]) -> tuple[SpanMap, list[str], Any]:
    """The records the base holds: the join key of each (its record fields' text, ``record_key``) -> its row number in
    the base's labels.csv; and for each of those rows, its shard (a number into the list returned with it) and place
    in it, packed in one int (``shard << 32 | place + 1``; place 0: the base's labels.csv does not give it).

    A hash join on the keys (the record's file name and every field that decides its bytes), in a ``SpanMap``: the
    compiled one holds each key's bytes and 64 bytes (about 200 bytes a base record), its Python fallback a digest
    (about 100). A labels.csv of this build's columns without a quoted field is read as columns (``csv_blocks``),
    any other row by row."""
    import numpy as np

    uri = join(base.uri, layout.LABELS)
    width = len(fields)
    try:
        with blocks(storage, uri, ",".join((*fields, "shard", "shard_position"))) as parts:
            known = SpanMap()
            numbered: dict[bytes, int] = {}  # shard file -> its number
            packed: list[Any] = []
            first = 0  # the block's first row number
            for part in parts:
                names, shard_of = np.unique(part.column(width), return_inverse=True)
                numbers = np.array([numbered.setdefault(name, len(numbered)) for name in names.tolist()],
                                   dtype=np.int64)
                packed.append(numbers[shard_of.ravel()] << 32 | (part.integers(width + 1) + 1))
                known.add(part.data, *part.row_slices(0, width - 1), np.arange(first, first + len(part)))
                first += len(part)
            return known, [name.decode("utf-8", "surrogateescape") for name in numbered], \
                np.concatenate(packed) if packed else np.zeros(0, dtype=np.int64)
    except (Quoted, ValueError):
        pass
    shards: dict[str, int] = {}
    known = SpanMap()
    rows_packed = array("q")
    with list_rows(storage, uri) as rows:
        names = rows.fieldnames or []
        shard = names.index("shard") if "shard" in names else None
        place = names.index("shard_position") if "shard_position" in names else None
        for _, key, values in _keys(rows, fields):
            name = values[shard] if shard is not None and shard < len(values) else ""
            number = shards.setdefault(name, len(shards))
            at = values[place] if place is not None and place < len(values) else ""
            known.add_key(key.encode("utf-8", "surrogateescape"), len(rows_packed))
            rows_packed.append(number << 32 | (int(at) + 1 if at else 0))
    return known, list(shards), np.frombuffer(rows_packed, dtype=np.int64)
