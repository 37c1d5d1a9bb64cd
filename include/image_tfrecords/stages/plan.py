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
import mmap
import os
import tempfile
from array import array
from dataclasses import dataclass, field
from typing import Any

from ..card.row_columns import card_rows_bytes
from ..config import BuildConfig
from ..errors import BuildError
from ..images.transform import planned_bytes
from ..progress import log, summarized
from ..records.schema import record_fields, schema_of
from ..rules import shards as planning
from ..rules.base_version import (
    COMPACTION_FACTOR,
    Base,
    base_of,
    base_records,
    missing_base_files,
    record_key,
    why_not_reuse_shards,
)
from ..rules.splits import unit_points
from ..staging import CARD_ROWS, LABELS, MAX_MAP_LENGTH, MEMBERS, PLAN, RECORDS, SPLIT_SUMMARY, staged
from ..storage import Storage
from ..storage.csv_blocks import Block, Quoted, Ragged, blocks
from ..storage.documents import csv_field, csv_writer, list_rows, raw_rows, read_json, write_json
from ..storage.row_text import gather, join_rows
from ..storage.span_map import SpanMap


@dataclass
class Layout:
    """The shards of a build: ``files`` in order (per split), what each is made from, and each record's shard."""

    files: dict[str, list[str]] = field(default_factory=dict)  # split -> shard files, in order
    reuse: dict[str, dict[str, Any]] = field(default_factory=dict)  # shard -> the base's shard it copies
    rewrite: dict[str, dict[str, Any]] = field(default_factory=dict)  # shard -> the base's shard it filters
    shard_of: Any = None  # numpy array: record row number -> index into all_files
    appended: Any = None  # numpy bool array: record row number -> appended to a rewritten shard
    base_position: Any = None  # numpy array: record row number -> its place in the base shard it is kept from, or -1

    @property
    def all_files(self) -> list[str]:
        return [f for files in self.files.values() for f in files]


@summarized
def plan_stage(cfg: BuildConfig, storage: Storage, max_tasks: int = MAX_MAP_LENGTH) -> dict[str, Any]:
    """Plan the shards (full or incremental, see the module), stage members and labels.csv, and group
    the shards to write into at most ``max_tasks`` write tasks.

    Memory: about 40 bytes per record (order keys, sizes, splits, shards), besides one shard's rows.
    """
    import numpy as np

    summary = read_json(storage, staged(cfg, SPLIT_SUMMARY))
    base = base_of(cfg, storage, summary["previous_version"])
    why_full = why_not_reuse_shards(cfg, base, schema_of(cfg, bool(summary.get("multi_label"))))
    if base is not None and not why_full and (why_full := missing_base_files(storage, base)):
        log.warning("%s: this version is built in full instead of on it", why_full)
    splits = list(summary["splits"])
    fields = record_fields(cfg)
    known = base_records(storage, base, fields) if base is not None and not why_full else None
    records, origins = _records(cfg, storage, splits, fields, known[0] if known else None)
    found = origins.copy()  # each record's shard and place in the base (base_records), or -1
    if known is not None and len(known[2]):
        found[origins >= 0] = known[2][origins[origins >= 0]]
    full_count = sum(planning.shard_count(int(sizes_of.sum()), len(sizes_of), cfg.shard_size_mb)
                     for sizes_of in (records[1][records[2] == i] for i in range(len(splits))))
    layout = None
    with tempfile.TemporaryDirectory() as tmp:
        if base is not None and not why_full:
            layout = _incremental(cfg, base, splits, records, found, known[1] if known else [])
            if len(layout.all_files) > COMPACTION_FACTOR * full_count:
                why_full = (f"compaction: an incremental build would make {len(layout.all_files)} shards, more than "
                            f"{COMPACTION_FACTOR:g}x the {full_count} of a full build")
                layout = None
        if layout is None:
            layout = _full(cfg, splits, records)
        offsets = _write_members(cfg, storage, layout, records[0], tmp)
    kept_base = (base.version, base.manifest.labels_sha256) if known is not None and base is not None and \
        base.manifest.labels_sha256 else None  # the base whose labels.csv rows ``origins`` numbers, for the card
    storage.write_bytes(staged(cfg, CARD_ROWS), card_rows_bytes(kept_base, origins, offsets))
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


