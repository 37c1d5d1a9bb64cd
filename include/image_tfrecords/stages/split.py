"""Stage 3: resolve duplicates, assign class ids and splits; stage labels.csv and rejects.csv."""

from __future__ import annotations

import contextlib
import csv
import itertools
import operator
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError
from ..images.quality import FLAGS, parse_flags
from ..images.transform import planned_bytes, planned_facts, too_big
from ..options import OPTIONS, default
from ..progress import log, summarized
from ..published import layout
from ..published.layout import NEAR_DUPLICATES_FIELDS
from ..published.manifest import Manifest
from ..records.schema import REJECTS_FIELDS, record_fields
from ..rules.near_duplicates import Placement, hash_array, place, unreliable
from ..rules.splits import DuplicateResolver, assign_split, content_columns, split_assigner, unit_points
from ..staging import (
    DISCOVER_REJECTS,
    DISCOVER_SUMMARY,
    GROUPS,
    IMAGES,
    INSPECT_REJECTS,
    METADATA,
    NEAR_DUPLICATES,
    RECORDS,
    REJECTS,
    SPLIT_SUMMARY,
    staged,
)
from ..storage import Storage, join
from ..storage.csv_blocks import Block, Quoted, blocks, within
from ..storage.documents import RowWriter, list_rows, read_json, read_rows, write_json
from ..storage.row_text import join_rows


