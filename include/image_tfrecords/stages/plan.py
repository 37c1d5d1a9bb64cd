"""Stage 4: decide the shards of each split and their members (``members/{shard}.csv``), and give
every record its shard (``labels.csv``).

A full build deals each split's records to ``shards.shard_count`` shards (``shards.deal``).
An incremental build (``base_version``: a previous version with the same splits, salt, shard size and
compression) makes each split of

1. the base's shards whose records are all still here, unchanged: *reused*, copied as they are;
2. the base's other shards that keep some records: *rewritten* from the base's shard, without the
   records that left or changed (their images are not read again);
3. the added and changed images: first appended to the split's *tail*, the kept shard holding the
   fewest bytes when it is below ``shard_size_mb`` (it is rewritten, with them at its end), up to
   ``shard_size_mb``; the rest go into new shards, dealt as a full build deals. So a night's few
   images do not each make a small shard per split, and the shard count follows the data.

A full build writes each shard's records in order of ``shards.order_key`` (then row number); a
rewritten shard keeps the order of the shard it is made from, then its appended records in that
order. When an incremental build would make more than ``COMPACTION_FACTOR`` times the shards of a
full build (after many deletions), it compacts: it is planned as a full build.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..config import BuildConfig
from ..errors import BuildError
from ..images.transform import planned_sizes
from ..progress import log, summarized
from ..records.schema import record_fields, schema_of
from ..rules import shards as planning
from ..rules.base_version import (
    COMPACTION_FACTOR,
    Base,
    base_of,
    base_records,
    missing_base_files,
    why_not_reuse_shards,
)
from ..rules.splits import unit_points
from ..staging import LABELS, MAX_MAP_LENGTH, MEMBERS, PLAN, RECORDS, SPLIT_SUMMARY, staged
from ..storage import Storage
from ..storage.documents import csv_writer, read_json, write_json
from ..storage.tables import header_line, lines_text, polars, read_table, table_lines

if TYPE_CHECKING:
    import polars as pl


@dataclass
class Layout:
    """The shards of a build: ``files`` in order (per split), what each is made from, and each record's shard."""

    files: dict[str, list[str]] = field(default_factory=dict)  # split -> shard files, in order
    reuse: dict[str, dict[str, Any]] = field(default_factory=dict)  # shard -> the base's shard it copies
    rewrite: dict[str, dict[str, Any]] = field(default_factory=dict)  # shard -> the base's shard it filters
    shard_of: Any = None  # numpy array: record row number -> index into all_files
    appended: Any = None  # numpy bool array: record row number -> appended to a rewritten shard
    base_position: Any = None  # numpy array: record row number -> its place in the base shard it is kept from, or -1
    keys: Any = None  # numpy array: record row number -> order key (0 where a base shard's place orders a record)

    @property
    def all_files(self) -> list[str]:
        return [f for files in self.files.values() for f in files]


