"""The dataset card: ``card.md`` and a self-contained ``card.html`` (plus PNGs) describing one version.

``build_card`` is pure: it reads the manifest, labels.csv as a polars table (``label_table``: counters per class and
split, a few smallest rows, and 8-byte hashes for the diff come from its columns) and rejects.csv's rows, and returns
``{relative path: bytes}``. The same inputs always give the same bytes.

A multi-label manifest (``"multi_label": true``) has rows whose ``label`` / ``label_id`` join several
classes with ``label_separator``: each record counts once for each of its classes, and the card adds
records per number of classes and the pairs of classes found together most often.
"""

from __future__ import annotations

import json
import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ..config import measures_png
from ..images.transform import ImageOptions
from ..published import counts
from ..published.manifest import Manifest, as_manifest
from ..records.schema import ordered_splits
from . import plot, render
from .gate_verdict import pending_blocks
from .load_snippets import load_blocks
from .near_duplicates import NearDuplicateView, near_duplicate_blocks
from .quality import QualityScan, quality_blocks
from .render import Block, Cell, Heading, Img, Para, Table, render_html, render_md
from .stats import (
    EXAMPLES,
    PAIR_CLASSES,
    REJECT_EXAMPLES,
    SAMPLES,
    STRIPS_FILE,
    Diff,
    LabelScan,
    SamplePicker,
    diff_versions,
    scan_rejects,
)

SAMPLE_CLASSES, CHART_CLASSES, LISTED_CLASSES, TOP_PAIRS = 50, 50, 100, 20
# The image options of a build (manifest["image"]); a manifest from before them: images stored as read.
IMAGE_DEFAULTS: dict[str, Any] = ImageOptions().describe()
_ENCODINGS = {"original": "original (as stored; a resized image is re-encoded in its own format)",
              "jpeg": "jpeg (every image encoded as JPEG)", "png": "png (every image encoded as lossless PNG)",
              "raw": "raw (uint8 pixels, height x width x channels, in image/raw with image/shape)"}
_FITS = {"crop": "crop (scaled to cover, centre cropped)", "pad": "pad (scaled to fit, centred, padded with black)",
         "stretch": "stretch (scaled to the size, aspect ratio not kept)"}
_CHANNELS = {1: "1 (grayscale)", 3: "3 (RGB)", 4: "4 (RGBA)"}


def separator_of(manifest: Manifest) -> str | None:
    """The separator of a multi-label manifest's label cells; None for a single-label one."""
    return manifest.separator if manifest.multi_label else None


@dataclass(frozen=True)
class PreviousVersion:
    """The previous published version: its manifest and its labels.csv (``label_table.label_table`` reads it)."""

    manifest: Manifest | dict[str, Any]
    labels: Callable[[], Iterable[dict[str, str]]]


