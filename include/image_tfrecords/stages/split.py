"""Stage 3: resolve duplicates, assign class ids and splits; stage labels.csv and rejects.csv."""

from __future__ import annotations

import contextlib
import csv
from collections import Counter
from typing import TYPE_CHECKING, Any

from ..config import BuildConfig
from ..errors import BuildError
from ..images.quality import FLAGS, parse_flags
from ..images.transform import planned_facts, planned_sizes, too_big
from ..progress import log, summarized
from ..published import layout
from ..published.manifest import Manifest
from ..records.schema import REJECTS_FIELDS, record_fields
from ..rules.base_version import INSPECTION_FIELDS
from ..rules.near_duplicates import Placement, hash_array, place, unreliable
from ..rules.splits import DuplicateResolver, assign_splits, content_columns
from ..staging import (
    DISCOVER_REJECTS,
    DISCOVER_SUMMARY,
    DISCOVERED,
    GROUPS,
    IMAGE_FIELDS,
    INSPECT_REJECTS,
    INSPECTED,
    METADATA,
    NEAR_DUPLICATES,
    RECORDS,
    REJECTS,
    SPLIT_SUMMARY,
    staged,
)
from ..storage import Storage, join
from ..storage.documents import read_json, read_rows, write_json
from ..storage.tables import polars, read_table, write_table
from .inspect import is_image

if TYPE_CHECKING:
    import polars as pl