def _records(cfg: BuildConfig, storage: Storage, splits: list[str], fields: tuple[str, ...],
             known: SpanMap | None) -> tuple[tuple[Any, Any, Any], Any]:
    """Each record's order key, size and split number (numpy arrays), and where the base holds it unchanged
    (``known``: ``base_records``' join: its row in the base's labels.csv; -1 for none, and everywhere without a
    base). Read as columns
    (``csv_blocks``); a records.csv holding a quoted field, row by row."""
    import numpy as np

    uri = staged(cfg, RECORDS)
    parts: list[tuple[Any, ...]] = []
    try:
        with blocks(storage, uri, ",".join(fields)) as table:
            for part in table:
                parts.append(_block_records(cfg, part, splits, fields, known))
    except (Quoted, Ragged):  # (nothing written yet)
        return _rows_records(cfg, storage, splits, fields, known)
    if not parts:
        return (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8)), np.zeros(0, dtype=np.int64)
    keys, sizes, split_of, found = (np.concatenate(column) for column in zip(*parts, strict=True))
    return (keys, sizes, split_of), found


def _block_records(cfg: BuildConfig, part: Block, splits: list[str], fields: tuple[str, ...],
                   known: SpanMap | None) -> tuple[Any, ...]:
    """``_records``' columns of one block of records.csv."""
    import numpy as np

    keys = unit_points(("order", cfg.salt), part.column(fields.index("sha256")).tolist())
    size = fields.index("encoded_bytes")
    try:
        sizes = part.integers(size)
    except ValueError:  # made by the writer (image options): the size planned from the image's facts
        shape = [part.column(fields.index(name)).tolist() for name in ("format", "width", "height", "channels")]
        sizes = np.array([int(value) if value else planned_bytes("", *(c[i].decode() for c in shape), cfg.jpeg_quality)
                          for i, value in enumerate(part.column(size).tolist())], dtype=np.int64)
    named = part.column(fields.index("split"))
    split_of = np.full(len(part), -1, dtype=np.int8)
    for number, name in enumerate(splits):
        split_of[named == name.encode()] = number
    if (split_of < 0).any():
        raise BuildError(f"{staged(cfg, RECORDS)} names a split that is not one of {splits}: "
                         f"{named[split_of < 0][0].decode(errors='replace')!r}")
    found = np.full(len(part), -1, dtype=np.int64)
    if known:
        found = known.get(part.data, *part.row_slices(0, len(fields) - 1))
    return keys, sizes, split_of, found


def _rows_records(cfg: BuildConfig, storage: Storage, splits: list[str], fields: tuple[str, ...],
                  known: SpanMap | None) -> tuple[tuple[Any, Any, Any], Any]:
    """``_records`` row by row (a records.csv with a quoted field)."""
    import numpy as np

    keys, sizes, split_of, found = array("d"), array("q"), array("b"), array("q")
    split_number = {name: i for i, name in enumerate(splits)}
    order_key = planning.order_keys(cfg.salt)
    with list_rows(storage, staged(cfg, RECORDS)) as rows:
        column = {name: i for i, name in enumerate(rows.fieldnames or ())}
        if list(column)[:len(fields)] != list(fields):
            raise BuildError(f"{staged(cfg, RECORDS)} has columns {list(column)}, expected {fields} first")
        sha, size, split = column["sha256"], column["encoded_bytes"], column["split"]
        shape = [column[name] for name in ("format", "width", "height", "channels")]
        for values in rows.reader:
            keys.append(order_key(values[sha]))
            sizes.append(int(values[size]) if values[size] else
                         planned_bytes("", *(values[i] for i in shape), cfg.jpeg_quality))  # made by the writer
            if values[split] not in split_number:
                raise BuildError(f"{staged(cfg, RECORDS)} names a split that is not one of {splits}: "
                                 f"{values[split]!r}")
            split_of.append(split_number[values[split]])
            found.append(known.get_key(record_key(values, len(fields))) if known else -1)
    return (np.frombuffer(keys, dtype=np.float64), np.frombuffer(sizes, dtype=np.int64),
            np.frombuffer(split_of, dtype=np.int8)), np.frombuffer(found, dtype=np.int64)


