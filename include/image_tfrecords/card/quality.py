"""The card's image-quality section: per-class means of the quality signals, flag shares, classes
that differ from the rest (a shortcut a model will learn), and thumbnails of the worst images.

Fed labels.csv's columns during the card's one pass (``label_table.scan_table``); memory is bounded by the number
of classes shown plus ``WORST`` rows per flag."""

from __future__ import annotations

import heapq
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..images.quality import FLAGS, SIGNALS
from ..published import counts
from .render import Block, Cell, Heading, Para, Table

WORST = 4  # thumbnails shown per flag
MIN_RECORDS = 10  # a class with fewer measured records is not compared with the others
# A class is called skewed when it differs from all the other classes together by more than this
SKEW = {"brightness": 30.0, "colourfulness": 25.0, "pixels": 2.0, "flag_share": 0.25}
_SUMMED = (*SIGNALS, "pixels")  # what ClassQuality.sums holds, in this order
_COLUMNS = (*SIGNALS, "width", "height")  # the labels.csv columns the scan parses


@dataclass
class ClassQuality:
    """Sums over one class's measured records."""

    records: int = 0
    sums: list[float] = field(default_factory=lambda: [0.0] * len(_SUMMED))  # in _SUMMED's order
    flags: Counter[str] = field(default_factory=Counter)

    def mean(self, name: str) -> float:
        return self.sums[_SUMMED.index(name)] / self.records if self.records else 0.0


@dataclass
class QualityScan:
    """The quality columns of a labels.csv, summed per class (ids below ``max_classes``)."""

    max_classes: int = 100
    classes: dict[int, tuple[str, ClassQuality]] = field(default_factory=dict)
    unmeasured: int = 0
    flags: Counter[str] = field(default_factory=Counter)
    worst: dict[str, list[tuple[float, str, dict[str, str]]]] = field(default_factory=dict)  # max-heaps

    def offer_worst(self, flag: str, key: float, row: dict[str, str]) -> None:
        """Offer a row with ``flag`` to that flag's ``WORST`` (``key``: the negated badness; larger is worse)."""
        heap = self.worst.setdefault(flag, [])
        item = (key, row["sha256"], row)
        if len(heap) < WORST:
            heapq.heappush(heap, item)
        elif item[:2] > heap[0][:2]:
            heapq.heapreplace(heap, item)

    def skews(self) -> list[str]:
        """One sentence per class that differs from the other classes together (see ``SKEW``)."""
        total = ClassQuality()
        for _, stats in self.classes.values():
            total.records += stats.records
            total.sums = [a + b for a, b in zip(total.sums, stats.sums, strict=True)]
            total.flags.update(stats.flags)
        out = []
        for cid, (name, stats) in sorted(self.classes.items()):
            rest = ClassQuality(total.records - stats.records,
                                [a - b for a, b in zip(total.sums, stats.sums, strict=True)], total.flags - stats.flags)
            if stats.records < MIN_RECORDS or rest.records < MIN_RECORDS:
                continue
            said = []
            for signal in ("brightness", "colourfulness"):
                if abs(stats.mean(signal) - rest.mean(signal)) > SKEW[signal]:
                    said.append(f"{signal} {stats.mean(signal):.0f} vs {rest.mean(signal):.0f}")
            ratio = stats.mean("pixels") / max(1.0, rest.mean("pixels"))
            if ratio > SKEW["pixels"] or ratio < 1 / SKEW["pixels"]:
                said.append(f"{ratio:.1f}x the pixels")
            for flag in FLAGS:
                mine, theirs = stats.flags[flag] / stats.records, rest.flags[flag] / rest.records
                if mine - theirs > SKEW["flag_share"]:
                    said.append(f"{mine:.0%} {flag} vs {theirs:.0%}")
            if said:
                out.append(f"{cid} {name}: " + "; ".join(said))
        return out


def badness(flag: str, values: Any, measures: Any) -> Any:
    """How bad each of some rows with ``flag`` is, for choosing the worst (smaller is worse): ``values`` holds their
    ``_SUMMED``, ``measures`` their ``_COLUMNS`` (a row each)."""
    import numpy as np

    width, height = measures[:, 4], measures[:, 5]
    signal = {"dark": values[:, 0], "bright": -values[:, 0], "flat": values[:, 1], "blurry": values[:, 2],
              "grey_as_colour": values[:, 3], "tiny": np.minimum(width, height)}
    if flag in signal:
        return signal[flag]
    return -np.maximum(width, height) / np.maximum(1.0, np.minimum(width, height))  # odd_aspect