@summarized
def plan_stage(cfg: BuildConfig, storage: Storage, max_tasks: int = MAX_MAP_LENGTH) -> dict[str, Any]:
    """Plan the shards (full or incremental, see the module), stage members and labels.csv, and group
    the shards to write into at most ``max_tasks`` write tasks.

    Memory: records.csv and the base's labels.csv whole (polars, about 300 bytes a row), and 40 bytes a record.
    """
    import numpy as np

    summary = read_json(storage, staged(cfg, SPLIT_SUMMARY))
    base = base_of(cfg, storage, summary["previous_version"])
    why_full = why_not_reuse_shards(cfg, base, schema_of(cfg, bool(summary.get("multi_label"))))
    header = labels_header(cfg).encode()
    labels = b""  # the base's labels.csv, read once: checked, then joined with
    if base is not None and not why_full:
        why_full, labels = missing_base_files(storage, base, header)
        if why_full:
            log.warning("%s: this version is built in full instead of on it", why_full)
    splits = list(summary["splits"])
    known, base_files = base_records(storage, base, labels) if base is not None and not why_full else (None, [])
    del labels
    lines, records, found = _records(cfg, storage, splits, known)
    del known  # (the base's table, not held while the members are written)
    full_count = sum(planning.shard_count(int(sizes_of.sum()), len(sizes_of), cfg.shard_size_mb)
                     for sizes_of in (records[1][records[2] == i] for i in range(len(splits))))
    layout = None
    if base is not None and not why_full:
        layout = _incremental(cfg, base, splits, records, found, base_files)
        if len(layout.all_files) > COMPACTION_FACTOR * full_count:
            why_full = (f"compaction: an incremental build would make {len(layout.all_files)} shards, more than "
                        f"{COMPACTION_FACTOR:g}x the {full_count} of a full build")
            layout = None
    if layout is None:
        layout = _full(cfg, splits, records)
    _write_members(cfg, storage, layout, lines, header)
    to_write = [f for f in layout.all_files if f not in layout.reuse]
    tasks = planning.group_tasks(to_write, max_tasks)
    files = layout.all_files
    counts = np.bincount(layout.shard_of, minlength=len(files))  # records per shard
    records_of = {f: int(counts[i]) for i, f in enumerate(files)}
    plan = {"compression": cfg.compression, "shard_size_mb": cfg.shard_size_mb, "tasks": tasks,
            "task_records": [sum(records_of[f] for f in task) for task in tasks],
            "splits": layout.files, "reuse": layout.reuse, "rewrite": layout.rewrite,
            "build": {"mode": "full" if why_full else "incremental", "full_because": why_full,
                      "base_version": base.version if base else None}}
    write_json(storage, staged(cfg, PLAN), plan)
    return {"num_shards": len(files), "num_tasks": len(tasks), "shard_tasks": len(tasks) + bool(layout.reuse),
            "mode": plan["build"]["mode"],
            "reused": len(layout.reuse), "rewritten": len(layout.rewrite),
            "written": len(to_write) - len(layout.rewrite),
            "records_to_write": int(sum(counts[i] for i, f in enumerate(files) if f not in layout.reuse))}


def _records(cfg: BuildConfig, storage: Storage, splits: list[str], known: pl.DataFrame | None
             ) -> tuple[pl.Series, tuple[Any, Any, Any], Any]:
    """The staged records (records.csv) as each one's row text (``table_lines``), and each one's content hash (a
    Series), size and split number (numpy arrays), and where the base holds it unchanged (``known``:
    ``base_records``: its packed shard and place; -1 for none, and everywhere without a base): a join on the row's
    text (equal text, equal fields). Of the fields, those planning needs are read alone."""
    import numpy as np
    pl = polars()

    uri, fields = staged(cfg, RECORDS), record_fields(cfg)
    data = storage.read_bytes(uri)
    header, lines = table_lines(uri, data)
    if header != header_line(fields):
        raise BuildError(f"{uri} has the header {header!r}, expected the columns {fields}")
    table = read_table(storage, uri, data, columns=["sha256", "split", "format", "width", "height", "channels",
                                                     "encoded_bytes"])
    if table.height != len(lines):
        raise BuildError(f"{uri} is not a table this package wrote: {table.height} rows in {len(lines)}")
    del data
    sizes = planned_sizes(table, cfg.jpeg_quality, uri)
    split_of = table["split"].replace_strict(splits, list(range(len(splits))), default=-1, return_dtype=pl.Int8)
    if (split_of < 0).any():
        raise BuildError(f"{uri} names a split that is not one of {splits}: {table['split'][split_of.arg_min()]!r}")
    found = np.full(len(table), -1, dtype=np.int64)
    if known is not None:
        rows = pl.DataFrame({"key": lines.str.head(-1)}).with_row_index("row")  # (the row without its line end)
        joined = rows.join(known, on="key", how="inner")
        found[joined["row"].to_numpy()] = joined["found"].to_numpy()
    return lines, (table["sha256"].fill_null(""), sizes, split_of.to_numpy()), found