# -- the card ------------------------------------------------------------------------------------------
def _per_split(by_class: Counter[tuple[str, str]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for (_, split), n in by_class.items():
        out[split] += n
    return out


def _mb(num_bytes: float) -> str:
    return f"{num_bytes / 1e6:,.2f}"


def _names(names: list[str]) -> str:
    return ", ".join(names)


def _shape(shape: Any) -> str:
    """A feature's shape: ``[]`` scalar, ``[variable length]`` for a null dimension, ``[3]``."""
    if not isinstance(shape, list | tuple):
        return str(shape)
    return "[" + ", ".join("variable length" if d is None else str(d) for d in shape) + "]"


def _resize(value: str) -> str:
    kind, _, size = value.partition(":")
    if value == "none":
        return "none (original size)"
    if kind == "longest" and size:
        return f"{value} (longest side {size} px)"
    if kind == "shortest" and size:
        return f"{value} (shortest side {size} px)"
    width, x, height = value.partition("x")
    return f"{value} ({width} px wide, {height} px high)" if x and width.isdigit() and height.isdigit() else value


def _channels(value: Any, encoding: str) -> str:
    if str(value) in ("0", "None", ""):
        return "0 (3 for raw: RGB)" if encoding == "raw" else "0 (as decoded)"
    return _CHANNELS.get(value, str(value)) if isinstance(value, int) else str(value)


class Card:
    """The card's sections, appended in order to ``blocks``; PNGs collected in ``pngs``."""

    def __init__(self, manifest: Manifest, splits: list[str], scan: LabelScan,
                 fetch_image: Callable[[dict[str, str]], bytes | None] = lambda _row: None,
                 previous_strip: Callable[[str, list[str]], bytes | None] = lambda _path, _key: None) -> None:
        self.m, self.splits, self.scan = manifest, splits, scan
        self.separator = separator_of(manifest)
        self.blocks: list[Block] = []
        self.pngs: dict[str, bytes] = {}
        self.fetch_image, self.previous_strip = fetch_image, previous_strip
        self.strip_keys: dict[str, list[str]] = {}  # thumbnail strip -> the content hashes it was made from

    def strip(self, path: str, rows: list[dict[str, str]], limit: int, alt: str) -> Cell:
        """A strip of thumbnails of the first ``limit`` of ``rows`` that can be fetched, under ``path``: the
        previous version's strip when it was made from the same candidates (``previous_strip``: no image
        read, no PNG encoded), else made afresh. ``strips.json`` keeps each strip's candidates for the next."""
        key = [row["sha256"] for row in rows]
        data = self.previous_strip(path, key)
        if data is None:
            thumbs: list[Any] = []
            for row in rows:
                if len(thumbs) >= limit:
                    break
                if (image := self.fetch_image(row)) is not None and (thumb := render.thumbnail(image)) is not None:
                    thumbs.append(thumb)
            if not thumbs:
                return "no image available"
            data = render.thumbnail_strip(thumbs)
        self.strip_keys[path] = key
        return self._png(path, data, alt)

    def _png(self, path: str, data: bytes, alt: str) -> Img:
        self.pngs[path] = data
        return Img(path, alt)

    def _split_legend(self, legend: dict[str, str], per_split: str) -> dict[str, str]:
        """``legend`` with a column for each split, ``per_split`` formatted with its name."""
        return {**{split: per_split.format(split) for split in self.splits}, **legend}

    def header(self) -> None:
        m, classes = self.m, list(self.m.classes)
        listed = _names(classes[:LISTED_CLASSES]) + (
            f", … and {len(classes) - LISTED_CLASSES:,} more" if len(classes) > LISTED_CLASSES else "")
        self.blocks.append(Table(("field", "value"), [
            ("Dataset", m.dataset), ("Version", m.version), ("Created from", m.source),
            ("As of", m.as_of or "not set: every file present when the build ran"),
            ("Records", counts.records(m)), ("Rejected", counts.rejected(m)), ("Skipped (not images)", m.num_skipped),
            ("Compression", m.compression), ("Classes", f"{len(classes):,}: {listed}"),
            *([("Labels", f"multi-label: a record has any number of classes, joined by {self.separator!r} "
                          "in labels.csv")] if self.separator is not None else []),
            ("Previous version", m.previous_version or "none"),
        ], legend={"field": "what is described", "value": "its value for this version. Records: the records the "
                   "shards hold (one per stored image); Rejected: source files not stored, each with a reason "
                   "(Rejects below, rejects.csv); Skipped: files never opened (hidden, or not named as an image); "
                   "As of: the snapshot time of the source (files changed later are not in the version)"}))

    def records(self) -> None:
        class_counts, splits = self.scan.counts, self.splits
        classes = list(self.m.classes)
        classes += sorted(self.scan.classes() - set(classes))
        ids = {name: i for i, name in enumerate(self.m.classes)}
        rows: list[tuple[Cell, ...]] = []
        for name in classes:
            values = [class_counts[name, s] for s in splits]
            rows.append((ids.get(name), name, *values, sum(values)))
        per_split = self.scan.records
        if self.separator is not None:
            labels = _per_split(class_counts)
            rows.append((None, "class labels", *[labels[s] for s in splits], sum(labels.values())))
            rows.append((None, "records", *[per_split[s] for s in splits], sum(per_split.values())))
        else:
            rows.append((None, "total", *[per_split[s] for s in splits], sum(per_split.values())))
        self.blocks.append(Heading("Records per split and class"))
        if self.separator is not None:
            self.blocks.append(Para("Multi-label: a record counts once for each of its classes. The classes add "
                                    "up to the class labels row, more than the records row when records have "
                                    "several classes."))
        self.blocks.append(Table(("id", "class", *splits, "total"), rows, legend=self._split_legend(
            {"id": "the class id, the record's image/class/label (labels.txt maps ids to names)",
             "class": "the class name; the last row" + ("s add up the class labels and the records"
                                                        if self.separator is not None else " adds up every class"),
             "total": "all splits together"}, "records of the class in the {} split")))
        for split in splits:
            stated = self.m.splits[split].num_records if split in self.m.splits else None
            if stated is not None and stated != per_split[split]:
                self.blocks.append(Para(f"Warning: labels.csv lists {per_split[split]:,} records in split {split}, "
                                        f"the manifest says {stated:,}."))
        shown = classes[:CHART_CLASSES]
        title = "Records per class and split" + (
            f" (first {len(shown)} of {len(classes):,} classes by id)" if len(classes) > len(shown) else "")
        chart = plot.records_chart(shown, splits, class_counts, title)
        self.blocks.append(self._png("card/records.png", chart, title))

    def label_sets(self) -> None:
        """Multi-label: records per number of classes, per split."""
        sizes, splits = self.scan.sizes, self.splits
        buckets: list[tuple[str, Callable[[int], bool]]] = [("1", lambda n: n == 1), ("2", lambda n: n == 2),
                                                             ("3+", lambda n: n >= 3)]
        if any(n == 0 for n, _ in sizes):
            buckets.insert(0, ("0", lambda n: n == 0))
        rows: list[tuple[Cell, ...]] = []
        for label, test in buckets:
            values = [sum(c for (n, s), c in sizes.items() if s == split and test(n)) for split in splits]
            rows.append((label, *values, sum(values)))
        records, labels = self.scan.records, _per_split(self.scan.counts)
        rows.append(("mean", *[f"{labels[s] / records[s]:.2f}" if records[s] else "" for s in splits],
                     f"{labels.total() / records.total():.2f}" if records.total() else ""))
        most = max((n for n, _ in sizes), default=0)
        self.blocks += [Heading("Classes per record"),
                        Para(f"Records by their number of classes; the most classes on one record: {most:,}."),
                        Table(("classes", *splits, "total"), rows, legend=self._split_legend(
                            {"classes": "the number of classes of a record (mean: classes per record)",
                             "total": "all splits together"}, "records in the {} split with that many classes"))]

    def cooccurrence(self) -> None:
        """Multi-label: the pairs of classes found together on the most records."""
        scan, names = self.scan, list(self.m.classes)
        by_id = {cid: name for name, cid in scan.ids.items()} | dict(enumerate(names))
        top = scan.top_pairs(TOP_PAIRS)
        self.blocks.append(Heading("Classes found together"))
        if not top:
            self.blocks.append(Para("No record has two or more classes."))
            return
        totals = scan.class_totals()
        note = (f"The {len(top)} pairs of classes found together on the most records (all splits); share: of "
                "the records of the rarer class of the pair.")
        if scan.pairs_among is not None:
            bound = scan.rarest_left_out()
            note += (f" Pairs are counted among the {scan.pairs_among:,} classes with the most records: a pair "
                     f"with another class is on at most {bound:,} records"
                     + (", so these are the top pairs of all classes." if top[-1][2] >= bound
                        and len(top) == TOP_PAIRS else "."))
        rows: list[tuple[Cell, ...]] = []
        for a, b, n in top:
            rarer = min(totals[by_id.get(a, "")], totals[by_id.get(b, "")])
            rows.append((a, by_id.get(a, ""), b, by_id.get(b, ""), n, f"{100 * n / rarer:.1f}%" if rarer else ""))
        self.blocks += [Para(note), Table(("id", "class", "id", "class", "records", "share"), rows, legend={
            "id": "a class id", "class": "its name", "records": "records that have both classes",
            "share": "those records as a share of the records of the rarer of the two classes"})]

    def samples(self, picker: SamplePicker) -> None:
        rows: list[tuple[Cell, ...]] = []
        for cid in sorted(picker.by_class):
            name = picker.names[cid]
            strip = self.strip(f"card/samples/class-{cid:05d}.png", [row for _, row in picker.by_class[cid].items],
                               SAMPLES, f"samples of {name}")
            rows.append((cid, name, strip))
        with_records = len(self.scan.classes())
        note = (f"For each class, the {SAMPLES} records with the smallest sha256 (a choice that does not depend "
                f"on the order of the rows; images that cannot be read are skipped), as thumbnails of at most "
                f"{render.THUMB} px.")
        if self.separator is not None:
            note += " A record with several classes can show under each of them."
        if with_records > len(rows):
            note += f" Showing the first {len(rows)} classes by id of the {with_records:,} classes with records."
        self.blocks += [Heading("Samples"), Para(note)]
        if rows:
            self.blocks.append(Table(("id", "class", "samples"), rows, legend={
                "id": "the class id", "class": "the class name",
                "samples": f"thumbnails of up to {SAMPLES} of its records, smallest sha256 first"}))

    def quality(self, scan: QualityScan) -> None:
        params = self.m.params
        recorded = "quality_flags" in (self.m.build or {})  # (the manifest's counts: what the datasets page shows)
        self.blocks += quality_blocks(
            scan, counts.records(self.m), self.strip, class_records=self.scan.class_totals(),
            flag_counts=counts.quality_flags(self.m) if recorded else None,
            pngs_measured=measures_png(int(params.get("near_duplicate_bits") or 0),
                                       str(params.get("quality_reject") or "")))

    def rejects(self, reasons: Counter[str], examples: list[tuple[str, str, str]]) -> None:
        self.blocks.append(Heading("Rejects"))
        if not reasons:
            self.blocks.append(Para("No files were rejected."))
            return
        by_count = sorted(reasons.items(), key=lambda x: (-x[1], x[0]))
        rows: list[tuple[Cell, ...]] = [(reason, n) for reason, n in by_count]
        rows.append(("total", sum(reasons.values())))
        self.blocks += [Table(("reason", "files"), rows, legend={
                            "reason": "why the files were not stored (docs/bad-input.md lists every reason)",
                            "files": "source files rejected for it; the total is the Rejected count above"}),
                        Para(f"Examples: up to {REJECT_EXAMPLES} files, the smallest names of each reason."),
                        Table(("file", "reason", "detail"), [tuple(r) for r in examples], legend={
                            "file": "the file's path under the source", "reason": "why it was rejected",
                            "detail": "what the check found (at most 200 characters)"})]

    def shards(self) -> None:
        rows: list[tuple[Cell, ...]] = []
        sizes: dict[str, list[int]] = {}
        for split in self.splits:
            shards = self.m.splits[split].shards if split in self.m.splits else ()
            sizes[split] = values = [s.num_bytes for s in shards]
            rows.append((split, len(shards), sum(s.num_records for s in shards), _mb(sum(values)),
                         *((_mb(min(values)), _mb(statistics.median(values)), _mb(max(values))) if values
                           else ("", "", ""))))
        self.blocks += [Heading("Shards"), Para("Sizes in MB (10^6 bytes)."),
                        Table(("split", "shards", "records", "total MB", "min MB", "median MB", "max MB"), rows,
                              legend={"split": "the split", "shards": "its TFRecord files",
                                      "records": "the records they hold together (as in Records per split and class)",
                                      "total MB": "their size together", "min MB": "the smallest shard",
                                      "median MB": "the median shard", "max MB": "the largest shard"})]
        if any(sizes.values()):
            self.blocks.append(self._png("card/shards.png", plot.shards_chart(sizes), "Shard sizes"))

    def first_version(self) -> None:
        self.blocks += [Heading("Changes since the previous version"),
                        Para("This is the first version of the dataset: there is no previous version.")]
        self.build()

    def build(self) -> None:
        """How the version was made: incremental on which version (or full, and why), what it reused."""
        build = self.m.build
        if not build:
            return
        how = (f"incremental, on version {build.get('base_version')}" if build.get("mode") == "incremental"
               else f"full rebuild ({build.get('full_because')})")
        self.blocks += [Para("How this version was built: reused shards were copied from the previous version "
                             "unchanged; rewritten ones were copied record by record from a previous shard, without "
                             "the records that left; written ones were made from the source images."),
                        Table(("build", "value"), [
                            ("mode", how),
                            ("shards reused", int(build.get("shards_reused", 0))),
                            ("shards rewritten", int(build.get("shards_rewritten", 0))),
                            ("shards written", int(build.get("shards_written", 0))),
                            ("files inspected", int(build.get("files_inspected", 0))),
                            ("inspections reused", int(build.get("inspections_reused", 0))),
                            ("MB read from the source", _mb(build.get("source_bytes_read", 0))),
                        ], legend={"build": "what is counted", "value": "its value for this build. Files inspected: "
                                   "source files read and checked by this build; inspections reused: files unchanged "
                                   "since the previous version, whose checks were taken over"})]

    def changes(self, old_manifest: Manifest, old: LabelScan, diff: Diff) -> None:
        now, before = self.scan.classes(), old.classes()
        added, removed = sorted(now - before), sorted(before - now)
        delta = self.m.num_records - old_manifest.num_records
        self.blocks += [
            Heading("Changes since the previous version"),
            Para(f"Compared with version {old_manifest.version}: {delta:+,} records. Images are matched by "
                 "file name; changed means the same file name with new content (sha256); a class is present when "
                 f"it has records. Examples are the {EXAMPLES} smallest names."),
            Table(("change", "count", "examples"), legend={
                "change": "what changed since the previous version", "count": "how many images or classes",
                "examples": f"up to {EXAMPLES} of them, the smallest names"}, rows=[
                ("images added", diff.added, _names(diff.examples["added"])),
                ("images removed", diff.removed, _names(diff.examples["removed"])),
                ("images changed", diff.changed, _names(diff.examples["changed"])),
                *([("images relabelled", diff.relabelled, _names(diff.examples["relabelled"]))]
                  if diff.relabelled is not None else []),  # multi-label: same file name, other classes
                ("classes added", len(added), _names(added[:EXAMPLES])),
                ("classes removed", len(removed), _names(removed[:EXAMPLES])),
            ])]
        now_split, old_split = self.scan.records, old.records
        splits = self.splits + sorted(set(old_split) - set(self.splits))
        rows: list[tuple[Cell, ...]] = [(s, old_split[s], now_split[s], f"{now_split[s] - old_split[s]:+,}")
                                        for s in splits]
        rows.append(("total", old_split.total(), now_split.total(), f"{now_split.total() - old_split.total():+,}"))
        self.blocks.append(Table(("split", "previous", "this version", "change"), rows, legend={
            "split": "the split", "previous": f"its records in version {old_manifest.version}",
            "this version": "its records now", "change": "this version minus the previous"}))
        self.build()

    def params(self) -> None:
        params = self.m.params
        fractions = params.get("splits", {})
        order = [s for s in self.splits if s in fractions]
        self.blocks += [Heading("Parameters"), Table(("parameter", "value"), [
            ("splits", ", ".join(f"{s}={fractions[s]:g}" if isinstance(fractions[s], int | float)
                                 else f"{s}={fractions[s]}" for s in order)),
            ("salt", repr(params.get("salt", ""))),
            ("shard_size_mb", str(params.get("shard_size_mb", ""))),
            ("compression", self.m.compression),
            ("source fingerprint", self.m.source_fingerprint),
        ], legend={"parameter": "a build option (docs/configuration.md)", "value": "its value for this version. "
                   "splits: each split's fraction of the records; salt: mixed into each image's content hash, which "
                   "picks its split; source fingerprint: a hash of the source's listing (names, sizes, modification "
                   "times) and of the release and params"})]
        self.images()
        self.labels()
        self.blocks += [Heading("Features"), Table(("key", "dtype", "shape"), [
            (key, str(spec.get("dtype", "")), _shape(spec.get("shape", "")))
            for key, spec in (self.m.features or {}).items()], legend={
                "key": "the feature's key in each record (a tf.train.Example)",
                "dtype": "its type: string (bytes), int64 or float32",
                "shape": "[] one value, [n] n values, [variable length] a list"})]

    def images(self) -> None:
        """The image options the version was built with (a manifest from before them: images as read)."""
        image, params = self.m.image, self.m.params  # image: None where the manifest records no image options
        given = image if image is not None else params
        o = IMAGE_DEFAULTS | {k: given[k] for k in IMAGE_DEFAULTS if given.get(k) is not None}
        resize, encoding = str(o["resize"]), str(o["encoding"])
        sized = resize not in ("none", "") and "x" in resize and ":" not in resize
        self.blocks.append(Heading("Images", 3))
        if image is None and not any(k in params for k in IMAGE_DEFAULTS):
            self.blocks.append(Para("The manifest records no image options (a build from before them): images "
                                    "are as stored (original), at their own size."))
        self.blocks.append(Table(("option", "value"), [
            ("resize", _resize(resize)),
            ("fit", _FITS.get(str(o["fit"]), str(o["fit"])) if sized else f"{o['fit']} (used only with a WxH resize)"),
            ("upscale", "yes: small images are enlarged" if o["upscale"] else "no: images are never enlarged"),
            ("encoding", _ENCODINGS.get(encoding, encoding)),
            ("jpeg_quality", f"{o['jpeg_quality']}" + (" (not used)" if encoding in ("png", "raw") else "")),
            ("channels", _channels(o["channels"], encoding)),
            ("filter", str(o["filter"]) + ("" if resize not in ("none", "") else " (not used: no resize)")),
        ], legend={"option": "an image option of the build (docs/features.md)",
                   "value": "its value for this version, and what it does"}))

    def labels(self) -> None:
        """Single- or multi-label, the separator, and the labels.csv metadata columns stored as features."""
        sep, columns = self.m.separator, self.m.columns
        multi = self.separator is not None
        rows: list[tuple[Cell, ...]] = [
            ("labels", "multi-label: a record has any number of classes (image/class/label and image/class/text "
                       "are lists)" if multi else "single-label: one class per record")]
        if multi or self.m.label_separator is not None:
            rows.append(("label separator", repr(sep)))
        self.blocks += [Heading("Labels", 3), Table(("option", "value"), rows, legend={
                            "option": "how labels are read", "value": "its value for this version"}),
                        Heading("Metadata columns", 3)]
        if not columns:
            self.blocks.append(Para("No metadata columns: the records hold no labels.csv columns."))
            return
        features = self.m.features or {}
        self.blocks += [Para(f"labels.csv columns stored in each record, under the column's name; list types "
                             f"split a cell on {sep!r}, an empty cell is an empty list."),
                        Table(("column", "type", "dtype", "shape"), [
                            (str(name), str(kind), str(features.get(name, {}).get("dtype", "")),
                             _shape(features.get(name, {}).get("shape", "")))
                            for name, kind in columns.items()], legend={
                            "column": "the labels.csv column, and the feature's key", "type": "its type as given to "
                            "the build (--columns)", "dtype": "the feature's type in the record",
                            "shape": "[] one value, [variable length] a list"})]


def split_names(manifest: Manifest) -> list[str]:
    names = list(dict.fromkeys([*manifest.splits, *manifest.params.get("splits", {})]))
    return ordered_splits(names)


@dataclass
class LabelFacts:
    """What the card's one pass over labels.csv (with rejects.csv and near_duplicates.csv) and its diff against
    the previous version learn: all the card shows that the manifest does not give. ``separator``,
    ``classes`` (how many) and ``previous_version`` are what the pass assumed of the manifest."""

    separator: str | None
    classes: int
    previous_version: str | None
    scan: LabelScan
    picker: SamplePicker
    quality: QualityScan
    near: NearDuplicateView
    rejects: tuple[Counter[str], list[tuple[str, str, str]]]
    old: LabelScan | None = None  # the previous version's scan (None: no previous version)
    diff: Diff | None = None


def scan_labels(separator: str | None, classes: int, labels: Callable[[], Iterable[dict[str, str]]],
                rejects: Callable[[], Iterable[dict[str, str]]], previous: PreviousVersion | None,
                near_rows: Callable[[], Iterable[dict[str, str]]] | None = None) -> LabelFacts:
    """The card's pass over labels.csv (the costly part of a card: the command line runs it beside the writing of
    the shards, before the manifest exists) for a version with ``classes`` classes and ``separator``: one pass
    over its columns (``label_table.scan_table``), whatever its file names hold."""
    from .label_table import REQUIRED, label_table, names_at, scan_table

    old_manifest = as_manifest(previous.manifest) if previous is not None else None
    old_separator = separator_of(old_manifest) if old_manifest is not None else None
    relabels = separator is not None or old_separator is not None  # multi-label: compare label sets too
    near = NearDuplicateView.of(near_rows() if near_rows is not None else [])
    picker = SamplePicker(SAMPLE_CLASSES, 2 * SAMPLES)  # spares for images that cannot be fetched
    quality = QualityScan(SAMPLE_CLASSES)
    table = label_table(labels)
    scan = scan_table(table, separator, picker, quality, near, pairs=separator is not None,
                      pair_limit=None if classes <= PAIR_CLASSES else PAIR_CLASSES, labelsets=relabels)
    facts = LabelFacts(separator, classes, old_manifest.version if old_manifest is not None else None, scan,
                       picker, quality, near, scan_rejects(rejects()))
    if previous is not None and old_manifest is not None:
        old_table = label_table(previous.labels, list(REQUIRED))  # (its labels.csv as published: no scan is kept)
        old = scan_table(old_table, old_separator, labelsets=relabels)
        facts.old, facts.diff = old, diff_versions(scan, names_at(table), old, names_at(old_table))
    return facts


def build_card(manifest: Manifest | dict[str, Any], labels: Callable[[], Iterable[dict[str, str]]],
               rejects: Callable[[], Iterable[dict[str, str]]],
               previous: PreviousVersion | None,
               fetch_image: Callable[[dict[str, str]], bytes | None],
               near_rows: Callable[[], Iterable[dict[str, str]]] | None = None,
               previous_strip: Callable[[str, list[str]], bytes | None] = lambda _path, _key: None,
               facts: LabelFacts | None = None, uri: str = "") -> dict[str, bytes]:
    """Render the dataset card of one version: ``{"card.md": ..., "card.html": ..., "card/*.png": ...}``.
    ``facts``: ``scan_labels`` of the same rows, made earlier (scanned again unless it assumed this manifest);
    ``uri``: where the version is published, for the "Load this version" snippets (none without it)."""
    manifest = as_manifest(manifest)
    old_manifest = as_manifest(previous.manifest) if previous is not None else None
    separator = separator_of(manifest)
    assumed = (separator, len(manifest.classes), old_manifest.version if old_manifest is not None else None)
    if facts is None or (facts.separator, facts.classes, facts.previous_version) != assumed:
        facts = scan_labels(separator, len(manifest.classes), labels, rejects, previous, near_rows)
    scan = facts.scan
    card = Card(manifest, split_names(manifest), scan, fetch_image, previous_strip)
    card.header()
    if uri:
        card.blocks += load_blocks(uri, manifest)
    card.records()
    if separator is not None:
        card.label_sets()
        card.cooccurrence()
    card.samples(facts.picker)
    card.quality(facts.quality)
    card.blocks += near_duplicate_blocks(facts.near, int(manifest.params.get("near_duplicate_bits") or 0), card.strip,
                                         counts.near_duplicate_groups(manifest),  # (what the datasets page shows)
                                         counts.near_duplicate_gated(manifest))
    card.rejects(*facts.rejects)
    card.shards()
    if old_manifest is None or facts.old is None or facts.diff is None:
        card.first_version()
    else:
        card.changes(old_manifest, facts.old, facts.diff)
    card.blocks += pending_blocks()  # the gate stage puts its verdict here
    card.params()
    title = f"Dataset card: {manifest.dataset} {manifest.version}"
    blocks: list[Block] = [Heading(title, 1), *card.blocks]
    return {"card.md": render_md(blocks).encode(), "card.html": render_html(blocks, title, card.pngs).encode(),
            **dict(sorted(card.pngs.items())),
            STRIPS_FILE: json.dumps({"image": manifest.raw.get("image"), "strips": card.strip_keys},
                                    sort_keys=True, separators=(",", ":")).encode()}