def _full(cfg: BuildConfig, splits: list[str], records: tuple[Any, Any, Any]) -> Layout:
    """Every split dealt afresh to ``shards.shard_count`` shards."""
    import numpy as np

    keys, sizes, split_of = records
    layout = _empty_layout(len(keys))
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

    keys, sizes, split_of = records
    base_shards = [(split, s) for split, info in base.manifest.splits.items() for s in info.shards]
    index_of = {s.file: i for i, (_, s) in enumerate(base_shards)}
    layout = _empty_layout(len(keys))
    shard_index = np.array([index_of.get(name, -1) for name in files] + [-1], dtype=np.int64)
    origin = np.where(found >= 0, shard_index[np.where(found >= 0, found >> 32, -1)], -1)  # the base shard, or -1
    in_base = origin >= 0
    layout.base_position[in_base] = (found[in_base] & 0xFFFFFFFF) - 1
    kept = np.bincount(origin[in_base], minlength=len(base_shards))
    target = cfg.shard_size_mb * planning.MB
    for i, split in enumerate(splits):
        rows = np.flatnonzero(split_of == i)
        mine = [(b, s) for b, (name, s) in enumerate(base_shards) if name == split and kept[b]]
        held = {b: int(sizes[rows[origin[rows] == b]].sum()) for b, _ in mine}  # bytes each keeps
        fresh = rows[origin[rows] < 0]
        fresh = fresh[np.lexsort((fresh, keys[fresh]))]  # in order key order (then row number)
        tail = min((b for b, _ in mine if held[b] < target), key=lambda b: (held[b], b), default=None)
        into_tail = 0
        if tail is not None and len(fresh):
            room = target - held[tail]
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
                places = np.sort(layout.base_position[rows[origin[rows] == b]])
                # None: no places, no splice
                runs = planning.runs_of(places) if len(places) and places[0] >= 0 else None
                layout.rewrite[names[j]] = {**source, "appended": len(appended) if b == tail else 0, "runs": runs}
            layout.shard_of[rows[origin[rows] == b]] = len(layout.all_files) + j
            if b == tail:
                layout.shard_of[appended] = len(layout.all_files) + j
                layout.appended[appended] = True
        layout.files[split] = names[: len(mine)]
        _add_fresh(cfg, layout, split, fresh, keys, new, first=len(mine), total=total)
    return layout