def measured_text(measured: int, records: int, pngs_measured: bool) -> str:
    """What "measured" covers, for a version whose ``measured`` of ``records`` records were measured; ``pngs_measured``:
    whether its build decoded PNGs for their signals (``config.measures_png`` of its params)."""
    said = (f"{measured:,} of {records:,} records measured. Measured means the quality signals were computed from "
            "the image's thumbnail (a JPEG decoded at 1/8 scale, other formats reduced to at most 256 px).")
    if measured >= records:
        return said
    if pngs_measured:
        return said + (f" The {records - measured:,} not measured are PNGs over 4 MP (decoding one costs 4+ bytes a "
                       "pixel) or images Pillow could not convert; they have no signals and no flags.")
    return said + (f" The {records - measured:,} not measured are PNGs stored as they are (and any image Pillow could "
                   "not convert): this build checked PNGs without decoding their pixels, several times faster, since "
                   "it used no signal to decide; a PNG is measured only with near_duplicate_bits above 0 or a "
                   "quality_reject policy (docs/quality.md). They have no signals and no flags.")


def quality_blocks(scan: QualityScan, records: int,
                   strip: Callable[[str, list[dict[str, str]], int, str], Cell],
                   class_records: Mapping[str, int] | None = None, flag_counts: Mapping[str, int] | None = None,
                   pngs_measured: bool = False) -> list[Block]:
    """The card's blocks for ``scan`` (of ``records`` records); ``strip(path, rows, limit, alt)`` adds a strip of
    thumbnails (``Card.strip``). ``class_records``: records per class name (all of them, measured or not);
    ``flag_counts``: records stored with each flag as the manifest records them (``published.counts.quality_flags``,
    what the datasets page shows; None: the scan's counts); ``pngs_measured``: whether the build measured PNGs."""
    blocks: list[Block] = [Heading("Image quality")]
    if not scan.classes:
        return [*blocks, Para("No quality signals were recorded for this version (built before 0.7.0, or no "
                              "image could be measured).")]
    measured = records - scan.unmeasured
    class_records = class_records or {}
    flagged = dict(flag_counts) if flag_counts is not None else {flag: scan.flags[flag] for flag in FLAGS
                                                                   if scan.flags[flag]}
    blocks.append(Para(measured_text(measured, records, pngs_measured) + " Per class, the means of the signals over "
                       "its measured records, and the records with each flag (flags as in docs/quality.md)."))
    rows: list[tuple[Cell, ...]] = []
    for cid, (name, stats) in sorted(scan.classes.items()):
        total = class_records.get(name, stats.records)
        shares = ", ".join(f"{flag} {stats.flags[flag]:,} ({counts.share(stats.flags[flag], total)})"
                           for flag in FLAGS if stats.flags[flag])
        rows.append((cid, name, total, stats.records, f"{stats.mean('brightness'):.0f}",
                     f"{stats.mean('contrast'):.0f}", f"{stats.mean('sharpness'):.2f}",
                     f"{stats.mean('colourfulness'):.0f}", f"{stats.mean('pixels') / 1e6:.2f}", shares or "none"))
    blocks.append(Table(
        ("id", "class", "records", "measured", "brightness", "contrast", "sharpness", "colour", "MP", "flags"), rows,
        legend={"id": "the class id (image/class/label)", "class": "the class name",
                "records": "records of the class (as in Records per split and class)",
                "measured": "those of them measured (the means are over these)",
                "brightness": "mean grey level, 0 (black) to 255 (white)",
                "contrast": "standard deviation of the grey levels",
                "sharpness": "fine detail relative to contrast (higher is sharper)",
                "colour": "colourfulness: mean of max - min of R, G, B per pixel (0 is grey)",
                "MP": "mean size in megapixels, width x height / 10^6, of the measured records' stored images",
                "flags": "records of the class with each flag, and their share of the class's records"}))
    skews = scan.skews()
    blocks.append(Para("Classes that differ from the others (a shortcut a model can learn instead of the "
                       "label; measured records only, a class against all the others together): "
                       + ("; ".join(skews) if skews else "none found") + "."))
    if flagged:
        worst: list[tuple[Cell, ...]] = []
        for flag in FLAGS:
            if not flagged.get(flag):
                continue
            rows = [row for _, _, row in sorted(scan.worst.get(flag, []), reverse=True)]
            shown = strip(f"card/quality/{flag}.png", rows, WORST, f"the most {flag} images")
            worst.append((flag, flagged[flag], counts.share(flagged[flag], records), shown))
        blocks += [Para(f"Flagged records, and the {WORST} worst of each flag. Shares are of all {records:,} records "
                        "of the version, as the datasets page and the publish gate give them."),
                   Table(("flag", "records", "share", "worst"), worst, legend={
                       "flag": "the quality flag (docs/quality.md)", "records": "records stored with the flag",
                       "share": f"those records as a share of all {records:,} records",
                       "worst": f"thumbnails of the {WORST} records that have the flag the most"})]
    return blocks
