"""The dataset card: ``card.md`` and a self-contained ``card.html`` (plus PNGs) describing one version.

``build_card`` is pure: it reads the manifest, streams labels.csv / rejects.csv rows (never holding all
of them: counters per class and split, a few smallest rows, and 8-byte hashes for the diff) and returns
``{relative path: bytes}``. The same inputs always give the same bytes.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from . import card_plot, card_render
from .card_render import Block, Cell, Heading, Img, Para, Table, render_html, render_md
from .card_stats import EXAMPLES, REJECT_EXAMPLES, SAMPLES, Diff, LabelScan, SamplePicker, diff_versions, scan_rejects
from .manifest import ordered_splits

SAMPLE_CLASSES, CHART_CLASSES, LISTED_CLASSES = 50, 50, 100


@dataclass(frozen=True)
class PreviousVersion:
    """The previous published version: its manifest and a fresh iterator over its labels.csv rows."""

    manifest: dict[str, Any]
    labels: Callable[[], Iterable[dict[str, str]]]


# -- the card ------------------------------------------------------------------------------------------
def _per_split(counts: Counter[tuple[str, str]]) -> Counter[str]:
    out: Counter[str] = Counter()
    for (_, split), n in counts.items():
        out[split] += n
    return out


def _mb(num_bytes: float) -> str:
    return f"{num_bytes / 1e6:,.2f}"


def _names(names: list[str]) -> str:
    return ", ".join(names)


class Card:
    """The card's sections, appended in order to ``blocks``; PNGs collected in ``pngs``."""

    def __init__(self, manifest: dict[str, Any], splits: list[str], scan: LabelScan) -> None:
        self.m, self.splits, self.scan = manifest, splits, scan
        self.blocks: list[Block] = []
        self.pngs: dict[str, bytes] = {}

    def _png(self, path: str, data: bytes, alt: str) -> Img:
        self.pngs[path] = data
        return Img(path, alt)

    def header(self) -> None:
        m, classes = self.m, list(self.m.get("classes", []))
        listed = _names(classes[:LISTED_CLASSES]) + (
            f", … and {len(classes) - LISTED_CLASSES:,} more" if len(classes) > LISTED_CLASSES else "")
        self.blocks.append(Table(("field", "value"), [
            ("Dataset", str(m["dataset"])), ("Version", str(m["version"])),
            ("Created from", str(m.get("source", ""))),
            ("As of", str(m.get("as_of") or "not set: every file present when the build ran")),
            ("Records", int(m.get("num_records", 0))), ("Rejected", int(m.get("num_rejected", 0))),
            ("Skipped (not images)", int(m.get("num_skipped", 0))),
            ("Compression", str(m.get("compression", ""))), ("Classes", f"{len(classes):,}: {listed}"),
            ("Previous version", str(m.get("previous_version") or "none")),
        ]))

    def records(self) -> None:
        counts, splits = self.scan.counts, self.splits
        classes = list(self.m.get("classes", []))
        classes += sorted(self.scan.classes() - set(classes))
        ids = {name: i for i, name in enumerate(self.m.get("classes", []))}
        rows: list[tuple[Cell, ...]] = []
        for name in classes:
            values = [counts[name, s] for s in splits]
            rows.append((ids.get(name), name, *values, sum(values)))
        per_split = _per_split(counts)
        rows.append((None, "total", *[per_split[s] for s in splits], sum(per_split.values())))
        self.blocks += [Heading("Records per split and class"), Table(("id", "class", *splits, "total"), rows)]
        for split in splits:
            stated = self.m.get("splits", {}).get(split, {}).get("num_records")
            if stated is not None and stated != per_split[split]:
                self.blocks.append(Para(f"Warning: labels.csv lists {per_split[split]:,} records in split {split}, "
                                        f"the manifest says {stated:,}."))
        shown = classes[:CHART_CLASSES]
        title = "Records per class and split" + (
            f" (first {len(shown)} of {len(classes):,} classes by id)" if len(classes) > len(shown) else "")
        chart = card_plot.records_chart(shown, splits, counts, title)
        self.blocks.append(self._png("card/records.png", chart, title))

    def samples(self, picker: SamplePicker, fetch_image: Callable[[dict[str, str]], bytes | None]) -> None:
        rows: list[tuple[Cell, ...]] = []
        for cid in sorted(picker.by_class):
            thumbs, name = [], ""
            for _, row in picker.by_class[cid].items:
                name = row["label"]
                if len(thumbs) < SAMPLES and (data := fetch_image(row)) is not None:
                    thumb = card_render.thumbnail(data)
                    if thumb is not None:
                        thumbs.append(thumb)
            strip = self._png(f"card/samples/class-{cid:05d}.png", card_render.thumbnail_strip(thumbs),
                              f"samples of {name}") if thumbs else "no image available"
            rows.append((cid, name, strip))
        with_records = len(self.scan.classes())
        note = (f"For each class, the {SAMPLES} records with the smallest sha256 (a choice that does not depend "
                f"on the order of the rows; images that cannot be read are skipped), as thumbnails of at most "
                f"{card_render.THUMB} px.")
        if with_records > len(rows):
            note += f" Showing the first {len(rows)} classes by id of the {with_records:,} classes with records."
        self.blocks += [Heading("Samples"), Para(note)]
        if rows:
            self.blocks.append(Table(("id", "class", "samples"), rows))

    def rejects(self, counts: Counter[str], examples: list[tuple[str, str, str]]) -> None:
        self.blocks.append(Heading("Rejects"))
        if not counts:
            self.blocks.append(Para("No files were rejected."))
            return
        by_count = sorted(counts.items(), key=lambda x: (-x[1], x[0]))
        rows: list[tuple[Cell, ...]] = [(reason, n) for reason, n in by_count]
        rows.append(("total", sum(counts.values())))
        self.blocks += [Table(("reason", "files"), rows),
                        Para(f"Examples: up to {REJECT_EXAMPLES} files, the smallest names of each reason."),
                        Table(("file", "reason", "detail"), [tuple(r) for r in examples])]

    def shards(self) -> None:
        rows: list[tuple[Cell, ...]] = []
        sizes: dict[str, list[int]] = {}
        for split in self.splits:
            shards = self.m.get("splits", {}).get(split, {}).get("shards", [])
            sizes[split] = values = [int(s["num_bytes"]) for s in shards]
            rows.append((split, len(shards), sum(int(s["num_records"]) for s in shards), _mb(sum(values)),
                         *((_mb(min(values)), _mb(statistics.median(values)), _mb(max(values))) if values
                           else ("", "", ""))))
        self.blocks += [Heading("Shards"), Para("Sizes in MB (10^6 bytes)."),
                        Table(("split", "shards", "records", "total MB", "min MB", "median MB", "max MB"), rows)]
        if any(sizes.values()):
            self.blocks.append(self._png("card/shards.png", card_plot.shards_chart(sizes), "Shard sizes"))

    def first_version(self) -> None:
        self.blocks += [Heading("Changes since the previous version"),
                        Para("This is the first version of the dataset: there is no previous version.")]
        self.build()

    def build(self) -> None:
        """How the version was made: incremental on which version (or full, and why), what it reused."""
        build = self.m.get("build")
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
                        ])]

    def changes(self, old_manifest: dict[str, Any], old: LabelScan, diff: Diff) -> None:
        now, before = self.scan.classes(), old.classes()
        added, removed = sorted(now - before), sorted(before - now)
        delta = int(self.m.get("num_records", 0)) - int(old_manifest.get("num_records", 0))
        self.blocks += [
            Heading("Changes since the previous version"),
            Para(f"Compared with version {old_manifest.get('version')}: {delta:+,} records. Images are matched by "
                 "file name; changed means the same file name with new content (sha256); a class is present when "
                 f"it has records. Examples are the {EXAMPLES} smallest names."),
            Table(("change", "count", "examples"), [
                ("images added", diff.added, _names(diff.examples["added"])),
                ("images removed", diff.removed, _names(diff.examples["removed"])),
                ("images changed", diff.changed, _names(diff.examples["changed"])),
                ("classes added", len(added), _names(added[:EXAMPLES])),
                ("classes removed", len(removed), _names(removed[:EXAMPLES])),
            ])]
        now_split, old_split = _per_split(self.scan.counts), _per_split(old.counts)
        splits = self.splits + sorted(set(old_split) - set(self.splits))
        rows: list[tuple[Cell, ...]] = [(s, old_split[s], now_split[s], f"{now_split[s] - old_split[s]:+,}")
                                        for s in splits]
        rows.append(("total", old.counts.total(), self.scan.counts.total(),
                     f"{self.scan.counts.total() - old.counts.total():+,}"))
        self.blocks.append(Table(("split", "previous", "this version", "change"), rows))
        self.build()

    def params(self) -> None:
        params = self.m.get("params", {})
        fractions = params.get("splits", {})
        order = [s for s in self.splits if s in fractions]
        self.blocks += [Heading("Parameters"), Table(("parameter", "value"), [
            ("splits", ", ".join(f"{s}={fractions[s]:g}" if isinstance(fractions[s], int | float)
                                 else f"{s}={fractions[s]}" for s in order)),
            ("salt", repr(params.get("salt", ""))),
            ("shard_size_mb", str(params.get("shard_size_mb", ""))),
            ("compression", str(self.m.get("compression", ""))),
            ("source fingerprint", str(self.m.get("source_fingerprint", ""))),
        ]), Heading("Features"), Table(("key", "dtype", "shape"), [
            (key, str(spec.get("dtype", "")), str(spec.get("shape", "")))
            for key, spec in self.m.get("features", {}).items()])]