def _order_keys(cfg: BuildConfig, shas: pl.Series, rows: Any = None) -> Any:
    """Each record's order key (``shards.order_key`` of its content hash ``shas[i]``) as a numpy array, or those of
    ``rows`` alone (the others 0: a record kept from a base shard is ordered by its place there)."""
    import numpy as np

    if rows is None:
        return unit_points(("order", cfg.salt), [sha.encode() for sha in shas])
    keys = np.zeros(len(shas), dtype=np.float64)
    keys[rows] = unit_points(("order", cfg.salt), [sha.encode() for sha in shas.gather(rows)])
    return keys


def _full(cfg: BuildConfig, splits: list[str], records: tuple[Any, Any, Any]) -> Layout:
    """Every split dealt afresh to ``shards.shard_count`` shards."""
    import numpy as np

    shas, sizes, split_of = records
    layout = _empty_layout(len(shas))
    layout.keys = keys = _order_keys(cfg, shas)
    for i, split in enumerate(splits):
        rows = np.flatnonzero(split_of == i)
        count = planning.shard_count(int(sizes[rows].sum()), len(rows), cfg.shard_size_mb)
        _add_fresh(cfg, layout, split, rows, keys, count, first=0, total=count)
    return layout


def _empty_layout(count: int) -> Layout:
    import numpy as np

    return Layout(shard_of=np.zeros(count, dtype=np.int64), appended=np.zeros(count, dtype=bool),
                  base_position=np.full(count, -1, dtype=np.int64))


def _add_fresh(cfg: BuildConfig, layout: Layout, split: str, rows: Any, keys: Any, count: int, first: int,
               total: int) -> None:
    """Deal ``rows`` (record row numbers of ``split``) to ``count`` new shards, numbered from ``first`` of ``total``."""
    offset = len(layout.all_files)
    layout.files.setdefault(split, []).extend(
        planning.ShardSpec(split, first + i, total, cfg.compression).file for i in range(count))
    if len(rows):
        _, shards = planning.deal(keys[rows], count)
        layout.shard_of[rows] = offset + shards


def _incremental(cfg: BuildConfig, base: Base, splits: list[str], records: tuple[Any, Any, Any], found: Any,
                 files: list[str]) -> Layout:
    """Reused and rewritten shards of ``base``, then new shards for the records it does not hold (``found``: where
    the base holds each record, ``base_records``' packed shard number into ``files`` and place, or -1)."""
    import numpy as np

    shas, sizes, split_of = records
    base_shards = [(split, s) for split, info in base.manifest.splits.items() for s in info.shards]
    index_of = {s.file: i for i, (_, s) in enumerate(base_shards)}
    layout = _empty_layout(len(shas))
    shard_index = np.array([index_of.get(name, -1) for name in files] + [-1], dtype=np.int64)
    origin = np.where(found >= 0, shard_index[np.where(found >= 0, found >> 32, -1)], -1)  # the base shard, or -1
    in_base = origin >= 0
    layout.base_position[in_base] = (found[in_base] & 0xFFFFFFFF) - 1
    layout.keys = keys = _order_keys(cfg, shas, np.flatnonzero(layout.base_position < 0))
    kept = np.bincount(origin[in_base], minlength=len(base_shards))
    held = np.bincount(origin[in_base], weights=sizes[in_base], minlength=len(base_shards))  # bytes each keeps
    # (a record the base holds unchanged has its split: the base shard's)
    by_origin = np.argsort(origin, kind="stable")  # row numbers by base shard, in order within each
    first_of = np.searchsorted(origin[by_origin], np.arange(-1, len(base_shards) + 1))
    kept_rows = [by_origin[first_of[b + 1]:first_of[b + 2]] for b in range(len(base_shards))]
    target = cfg.shard_size_mb * planning.MB
    for i, split in enumerate(splits):
        rows = np.flatnonzero(split_of == i)
        mine = [(b, s) for b, (name, s) in enumerate(base_shards) if name == split and kept[b]]
        fresh = rows[origin[rows] < 0]
        fresh = fresh[np.lexsort((fresh, keys[fresh]))]  # in order key order (then row number)
        tail = min((b for b, _ in mine if held[b] < target), key=lambda b: (int(held[b]), b), default=None)
        into_tail = 0
        if tail is not None and len(fresh):
            room = target - int(held[tail])
            into_tail = int(np.searchsorted(np.cumsum(sizes[fresh]), room, side="right"))
        appended, fresh = fresh[:into_tail], fresh[into_tail:]
        new = planning.shard_count(int(sizes[fresh].sum()), len(fresh), cfg.shard_size_mb)
        total = len(mine) + new
        names = [planning.ShardSpec(split, j, total, cfg.compression).file for j in range(total)]
        for j, (b, shard) in enumerate(mine):
            source = {"version": base.version, "file": shard.file, "sha256": shard.sha256,
                      "num_records": shard.num_records, "num_bytes": shard.num_bytes,
                      "index_sha256": shard.index_sha256, "kept": int(kept[b])}
            if kept[b] == shard.num_records and not (b == tail and len(appended)):
                layout.reuse[names[j]] = source
            else:
                places = np.sort(layout.base_position[kept_rows[b]])
                # None: no places, no splice
                runs = planning.runs_of(places) if len(places) and places[0] >= 0 else None
                layout.rewrite[names[j]] = {**source, "appended": len(appended) if b == tail else 0, "runs": runs}
            layout.shard_of[kept_rows[b]] = len(layout.all_files) + j
            if b == tail:
                layout.shard_of[appended] = len(layout.all_files) + j
                layout.appended[appended] = True
        layout.files[split] = names[: len(mine)]
        _add_fresh(cfg, layout, split, fresh, keys, new, first=len(mine), total=total)
    return layout


