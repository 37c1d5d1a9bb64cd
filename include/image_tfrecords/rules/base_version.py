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

``--full`` (CLI) or ``full_rebuild`` (DAG) turns both off. Lookups are polars joins of the tables on the keys'
text (name, size and stamp; a record's whole row), which hold both tables in memory (about 300 bytes a row).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..config import BuildConfig, measures_png
from ..errors import BuildError
from ..images.transform import FILTER, ImageOptions
from ..options import OPTIONS, default
from ..published import layout
from ..published.manifest import Manifest
from ..records.schema import RecordSchema
from ..storage import Storage, join
from ..storage.tables import header_line, polars, read_table, row_ends, table_lines

if TYPE_CHECKING:
    import polars as pl

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


def missing_base_files(storage: Storage, base: Base, header: bytes) -> tuple[str, bytes]:
    """What the base lacks of the files an incremental build reads (its labels.csv, any shard or ``.tfindex`` its
    manifest lists), as one phrase (``""`` when it has them all: one listing), and its labels.csv's bytes, read
    once for ``base_records``. A labels.csv that does not hash to the SHA-256 its manifest gives (none before
    0.5.0) is damaged too: the places of its records, which splicing trusts, must be the published ones. One of
    other columns than this build's (``header``, its labels.csv's first line: a release that wrote others, or
    other declared columns) gives no record to compare with: the version is built in full."""
    files = set(storage.list_children(base.uri)[1])
    needed = [layout.LABELS] + [name for file in base.manifest.shard_files for name in (file, layout.index_file(file))]
    missing = [name for name in needed if name not in files]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return f"version {base.version} is damaged: {missing[0]}{more} is missing", b""
    labels = storage.read_bytes(join(base.uri, layout.LABELS))
    if (want := base.manifest.labels_sha256) and hashlib.sha256(labels).hexdigest() != want:
        return f"version {base.version} is damaged: its {layout.LABELS} is not the one it published", b""
    if not labels.startswith(header):
        return f"version {base.version}'s {layout.LABELS} has other columns than this build's", b""
    return "", labels


def carried_inspections(storage: Storage, base: Base, listed: pl.DataFrame) -> tuple[pl.DataFrame, str]:
    """The base's inspections of the files listed (``listed``: discovered.csv with each row's ``number``) whose name,
    size and stamp are unchanged, as ``number``, the base's ``reason`` and ``detail`` (null for an image) and where
    the row begins and ends in the base's inspected.csv (``begin``, ``end``: byte offsets), in listing order; and
    that table's SHA-256. A file without a stamp (nothing proves it unchanged) and a ``RETRIED_REASONS`` reject
    (its inspection said nothing of its content) take nothing over; nor does a base inspected.csv of other columns.
    A base inspected.csv that lists a file twice, that this package did not write, or that is not the one its
    manifest's ``inspected_sha256`` names, is damaged (``BuildError``). Of a table its manifest vouches for, the
    columns compared are read alone; each row's place comes from ``row_ends``."""
    pl = polars()

    uri = join(base.uri, layout.INSPECTED)
    data = storage.read_bytes(uri)
    sha256 = hashlib.sha256(data).hexdigest()
    key = ["filename", "num_bytes", "stamp"]
    if (want := base.manifest.inspected_sha256) and sha256 != want:
        raise BuildError(f"{uri} is not the one version {base.version} published")
    ours = data.startswith(header_line(INSPECTION_FIELDS))
    known = read_table(storage, uri, data, columns=[*key, "reason", "detail"] if want and ours else None)
    # (a table its manifest vouches for: the columns compared alone; else every column, where a ragged row shows)
    if not ours:
        known = pl.DataFrame(schema={**dict.fromkeys(INSPECTION_FIELDS, pl.String), "begin": pl.Int64,
                                     "end": pl.Int64})  # not this release's columns: read nothing of it
    else:
        ends = row_ends(data)  # (the header's end first)
        if len(ends) != known.height + 1 or ends[-1] != len(data):
            raise BuildError(f"{uri} is not a table this package wrote: {known.height} rows in {len(ends) - 1}")
        known = known.with_columns(begin=pl.Series(ends[:-1]), end=pl.Series(ends[1:]))
    known = known.filter(~pl.col("reason").is_in(RETRIED_REASONS).fill_null(False))
    carried = listed.filter(pl.col("stamp").is_not_null()).select("number", *key) \
        .join(known, on="filename", how="inner", maintain_order="left", suffix="\0base") \
        .filter((pl.col("num_bytes") == pl.col("num_bytes\0base")) & (pl.col("stamp") == pl.col("stamp\0base")))
    # (in listing order, the number's; joined on the name and then compared: cheaper than a join on all three)
    if (twice := carried.filter(pl.col("number").is_duplicated())).height:
        raise BuildError(f"{uri} lists {twice['filename'][0]!r} twice")
    return carried.select("number", "reason", "detail", "begin", "end"), sha256


def base_records(storage: Storage, base: Base, labels: bytes) -> tuple[pl.DataFrame, list[str]]:
    """The records the base holds, to join a build's records with (``stages.plan``): from its labels.csv (``labels``,
    read and checked by ``missing_base_files``: this build's columns), each row's text without its shard and place
    (``key``: a record of the build whose records.csv row is that text is byte-identical), and ``found``, its shard
    (a number into the list returned with it) and place in it, packed in one int (``shard << 32 | place + 1``;
    place 0: the row does not give it). A row that does not end in its shard and place as this package writes them
    keeps its line end in its key, and matches nothing (no records.csv row, its line end left out, ends in one)."""
    pl = polars()

    uri = join(base.uri, layout.LABELS)
    _, lines = table_lines(uri, labels)
    places = read_table(storage, uri, labels, columns=["shard", "shard_position"])
    if places.height != len(lines):
        raise BuildError(f"{uri} is not a table this package wrote: {places.height} rows in {len(lines)}")
    shard, place = places["shard"].fill_null(""), places["shard_position"]
    shards = shard.unique(maintain_order=True).to_list()
    end = pl.concat_str(pl.lit(","), "shard", pl.lit(","), pl.col("place").fill_null(""), pl.lit("\n"))
    line = pl.col("line")
    return pl.DataFrame([lines, shard, place.alias("place")]).select(
        key=line.str.strip_suffix(end),  # (one that does not end so keeps its line end: it matches no record's row)
        found=pl.col("shard").replace_strict(shards, list(range(len(shards))), return_dtype=pl.Int64) * (1 << 32)
        + (pl.col("place").cast(pl.Int64) + 1).fill_null(0)), shards