def split_names(manifest: dict[str, Any]) -> list[str]:
    names = list(dict.fromkeys([*manifest.get("splits", {}), *manifest.get("params", {}).get("splits", {})]))
    return ordered_splits(names)


def build_card(manifest: dict, labels: Callable[[], Iterable[dict[str, str]]],
               rejects: Callable[[], Iterable[dict[str, str]]],
               previous: PreviousVersion | None,
               fetch_image: Callable[[dict[str, str]], bytes | None]) -> dict[str, bytes]:
    """Render the dataset card of one version: ``{"card.md": ..., "card.html": ..., "card/*.png": ...}``."""
    picker = SamplePicker(SAMPLE_CLASSES, 2 * SAMPLES)  # spares for images that cannot be fetched
    scan = LabelScan.of(labels(), picker, hashes=previous is not None)
    card = Card(manifest, split_names(manifest), scan)
    card.header()
    card.records()
    card.samples(picker, fetch_image)
    card.rejects(*scan_rejects(rejects()))
    card.shards()
    if previous is None:
        card.first_version()
    else:
        old = LabelScan.of(previous.labels(), None, hashes=True)
        card.changes(previous.manifest, old, diff_versions(scan, labels, old, previous.labels))
    card.params()
    title = f"Dataset card: {manifest['dataset']} {manifest['version']}"
    blocks: list[Block] = [Heading(title, 1), *card.blocks]
    return {"card.md": render_md(blocks).encode(), "card.html": render_html(blocks, title, card.pngs).encode(),
            **dict(sorted(card.pngs.items()))}