@summarized
def split_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Stage the records (labels.csv's rows, with class id and split; plan adds the shard) and rejects.csv.

    Class ids never change once given: the previous version's classes keep theirs, new ones are
    appended in sorted order. Fails before anything is written to the shards when nothing is left,
    or when more than ``max_reject_fraction`` of the files were rejected.

    Each record's stored size, channels and format follow from the image options (``transform``); a
    multi-label record's ``label`` is its class names joined by the separator, ``label_id`` their ids;
    the declared labels.csv columns are joined on (``metadata.csv``, in the listing's order), and
    so is the group column's value (``groups.csv``), which keys the split of an image that has one.
    """
    pl = polars()

    inspected = staged(cfg, INSPECTED)
    images = _images(storage, inspected, staged(cfg, DISCOVERED))
    col = {name: i for i, name in enumerate(images.columns)}
    header = ",".join(col)
    resolver = DuplicateResolver(lambda: images.select("filename", "label", "sha256").fill_null("").iter_rows(),
                                 content_columns(storage, inspected, header, col, images))
    found = read_json(storage, staged(cfg, DISCOVER_SUMMARY))
    multi, sep = bool(found.get("multi_label")), cfg.label_separator
    previous = found["previous_version"]
    manifest = layout.read_manifest(storage, join(cfg.dataset_uri, previous)) if previous else None
    known = list(manifest.classes) if manifest else []
    published = _published(cfg, storage, manifest)
    groups = _group_values(cfg, storage, images)
    placement = _near_duplicates(cfg, images, resolver, published, groups)
    for damaged in found.get("damaged_versions", [])[:1]:  # the newest one passed over: keep the ids it gave
        known = _classes_of_damaged(cfg, storage, damaged.split(":", 1)[0], known, multi)
    kept = resolver.kept_labels()
    if multi:
        kept = {name for label_set in kept for name in label_set.split(sep)}
    classes = known + sorted(kept - set(known))
    class_ids = {name: i for i, name in enumerate(classes)}
    earlier = [read_table(storage, staged(cfg, name)) for name in (DISCOVER_REJECTS, INSPECT_REJECTS)]
    records, rejected, near = _records(cfg, storage, images, resolver, placement, published, groups, class_ids, multi)
    rejects = pl.concat([frame.select(REJECTS_FIELDS) for frame in (*earlier, rejected)])
    write_table(storage, staged(cfg, RECORDS), records)
    write_table(storage, staged(cfg, REJECTS), rejects)
    write_table(storage, staged(cfg, NEAR_DUPLICATES), near)
    reasons = Counter(dict(rejects["reason"].fill_null("").value_counts().iter_rows()))
    flagged: Counter[str] = Counter()  # quality flag -> records stored with it
    for flags, count in records["quality"].drop_nulls().value_counts().iter_rows():
        for flag in flags.split("|"):
            flagged[flag] += count
    per_split = _split_sizes(cfg, records)
    summary = {"classes": classes, "multi_label": multi, "previous_version": previous,
               "source_fingerprint": found["fingerprint"],
               "num_records": len(records), "num_rejected": len(rejects), "num_skipped": found["skipped"],
               "skipped_by_kind": found.get("skipped_by_kind", {}),
               "rejects_by_reason": dict(sorted(reasons.items())),
               "quality_flags": {flag: flagged[flag] for flag in FLAGS if flagged[flag]},
               "near_duplicates": {"bits": cfg.near_duplicate_bits, "groups_found": placement.groups,
                                   "records_in_groups": len(near), "kept_across_labels": placement.kept_across_labels,
                                   "gated": placement.gated},
               "splits": per_split}
    write_json(storage, staged(cfg, SPLIT_SUMMARY), summary)
    why = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))
    if records.is_empty():
        raise BuildError(f"no valid images to publish: all {len(rejects)} files were rejected ({why})")
    share = len(rejects) / (len(records) + len(rejects))
    if share > cfg.max_reject_fraction:
        raise BuildError(f"{len(rejects)} of {len(records) + len(rejects)} files rejected ({share:.0%}, more "
                         f"than max_reject_fraction {cfg.max_reject_fraction:g}): {why}; see {staged(cfg, REJECTS)}")
    return {key: summary[key] for key in ("num_records", "num_rejected", "num_skipped")} | {
        "num_classes": len(classes)}


def _images(storage: Storage, inspected: str, discovered: str) -> pl.DataFrame:
    """The images of inspected.csv (``inspected``: a row for each file discovered.csv lists, in its order), each
    with its label (discovered.csv's), as ``IMAGE_FIELDS``."""
    rows = read_table(storage, inspected)
    if tuple(rows.columns) != INSPECTION_FIELDS:
        raise BuildError(f"{inspected} has columns {rows.columns}, expected {INSPECTION_FIELDS}")
    listed = read_table(storage, discovered, columns=["filename", "label"])
    if listed.height != rows.height or not (listed["filename"] == rows["filename"]).all():
        raise BuildError(f"{inspected} does not list the files of {discovered} in its order")
    return rows.with_columns(label=listed["label"]).filter(is_image()).select(IMAGE_FIELDS)


def _records(cfg: BuildConfig, storage: Storage, images: pl.DataFrame, resolver: DuplicateResolver,
             placement: Placement, published: pl.DataFrame, groups: pl.Series,
             class_ids: dict[str, int], multi: bool) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Each image (``images``, ``_images``) as its record (records.csv: ``record_fields``, in the listing's order)
    or its reject (rejects.csv's columns, in the same order), and the kept records' near-duplicate groups
    (near_duplicates.csv). A file is rejected when another of the same content is kept (``resolver``), grouping
    rejects it (``placement``), it has a quality flag ``quality_reject`` names, or the image options would make
    it too big. Its split: its near-duplicate group's, else the previous version's, else the split rule's (of its
    group column value ``groups``, else of its content hash). A multi-label record's ``label_id`` is its class
    ids joined by the separator."""
    pl = polars()

    opts, sep, fields = cfg.image_options, cfg.label_separator, record_fields(cfg)
    frame = images.drop("reason", "detail").with_row_index("number").with_columns(pl.col("label").fill_null(""),
                                                                                   group_value=groups)
    why = pl.DataFrame([(name, sha, *verdict) for (name, sha), verdict in resolver.verdicts.items()],
                       schema={"filename": pl.String, "sha256": pl.String, "reason": pl.String, "detail": pl.String},
                       orient="row")
    frame = frame.join(why, on=["filename", "sha256"], how="left", maintain_order="left")
    if placement.rejected:
        grouped = pl.DataFrame([(number, *verdict) for number, verdict in placement.rejected.items()],
                               schema={"number": pl.UInt32, "why": pl.String, "what": pl.String}, orient="row")
        frame = frame.join(grouped, on="number", how="left", maintain_order="left").with_columns(
            reason=pl.coalesce("reason", "why"), detail=pl.coalesce("detail", "what")).drop("why", "what")
    if reject_flags := set(cfg.quality_reject.split(",")) - {""}:
        hits = {text: ", ".join(f for f in parse_flags(text) if f in reject_flags) or None
                for text in frame["quality"].drop_nulls().unique().to_list()}
        hit = pl.col("quality").replace_strict(hits, default=None, return_dtype=pl.String)
        low = pl.col("reason").is_null() & hit.is_not_null()
        frame = frame.with_columns(reason=pl.when(low).then(pl.lit("low_quality")).otherwise("reason"),
                                   detail=pl.when(low).then(hit).otherwise("detail"))
    before = frame.select("sha256").join(published, on="sha256", how="left", maintain_order="left")
    frame = frame.with_columns(split=_splits_of(cfg, frame, placement, before["split"]),
                               near_group=_placed(before["near_group"], placement.group).alias("near_group"))
    names = {labels: sep.join(str(class_ids[n]) for n in labels.split(sep)) if multi else str(class_ids[labels])
             for labels in frame.filter(pl.col("reason").is_null())["label"].unique().to_list()}
    frame = frame.with_columns(label_id=pl.col("label").replace_strict(names, default=None, return_dtype=pl.String))
    if not opts.is_default:
        frame = _planned(cfg, frame)
    if cfg.columns:
        frame = frame.drop(*(name for name in cfg.columns if name in frame.columns)).join(
            _metadata(cfg, storage), on="filename", how="left", maintain_order="left")
        if (lost := frame.filter(pl.col("reason").is_null() & pl.col("__listed").is_null())).height:
            raise BuildError(f"{lost['filename'][0]} has no row in the staged {METADATA}")
    kept = frame.filter(pl.col("reason").is_null())
    records = kept.select(pl.col(name) if name in kept.columns else pl.lit(None, dtype=pl.String).alias(name)
                          for name in fields)
    near = kept.filter(pl.col("near_group").is_not_null()).select(
        "filename", "label", "split", "near_group", "sha256")
    return records, frame.filter(pl.col("reason").is_not_null()).select(REJECTS_FIELDS), near


def _splits_of(cfg: BuildConfig, frame: pl.DataFrame, placement: Placement, before: pl.Series) -> pl.Series:
    """Each image's split: its new near-duplicate group's, else its published one (``before``: null or "" for none),
    else the split rule's (worked out for those images alone)."""
    pl = polars()

    splits = _placed(before, placement.split)
    todo = splits.is_null().arg_true()
    if len(todo):
        groups = frame["group_value"].fill_null("").gather(todo).to_list() if cfg.group_column else None
        ruled = assign_splits(frame["sha256"].fill_null("").gather(todo).to_list(), cfg.salt, cfg.splits, groups)
        splits = splits.scatter(todo, pl.Series(ruled, dtype=pl.String))
    return splits.alias("split")


def _placed(before: pl.Series, placed: dict[int, str]) -> pl.Series:
    """Each image's value (its published split or near-duplicate group, ``before``: null or "" for none), or the one
    ``placed`` (row number -> value: its new group's) gives it; null for none."""
    pl = polars()

    values = before.replace("", None)
    if given := {i: value for i, value in placed.items() if value}:
        values = values.scatter(list(given), pl.Series(list(given.values()), dtype=pl.String))
    return values


def _planned(cfg: BuildConfig, frame: pl.DataFrame) -> pl.DataFrame:
    """The records' facts under non-default image options (``transform.planned_facts``), and the reject
    ``too_many_pixels`` of one the options would make too big."""
    pl = polars()

    facts = ("width", "height", "channels", "format", "transform", "encoded_sha256", "encoded_bytes")
    rows = frame.select("reason", "format", "width", "height", "channels", "transform", "encoded_sha256",
                        "encoded_bytes").iter_rows()
    planned, reasons, details = [], [], []
    for reason, fmt, *rest in rows:
        if reason is not None:
            planned.append((None,) * len(facts))
            reasons.append(reason)
            details.append(None)
            continue
        made = planned_facts(cfg.image_options, fmt or "", *(value or "" for value in rest))
        planned.append(tuple(value or None for value in made))
        detail = too_big(made, cfg.max_pixels)  # upscale: shortest:N of a long strip
        reasons.append("too_many_pixels" if detail else None)
        details.append(detail or None)
    columns = pl.DataFrame(planned, schema=dict.fromkeys(facts, pl.String), orient="row").with_columns(
        too_big=pl.Series(details, dtype=pl.String))
    return frame.with_columns(*(pl.when(pl.col("reason").is_null()).then(columns[name]).otherwise(name).alias(name)
                                for name in facts),
                              detail=pl.coalesce(columns["too_big"], "detail"),
                              reason=pl.Series(reasons, dtype=pl.String))


def _split_sizes(cfg: BuildConfig, records: pl.DataFrame) -> dict[str, dict[str, int]]:
    """Records and planned bytes (``transform.planned_sizes``) of each split, in ``cfg.splits``' order."""
    pl = polars()

    planned = planned_sizes(records, cfg.jpeg_quality, staged(cfg, RECORDS))
    sizes = pl.DataFrame({"split": records["split"], "bytes": planned})
    totals = {split: (count, total) for split, count, total in
              sizes.group_by("split").agg(pl.len(), pl.col("bytes").sum()).iter_rows()}
    return {name: {"num_records": int(totals.get(name, (0, 0))[0]), "num_bytes": int(totals.get(name, (0, 0))[1])}
            for name in cfg.splits}


def _metadata(cfg: BuildConfig, storage: Storage) -> pl.DataFrame:
    """The declared labels.csv columns of each discovered file (metadata.csv, named as ``cfg.columns``), and
    ``__listed`` to tell a file it lists."""
    pl = polars()

    table = read_table(storage, staged(cfg, METADATA))
    return table.rename(dict(zip(table.columns[1:], cfg.columns, strict=True))).with_columns(__listed=pl.lit(True))


def _published(cfg: BuildConfig, storage: Storage, manifest: Manifest | None) -> pl.DataFrame:
    """The previous version's records, which keep their splits, as ``sha256``, ``split`` and ``near_group`` (""
    for none): its labels.csv's, with near_duplicates.csv's groups; nothing when there is none or its splits, salt
    or group column were others (changing them reassigns every image). A previous version that lost those files
    gives what is left (a damaged base is rebuilt in full anyway). Memory: about 100 bytes per record read."""
    pl = polars()

    columns = ["sha256", "split", "near_group"]
    published = pl.DataFrame(schema=dict.fromkeys(columns, pl.String))
    params = manifest.params if manifest is not None else {}
    if manifest is None or (params.get("splits"), params.get("salt"), params.get("group_column", "")) != \
            (cfg.splits, cfg.salt, cfg.group_column):
        return published
    version = join(cfg.dataset_uri, manifest.version)
    with contextlib.suppress(FileNotFoundError):  # none before 0.6.0
        published = read_table(storage, join(version, layout.NEAR_DUPLICATES), columns=columns)
    try:
        labels = read_table(storage, join(version, layout.LABELS), columns=["sha256", "split"])
    except (FileNotFoundError, BuildError) as exc:
        log.warning("near-duplicates: %s of version %s unreadable (%s): its records count as new",
                    layout.LABELS, manifest.version, exc)
        return published.unique("sha256", keep="last", maintain_order=True).fill_null("")
    return labels.join(published.select("sha256", "near_group").unique("sha256", keep="last"), on="sha256",
                       how="left", maintain_order="left").unique("sha256", keep="last", maintain_order=True) \
        .fill_null("")  # (a hash listed twice: its last row, one row each for the joins)


def _near_duplicates(cfg: BuildConfig, images: pl.DataFrame, resolver: DuplicateResolver,
                     published: pl.DataFrame, groups: pl.Series) -> Placement:
    """Group the images (``images``, ``_images``) that ``resolver`` keeps and place the groups
    (``rules.near_duplicates``); their row numbers index the placement. An image the reliability
    gate leaves out (``rules.near_duplicates.gated``) is grouped with nothing, and counted."""
    if cfg.near_duplicate_bits <= 0:
        return Placement()
    columns = images.select("filename", "sha256", "label", "phash", "width", "height", "contrast").fill_null("")
    names, shas, labels = (columns[name].to_list() for name in ("filename", "sha256", "label"))
    hashes: list[str] = []
    gated = 0
    for name, sha, _, phash, width, height, contrast in columns.iter_rows():
        value = "" if resolver.verdict(name, sha) else phash
        if value and unreliable(width, height, contrast):
            value = ""
            gated += 1
        hashes.append(value)
    before = dict(zip(published["sha256"], zip(published["split"], published["near_group"], strict=True), strict=True))
    placement = place(names, shas, labels, hash_array(hashes), before, cfg.near_duplicate_bits, cfg.salt,
                      cfg.splits, keep_across_labels=cfg.near_duplicate_labels == "keep",
                      group_values=groups.fill_null("").to_list())
    placement.gated = gated
    log.info("near-duplicates: %d groups of new images (%d bits); %d images rejected; %d left out by the "
             "reliability gate", placement.groups, cfg.near_duplicate_bits, len(placement.rejected), gated)
    return placement


def _group_values(cfg: BuildConfig, storage: Storage, images: pl.DataFrame) -> pl.Series:
    """Each image's group column value (groups.csv, which discovery wrote; null for none), in the images' order;
    all null without a group column."""
    pl = polars()

    if not cfg.group_column:
        return pl.Series("group_value", [None] * images.height, dtype=pl.String)
    table = read_table(storage, staged(cfg, GROUPS))
    values = images.select("filename").join(table.rename({table.columns[1]: "group_value"}).with_columns(
        __listed=pl.lit(True)), on="filename", how="left", maintain_order="left")
    if (lost := values.filter(pl.col("__listed").is_null())).height:
        raise BuildError(f"{lost['filename'][0]} has no row in the staged {GROUPS}")
    return values["group_value"]


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