def _write_members(cfg: BuildConfig, storage: Storage, layout: Layout, keys: Any, tmp: str) -> Any:
    """Stage labels.csv (each record's row, shard and place in it) and each shard's members
    (``members/{shard}.csv``: its rows in record order: by order key, then row number; a rewritten
    shard's kept records in the base shard's order, then its appended ones). Returns where each row's line begins
    in labels.csv (the table's length last).

    Each record's CSV text is taken from records.csv as it is and extended with its shard and place;
    labels.csv is written in row order, remembering where each row's line starts, and each shard's
    members are then cut from it in place order (numpy computes both orders): memory holds 16 bytes per
    record and one shard's rows.
    """
    import numpy as np

    files = layout.all_files
    count = len(keys)
    order = np.lexsort((np.arange(count), keys, layout.base_position, layout.appended, layout.shard_of))
    in_order = layout.shard_of[order]
    starts = np.searchsorted(in_order, np.arange(len(files) + 1))  # shard -> its first entry in ``order``
    position = np.empty(count, dtype=np.int64)  # row number -> its place in its shard
    position[order] = np.arange(count) - starts[:-1][in_order]
    header = labels_header(cfg)
    suffixes = [csv_field(name) for name in files]
    offsets = np.zeros(count + 1, dtype=np.int64)  # row number -> where its line starts in labels.csv
    labels_path = os.path.join(tmp, "labels.csv")
    with open(labels_path, "wb") as out:
        out.write(header.encode())
        offsets[0] = len(header.encode())
        try:
            seen = _labels_from_blocks(cfg, storage, layout, position, suffixes, offsets, out)
        except (Quoted, Ragged):  # a quoted field: row by row (what was written of the blocks is cut off first)
            out.seek(offsets[0])
            out.truncate()
            seen = _labels_from_rows(cfg, storage, layout, position, suffixes, offsets, out, header)
        if seen != count:
            raise BuildError(f"{staged(cfg, RECORDS)} holds {seen} rows, {count} were planned")
    storage.upload(labels_path, staged(cfg, LABELS))
    head = header.encode()
    with open(labels_path, "rb") as f, (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) as lines:
        for shard, name in enumerate(files):
            rows = order[starts[shard]:starts[shard + 1]]
            if not len(rows):
                continue  # an empty split has no shards; a planned shard always has members
            storage.write_bytes(staged(cfg, MEMBERS, name + ".csv"),
                                head + gather(lines, offsets[rows], offsets[rows + 1]))
    return offsets


def _labels_from_blocks(cfg: BuildConfig, storage: Storage, layout: Layout, position: Any, suffixes: list[str],
                        offsets: Any, out: Any) -> int:
    """Write labels.csv's rows to ``out``: each records.csv row as it is, then its shard and place, read as blocks
    (``csv_blocks``); set ``offsets`` (where each row's line starts; the header's length at 0). Returns the rows."""
    count = len(position)
    names = [suffix.encode() for suffix in suffixes]
    number = 0
    with blocks(storage, staged(cfg, RECORDS), ",".join(record_fields(cfg))) as table:
        for part in table:
            rows = len(part)
            if number + rows > count:
                raise BuildError(f"{staged(cfg, RECORDS)} holds more rows than were planned")
            text, ends = join_rows(rows, [(part.data, part.starts[:, 0], part.stops[:, -1]),  # the row as it is
                                          (names, layout.shard_of[number:number + rows]),
                                          (position[number:number + rows],)])
            offsets[number + 1:number + rows + 1] = offsets[number] + ends
            out.write(text)
            number += rows
    return number


def _labels_from_rows(cfg: BuildConfig, storage: Storage, layout: Layout, position: Any, suffixes: list[str],
                      offsets: Any, out: Any, header: str) -> int:
    """``_labels_from_blocks`` row by row (a records.csv with a quoted field)."""
    count = len(position)
    at = int(offsets[0])
    with raw_rows(storage, staged(cfg, RECORDS)) as (columns, texts):
        if columns + ",shard,shard_position\n" != header:
            raise BuildError(f"{staged(cfg, RECORDS)} has columns {columns!r}, expected {record_fields(cfg)}")
        batch: list[bytes] = []
        seen = 0
        for number, text in enumerate(texts):
            if number >= count:
                raise BuildError(f"{staged(cfg, RECORDS)} holds more rows than were planned")
            seen += 1
            line = f"{text},{suffixes[layout.shard_of[number]]},{position[number]}\n".encode("utf-8", "surrogateescape")
            offsets[number] = at
            at += len(line)
            batch.append(line)
            if len(batch) == 4096:
                out.writelines(batch)
                batch.clear()
        out.writelines(batch)
        offsets[count] = at
    return seen


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
