"""The dataset card: ``card.md`` and a self-contained ``card.html`` (plus PNGs) describing one version.

``build_card`` is pure: it reads the manifest, streams labels.csv / rejects.csv rows (never holding all
of them: counters per class and split, a few smallest rows, and 8-byte hashes for the diff) and returns
``{relative path: bytes}``. The same inputs always give the same bytes.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import statistics
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from . import card_charts, card_plot
from .card_charts import Block, Cell, Heading, Img, Para, Table, render_html, render_md
from .manifest import ordered_splits

Rows = Callable[[], Iterable[dict[str, str]]]
SAMPLES, SAMPLE_CLASSES, CHART_CLASSES, LISTED_CLASSES = 6, 50, 50, 100
EXAMPLES, REJECT_EXAMPLES = 10, 20


@dataclass(frozen=True)
class PreviousVersion:
    """The previous published version: its manifest and a fresh iterator over its labels.csv rows."""

    manifest: dict[str, Any]
    labels: Callable[[], Iterable[dict[str, str]]]


# -- streaming statistics ----------------------------------------------------------------------------
class Smallest:
    """The ``k`` items with the smallest keys among those offered (bounded memory)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.items: list[tuple[Any, Any]] = []  # (key, item), sorted by key

    def offer(self, key: Any, item: Any = None) -> None:
        if len(self.items) < self.k or key < self.items[-1][0]:
            bisect.insort(self.items, (key, item), key=lambda x: x[0])
            del self.items[self.k:]


class SamplePicker:
    """For the first ``max_classes`` class ids with records, the ``keep`` rows with the smallest sha256."""

    def __init__(self, max_classes: int, keep: int) -> None:
        self.max_classes, self.keep = max_classes, keep
        self.by_class: dict[int, Smallest] = {}
        self._worst = -1

    def offer(self, row: dict[str, str]) -> None:
        cid = int(row["label_id"])
        picks = self.by_class.get(cid)
        if picks is None:
            if len(self.by_class) >= self.max_classes:
                if cid > self._worst:
                    return
                del self.by_class[self._worst]
            picks = self.by_class[cid] = Smallest(self.keep)
            self._worst = max(self.by_class)
        picks.offer((row["sha256"], row["filename"]), row)


def _hash8(text: str) -> bytes:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


@dataclass
class LabelScan:
    """One pass over a labels.csv: records per (class, split), and row hashes for the diff."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)
    names: bytearray = field(default_factory=bytearray)  # 8-byte hash of each filename
    contents: bytearray = field(default_factory=bytearray)  # 8-byte hash of each (filename, sha256)

    @classmethod
    def of(cls, rows: Iterable[dict[str, str]], picker: SamplePicker | None, hashes: bool) -> LabelScan:
        scan = cls()
        for row in rows:
            scan.counts[row["label"], row["split"]] += 1
            if picker is not None:
                picker.offer(row)
            if hashes:
                scan.names += _hash8(row["filename"])
                scan.contents += _hash8(row["filename"] + "\0" + row["sha256"])
        return scan

    def classes(self) -> set[str]:
        return {name for name, _ in self.counts}


def _isin(values: Any, sorted_ref: Any) -> Any:
    """Boolean mask: which of ``values`` occur in the sorted array ``sorted_ref``."""
    import numpy as np

    if not len(sorted_ref):
        return np.zeros(len(values), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_ref, values), len(sorted_ref) - 1)
    return sorted_ref[at] == values


def _chunks(rows: Iterable[dict[str, str]], size: int = 4096) -> Iterator[list[dict[str, str]]]:
    it = iter(rows)
    while chunk := list(islice(it, size)):
        yield chunk


def _examples(rows: Iterable[dict[str, str]], targets: dict[str, Any], k: int = EXAMPLES) -> dict[str, list[str]]:
    """For each target (sorted array of filename hashes), the ``k`` smallest matching file names."""
    import numpy as np

    found: dict[str, list[str]] = {name: [] for name in targets}
    if not any(len(t) for t in targets.values()):
        return found
    for chunk in _chunks(rows):
        hashes = np.frombuffer(b"".join(_hash8(r["filename"]) for r in chunk), dtype="<u8")
        for name, target in targets.items():
            hits = (chunk[i]["filename"] for i in np.flatnonzero(_isin(hashes, target)))
            found[name] = heapq.nsmallest(k, [*found[name], *hits])
    return found


@dataclass
class Diff:
    added: int
    removed: int
    changed: int
    examples: dict[str, list[str]]


def diff_versions(current: LabelScan, labels: Rows, previous: LabelScan, previous_labels: Rows) -> Diff:
    """Images added, removed and changed (same filename, new sha256), with the smallest example names."""
    import numpy as np

    names, contents = (np.frombuffer(b, dtype="<u8") for b in (current.names, current.contents))
    old_names, old_contents = (np.frombuffer(b, dtype="<u8") for b in (previous.names, previous.contents))
    known = _isin(names, np.sort(old_names))
    added = np.sort(names[~known])
    changed = np.sort(names[known & ~_isin(contents, np.sort(old_contents))])
    removed = np.sort(old_names[~_isin(old_names, np.sort(names))])
    examples = _examples(labels(), {"added": added, "changed": changed})
    examples |= _examples(previous_labels(), {"removed": removed})
    return Diff(len(added), len(removed), len(changed), examples)


def scan_rejects(rows: Iterable[dict[str, str]]) -> tuple[Counter[str], list[tuple[str, str, str]]]:
    """Rejects per reason, and up to REJECT_EXAMPLES (filename, reason, detail) spread over the reasons."""
    counts: Counter[str] = Counter()
    smallest: dict[str, Smallest] = {}
    for row in rows:
        reason = row.get("reason") or ""
        counts[reason] += 1
        smallest.setdefault(reason, Smallest(REJECT_EXAMPLES)).offer(row.get("filename") or "",
                                                                      (row.get("detail") or "")[:200])
    picked: list[tuple[str, str, str]] = []
    for rank in range(REJECT_EXAMPLES):  # round robin, so every reason shows
        for reason in sorted(smallest):
            items = smallest[reason].items
            if rank < len(items) and len(picked) < REJECT_EXAMPLES:
                picked.append((items[rank][0], reason, items[rank][1]))
    return counts, sorted(picked, key=lambda r: (r[1], r[0]))


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
                    thumb = card_charts.thumbnail(data)
                    if thumb is not None:
                        thumbs.append(thumb)
            strip = self._png(f"card/samples/class-{cid:05d}.png", card_charts.thumbnail_strip(thumbs),
                              f"samples of {name}") if thumbs else "no image available"
            rows.append((cid, name, strip))
        with_records = len(self.scan.classes())
        note = (f"For each class, the {SAMPLES} records with the smallest sha256 (a choice that does not depend "
                f"on the order of the rows; images that cannot be read are skipped), as thumbnails of at most "
                f"{card_charts.THUMB} px.")
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