@summarized
def split_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Stage the records (labels.csv's rows, with class id and split; plan adds the shard) and rejects.csv.

    Class ids never change once given: the previous version's classes keep theirs, new ones are
    appended in sorted order. Fails before anything is written to the shards when nothing is left,
    or when more than ``max_reject_fraction`` of the files were rejected.

    Each record's stored size, channels and format follow from the image options (``transform``); a
    multi-label record's ``label`` is its class names joined by the separator, ``label_id`` their ids;
    the declared labels.csv columns are joined on (``metadata.csv``, in the same order as images.csv), and
    so is the group column's value (``groups.csv``), which keys the split of an image that has one.
    """
    inspected = staged(cfg, IMAGES)
    with list_rows(storage, inspected) as rows:  # plain lists, not dicts: the passes run over every image
        col = {name: i for i, name in enumerate(rows.fieldnames or ())}
    name, label, sha = col["filename"], col["label"], col["sha256"]

    def images() -> Iterator[tuple[str, str, str]]:
        with list_rows(storage, inspected) as rows:
            yield from ((v[name], v[label], v[sha]) for v in rows.reader)

    header = ",".join(col)
    resolver = DuplicateResolver(images, content_columns(storage, inspected, header, col))
    found = read_json(storage, staged(cfg, DISCOVER_SUMMARY))
    multi, sep = bool(found.get("multi_label")), cfg.label_separator
    previous = found["previous_version"]
    manifest = layout.read_manifest(storage, join(cfg.dataset_uri, previous)) if previous else None
    known = list(manifest.classes) if manifest else []
    published = _published(cfg, storage, manifest)
    placement = _near_duplicates(cfg, storage, inspected, col, resolver, published)
    for damaged in found.get("damaged_versions", [])[:1]:  # the newest one passed over: keep the ids it gave
        known = _classes_of_damaged(cfg, storage, damaged.split(":", 1)[0], known, multi)
    kept = resolver.kept_labels()
    if multi:
        kept = {name for label_set in kept for name in label_set.split(sep)}
    classes = known + sorted(kept - set(known))
    class_ids = {name: i for i, name in enumerate(classes)}
    per_split: dict[str, Counter[str]] = {name: Counter() for name in cfg.splits}
    reasons: Counter[str] = Counter()
    fields = record_fields(cfg)
    reject_flags = set(cfg.quality_reject.split(",")) - {""}
    flagged: Counter[str] = Counter()  # quality flag -> records stored with it
    with RowWriter(storage, staged(cfg, RECORDS), fields) as labels, \
            RowWriter(storage, staged(cfg, REJECTS), REJECTS_FIELDS) as rejects, \
            RowWriter(storage, staged(cfg, NEAR_DUPLICATES), NEAR_DUPLICATES_FIELDS) as near, \
            list_rows(storage, staged(cfg, METADATA)) as metadata, \
            _group_values(cfg, storage) as group_of:
        for earlier in (DISCOVER_REJECTS, INSPECT_REJECTS):
            with read_rows(storage, staged(cfg, earlier)) as rows:
                for row in rows:
                    rejects.write(row)
                    reasons[row["reason"]] += 1
        run = _Run(cfg, col, fields, resolver, published, placement, class_ids, labels, rejects, near, reasons,
                   per_split, flagged)
        as_columns = columnar_ok(cfg, multi, placement, fields, col)
        if not (as_columns and _staged_as_columns(run, storage, inspected, header)):
            with list_rows(storage, inspected) as rows:
                if {name: i for i, name in enumerate(rows.fieldnames or ())} != col:  # (reads the header)
                    raise BuildError(f"{inspected} changed while it was read")
                _rows_records(run, rows, metadata, group_of, multi, sep, reject_flags)
    summary = {"classes": classes, "multi_label": multi, "previous_version": previous,
               "source_fingerprint": found["fingerprint"],
               "num_records": labels.count, "num_rejected": rejects.count, "num_skipped": found["skipped"],
               "skipped_by_kind": found.get("skipped_by_kind", {}),
               "rejects_by_reason": dict(sorted(reasons.items())),
               "quality_flags": {flag: flagged[flag] for flag in FLAGS if flagged[flag]},
               "near_duplicates": {"bits": cfg.near_duplicate_bits, "groups_found": placement.groups,
                                   "records_in_groups": near.count, "kept_across_labels": placement.kept_across_labels,
                                   "gated": placement.gated},
               "splits": {name: {"num_records": c["records"], "num_bytes": c["bytes"]}
                          for name, c in per_split.items()}}
    write_json(storage, staged(cfg, SPLIT_SUMMARY), summary)
    why = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))
    if not labels.count:
        raise BuildError(f"no valid images to publish: all {rejects.count} files were rejected ({why})")
    share = rejects.count / (labels.count + rejects.count)
    if share > cfg.max_reject_fraction:
        raise BuildError(f"{rejects.count} of {labels.count + rejects.count} files rejected ({share:.0%}, more "
                         f"than max_reject_fraction {cfg.max_reject_fraction:g}): {why}; see {staged(cfg, REJECTS)}")
    return {key: summary[key] for key in ("num_records", "num_rejected", "num_skipped")} | {
        "num_classes": len(classes)}


# The options the columnar path is right for at any value: splits and salt (``_block_records`` implements them),
# the near-duplicate search (through ``placement``, checked apart) and those that act before this stage. Any
# other option acting on records (``effect`` records, split or selection) must have its default there: a new
# one is staged row by row until it is added here.
COLUMNAR_OPTIONS = frozenset({"splits", "salt", "source", "as_of", "max_file_mb", "max_pixels", "modern_formats",
                              "near_duplicate_bits", "near_duplicate_labels"})


def columnar_ok(cfg: BuildConfig, multi: bool, placement: Placement, fields: tuple[str, ...],
                col: dict[str, int]) -> bool:
    """Whether each record is its image's images.csv row with its fields reordered, the label's id and the split
    set (``_block_records``): a single-label build without near-duplicate groups, whose records' fields images.csv
    has, and whose options acting on records are those ``COLUMNAR_OPTIONS`` names or at their defaults."""
    if multi or placement.split or placement.group or placement.rejected or \
            not set(fields) <= {*col, "label_id", "split"}:
        return False
    return all(getattr(cfg, o.name) == default(o.name) for o in OPTIONS
               if o.config and o.effect in ("records", "split", "selection") and o.name not in COLUMNAR_OPTIONS)


def _staged_as_columns(run: _Run, storage: Storage, inspected: str, header: str) -> bool:
    """Stage the records block by block (``_block_records``); False, with nothing staged, when images.csv holds a
    quoted field (``blocks`` says so before any block)."""
    try:
        with blocks(storage, inspected, header) as table:
            for part in table:
                _block_records(run, part)
    except Quoted:
        return False
    return True


@dataclass
class _Run:
    """What a pass over images.csv reads (the build's rules) and adds to (the staged tables and the tallies)."""

    cfg: BuildConfig
    col: dict[str, int]  # images.csv column -> its index
    fields: tuple[str, ...]  # records.csv's columns
    resolver: DuplicateResolver
    published: dict[str, tuple[str, str]]
    placement: Placement
    class_ids: dict[str, int]
    labels: RowWriter
    rejects: RowWriter
    near: RowWriter
    reasons: Counter[str]
    per_split: dict[str, Counter[str]]
    flagged: Counter[str]


def _rows_records(run: _Run, rows: Any, metadata: Any, group_of: Callable[[str], str], multi: bool, sep: str,
                  reject_flags: set[str]) -> None:
    """Stage each image's record (or reject) row by row: any build, any table."""
    cfg, col, fields, resolver, published, placement = run.cfg, run.col, run.fields, run.resolver, run.published, \
        run.placement
    class_ids, labels, rejects, near, reasons, per_split = run.class_ids, run.labels, run.rejects, run.near, \
        run.reasons, run.per_split
    opts = cfg.image_options
    name, label, sha = col["filename"], col["label"], col["sha256"]
    # label_id, split and the columns are set below: ``take`` gives them the "" appended to each row
    take = operator.itemgetter(*(col.get(field, len(col)) for field in fields))
    split_of, as_inspected = split_assigner(cfg.salt, cfg.splits), opts.is_default
    label_id, split_at = fields.index("label_id"), fields.index("split")
    facts = [fields.index(f) for f in ("width", "height", "channels", "format", "transform",
                                        "encoded_sha256", "encoded_bytes")]
    width, height, channels, fmt, _, _, size = facts
    quality = col["quality"]
    meta = iter(metadata.reader)
    for number, values in enumerate(rows.reader):
        verdict = resolver.verdict(values[name], values[sha]) or placement.rejected.get(number)
        if verdict:
            rejects.write({"filename": values[name], "reason": verdict[0], "detail": verdict[1]})
            reasons[verdict[0]] += 1
            continue
        if reject_flags and values[quality] and (hit := [f for f in parse_flags(values[quality])
                                                         if f in reject_flags]):
            rejects.write({"filename": values[name], "reason": "low_quality", "detail": ", ".join(hit)})
            reasons["low_quality"] += 1
            continue
        before = published.get(values[sha])
        split = placement.split.get(number) or (before[0] if before else "")
        if not split:
            group = group_of(values[name])
            split = assign_split(values[sha], cfg.salt, cfg.splits, group) if group else split_of(values[sha])
        values.append("")  # what ``take`` gives the fields set below
        record = list(take(values))
        record[split_at] = split
        if multi:
            record[label_id] = sep.join(str(class_ids[n]) for n in values[label].split(sep))
        else:
            record[label_id] = class_ids[values[label]]
        if not as_inspected:
            planned = planned_facts(opts, record[fmt], *(record[i] for i in facts if i != fmt))
            if detail := too_big(planned, cfg.max_pixels):  # upscale: shortest:N of a long strip
                rejects.write({"filename": values[name], "reason": "too_many_pixels", "detail": detail})
                reasons["too_many_pixels"] += 1
                continue
            for i, value in zip(facts, planned, strict=True):
                record[i] = value
        if cfg.columns:
            record[len(fields) - len(cfg.columns):] = _metadata_of(values[name], meta)
        labels.write_values(record)
        if values[quality]:
            run.flagged.update(values[quality].split("|"))
        if group := placement.group.get(number) or (before[1] if before else ""):
            near.write_values([values[name], values[label], split, group, values[sha]])
        per_split[split]["records"] += 1
        per_split[split]["bytes"] += planned_bytes(record[size], record[fmt], record[width], record[height],
                                                   record[channels], cfg.jpeg_quality)


def _block_records(run: _Run, part: Block) -> None:
    """``_rows_records`` for one block of images.csv, as columns: a single-label build with the default image
    options and no declared columns, group column, quality rejects or near-duplicate search, whose records are
    its images' rows with their fields reordered, the label's id and the split set."""
    import numpy as np

    cfg, col, fields = run.cfg, run.col, run.fields
    names, shas = part.column(col["filename"]), part.column(col["sha256"])
    kept = np.ones(len(part), dtype=bool)
    if verdicts := run.resolver.verdicts:  # the few files that share content with another
        suspects = np.flatnonzero(within(names, np.array([n.encode("utf-8", "surrogateescape")
                                                           for n, _ in verdicts], dtype=bytes)))
        for i in suspects.tolist():
            key = (names[i].decode("utf-8", "surrogateescape"), shas[i].decode())
            if verdict := verdicts.get(key):
                run.rejects.write({"filename": key[0], "reason": verdict[0], "detail": verdict[1]})
                run.reasons[verdict[0]] += 1
                kept[i] = False
    rows = np.flatnonzero(kept)
    splits = list(cfg.splits)
    bounds = np.array(list(itertools.accumulate(cfg.splits.values())))
    number = np.minimum(np.searchsorted(bounds, unit_points(("split", cfg.salt), shas[rows].tolist()), side="right"),
                        len(splits) - 1)  # the first split whose bound is above the point (``split_assigner``)
    groups: dict[int, str] = {}
    if run.published:  # images the previous version grouped keep its split and group
        for k, i in enumerate(rows.tolist()):
            if before := run.published.get(shas[i].decode()):
                number[k] = splits.index(before[0])
                groups[k] = before[1]
    label_names, label_of = np.unique(part.column(col["label"])[rows], return_inverse=True)
    ids = [b"%d" % run.class_ids[n.decode("utf-8", "surrogateescape")] for n in label_names.tolist()]
    split_names = [n.encode() for n in splits]
    generated = {"label_id": (ids, label_of.ravel()), "split": (split_names, number)}
    pieces = [generated[run_of[0]] if run_of[0] in generated else
              (part.data, part.starts[rows, col[run_of[0]]], part.stops[rows, col[run_of[-1]]])
              for run_of in _runs(col, fields)]  # (a run of consecutive columns, with the commas between them)
    run.labels.write_text(join_rows(len(rows), pieces)[0], len(rows))
    for split, records in zip(splits, np.bincount(number, minlength=len(splits)).tolist(), strict=True):
        run.per_split[split]["records"] += records
    try:
        sizes = part.integers(col["encoded_bytes"])[rows]
    except ValueError:  # a size left to plan: the row path's rule
        sizes = np.array([planned_bytes(*(part.column(col[f])[i].decode() for f in
                                          ("encoded_bytes", "format", "width", "height", "channels")),
                                        cfg.jpeg_quality) for i in rows.tolist()], dtype=np.int64)
    for split, total in zip(splits, np.bincount(number, weights=sizes, minlength=len(splits)).tolist(), strict=True):
        run.per_split[split]["bytes"] += int(total)
    quality = part.column(col["quality"])[rows]
    for flags in quality[quality != b""].tolist():
        run.flagged.update(flags.decode().split("|"))
    for k, group in groups.items():
        if group:
            i = int(rows[k])
            run.near.write_values([names[i].decode("utf-8", "surrogateescape"),
                                   part.column(col["label"])[i].decode("utf-8", "surrogateescape"),
                                   splits[int(number[k])], group, shas[i].decode()])


def _runs(col: dict[str, int], fields: tuple[str, ...]) -> list[list[str]]:
    """``fields`` cut into runs that are consecutive columns of images.csv (``col``), so that each run is one
    slice of a row; a field images.csv lacks is a run of its own."""
    runs: list[list[str]] = []
    for field in fields:
        if runs and field in col and runs[-1][-1] in col and col[runs[-1][-1]] + 1 == col[field]:
            runs[-1].append(field)
        else:
            runs.append([field])
    return runs


def _published(cfg: BuildConfig, storage: Storage, manifest: Manifest | None) -> dict[str, tuple[str, str]]:
    """Content hash -> (split, near-duplicate group) of the previous version's records, which keep their
    splits; nothing when there is none or its splits, salt or group column were others (changing them
    reassigns every image). With the search off, only its grouped records (``near_duplicates.csv``: the
    others are where the split rule puts them); with it on, all of them (labels.csv: which images are
    new), and with a group column too (an image whose group value was edited stays where it is). A previous
    version that lost those files gives what is left (a damaged base is rebuilt in full anyway).
    Memory: about 200 bytes per record read."""
    params = manifest.params if manifest is not None else {}
    if manifest is None or (params.get("splits"), params.get("salt"), params.get("group_column", "")) != \
            (cfg.splits, cfg.salt, cfg.group_column):
        return {}
    version = join(cfg.dataset_uri, manifest.version)
    grouped: dict[str, tuple[str, str]] = {}
    with contextlib.suppress(FileNotFoundError), read_rows(storage, join(version, layout.NEAR_DUPLICATES)) as rows:
        grouped = {row["sha256"]: (row["split"], row["near_group"]) for row in rows}  # none before 0.6.0
    if cfg.near_duplicate_bits <= 0 and not cfg.group_column:
        return grouped
    published: dict[str, tuple[str, str]] = {}
    try:
        with list_rows(storage, join(version, layout.LABELS)) as rows:
            names = list(rows.fieldnames or ())
            sha, split = names.index("sha256"), names.index("split")
            for values in rows.reader:
                published[values[sha]] = (values[split], grouped.get(values[sha], ("", ""))[1])
    except (FileNotFoundError, ValueError, IndexError, csv.Error) as exc:
        log.warning("near-duplicates: %s of version %s unreadable (%s): its records count as new",
                    layout.LABELS, manifest.version, exc)
        return grouped
    return published


def _near_duplicates(cfg: BuildConfig, storage: Storage, inspected: str, col: dict[str, int],
                     resolver: DuplicateResolver, published: dict[str, tuple[str, str]]) -> Placement:
    """Group the images of ``inspected`` (images.csv) that ``resolver`` keeps and place the groups
    (``rules.near_duplicates``); row numbers of images.csv index the placement. An image the reliability
    gate leaves out (``rules.near_duplicates.gated``) is grouped with nothing, and counted."""
    names: list[str] = []
    shas: list[str] = []
    labels: list[str] = []
    hashes: list[str] = []
    groups: list[str] = []
    if cfg.near_duplicate_bits <= 0:
        return Placement()
    with list_rows(storage, inspected) as rows, _group_values(cfg, storage) as group_of:
        name, label, sha, phash = col["filename"], col["label"], col["sha256"], col["phash"]
        width, height, contrast = col["width"], col["height"], col["contrast"]
        gated = 0
        for values in rows.reader:
            names.append(values[name])
            shas.append(values[sha])
            labels.append(values[label])
            value = "" if resolver.verdict(values[name], values[sha]) else values[phash]
            if value and unreliable(values[width], values[height], values[contrast]):
                value = ""
                gated += 1
            hashes.append(value)
            groups.append(group_of(values[name]))
    placement = place(names, shas, labels, hash_array(hashes), published, cfg.near_duplicate_bits, cfg.salt,
                      cfg.splits, keep_across_labels=cfg.near_duplicate_labels == "keep", group_values=groups)
    placement.gated = gated
    log.info("near-duplicates: %d groups of new images (%d bits); %d images rejected; %d left out by the "
             "reliability gate", placement.groups, cfg.near_duplicate_bits, len(placement.rejected), gated)
    return placement


@contextlib.contextmanager
def _group_values(cfg: BuildConfig, storage: Storage) -> Iterator[Callable[[str], str]]:
    """A function giving each image's group column value, asked in images.csv's order (a subsequence of
    ``groups.csv``'s, which discovery wrote); ``""`` for every image without a group column."""
    if not cfg.group_column:
        yield lambda _filename: ""
        return
    with list_rows(storage, staged(cfg, GROUPS)) as rows:
        values = iter(rows.reader)
        yield lambda filename: _metadata_of(filename, values, GROUPS)[0]


def _metadata_of(filename: str, rows: Iterator[list[str]], table: str = METADATA) -> list[str]:
    """The declared columns of ``filename``: the next row of ``rows`` that names it (both tables list files
    in discovery order, images.csv a subsequence of metadata.csv's)."""
    for values in rows:
        if values[0] == filename:
            return values[1:]
    raise BuildError(f"{filename} has no row in the staged {table}")


def _classes_of_damaged(cfg: BuildConfig, storage: Storage, version: str, known: list[str],
                        multi: bool) -> list[str]:
    """``known`` (the classes of the version before ``version``) followed by the classes ``version`` added,
    in the order of the ids its labels.csv gives them: a published version that lost its manifest still
    decides the ids of the classes it introduced. ``known`` alone when its labels.csv is unreadable too."""
    added: dict[int, str] = {}
    sep = cfg.label_separator
    try:
        with read_rows(storage, join(cfg.dataset_uri, version, layout.LABELS)) as rows:
            for row in rows:
                names, ids = (row.get(k) or "" for k in ("label", "label_id"))
                pairs = zip(names.split(sep), ids.split(sep), strict=False) if multi else [(names, ids)]
                for name, number in pairs:
                    if number.isdigit() and int(number) >= len(known):
                        added.setdefault(int(number), name)
    except (FileNotFoundError, ValueError, UnicodeDecodeError, csv.Error):
        return known
    if sorted(added) != list(range(len(known), len(known) + len(added))) or set(added.values()) & set(known):
        return known  # not ids that extend ``known``: keep nothing of them
    return known + [added[i] for i in sorted(added)]