def _write_members(cfg: BuildConfig, storage: Storage, layout: Layout, lines: pl.Series, header: bytes) -> None:
    """Stage labels.csv (each record's row, ``lines``: records.csv's, with its shard and place in it; ``header``) and
    each shard's members (``members/{shard}.csv``: its rows in record order: by order key, then row number; a
    rewritten shard's kept records in the base shard's order, then its appended ones): the rows made once, as
    text, and cut."""
    import numpy as np
    pl = polars()

    files = layout.all_files
    count = len(layout.keys)
    order = np.lexsort((np.arange(count), layout.keys, layout.base_position, layout.appended, layout.shard_of))
    in_order = layout.shard_of[order]
    starts = np.searchsorted(in_order, np.arange(len(files) + 1))  # shard -> its first entry in ``order``
    position = np.empty(count, dtype=np.int64)  # row number -> its place in its shard
    position[order] = np.arange(count) - starts[:-1][in_order]
    shard = pl.Series(files, dtype=pl.String).gather(layout.shard_of) if count else pl.Series([], dtype=pl.String)
    rows = pl.DataFrame({"line": lines, "shard": shard, "place": pl.Series(position).cast(pl.String)}).select(
        pl.concat_str(pl.col("line").str.head(-1), pl.lit(","), "shard", pl.lit(","), "place", pl.lit("\n"))
    ).to_series()
    storage.write_bytes(staged(cfg, LABELS), header + lines_text(rows))
    rows = rows.gather(order)  # (in shard order: each shard's members one run of the text)
    text = lines_text(rows)
    ends = np.concatenate([[0], np.cumsum(rows.str.len_bytes().to_numpy(), dtype=np.int64)])
    for index, name in enumerate(files):
        first, last = int(ends[starts[index]]), int(ends[starts[index + 1]])
        if first == last:
            continue  # an empty split has no shards; a planned shard always has members
        storage.write_bytes(staged(cfg, MEMBERS, name + ".csv"), header + text[first:last])


def labels_header(cfg: BuildConfig) -> str:
    """labels.csv's header line (and the members files')."""
    text = io.StringIO()
    csv_writer(text).writerow([*record_fields(cfg), "shard", "shard_position"])
    return text.getvalue()




def task_shards(cfg: BuildConfig, storage: Storage, task_index: int) -> list[str]:
    """The shard files that write task ``task_index`` produces."""
    return read_json(storage, staged(cfg, PLAN))["tasks"][task_index]


def all_shards(cfg: BuildConfig, storage: Storage) -> list[str]:
    """Every shard file to write, in plan order (reused shards are copied by the reuse stage)."""
    return [shard for task in read_json(storage, staged(cfg, PLAN))["tasks"] for shard in task]
