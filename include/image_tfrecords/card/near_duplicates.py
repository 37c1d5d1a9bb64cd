"""The card's near-duplicate section: how many groups the build keeps in one split, and the largest of
them as thumbnails side by side (issue 25; see docs/near-duplicates.md).

``NearDuplicateView.of`` reads near_duplicates.csv once (a count per group), keeps the ``SHOWN`` largest
groups, and learns their members' labels.csv rows during the card's one pass over labels.csv (``offer_batch``);
memory: one counter per group plus ``SHOWN`` x ``PER_GROUP`` rows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ..rules.near_duplicates import GATE
from .render import Block, Cell, Heading, Para, Table

SHOWN = 6  # groups shown
PER_GROUP = 6  # thumbnails per group


@dataclass
class NearDuplicateView:
    groups: int = 0
    records: int = 0
    shown: dict[str, int] = field(default_factory=dict)  # group key -> members, the largest groups
    members: dict[str, str] = field(default_factory=dict)  # filename -> group, the shown groups' first members
    rows: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # group -> its members' labels.csv rows

    @classmethod
    def of(cls, near_rows: Iterable[dict[str, str]]) -> NearDuplicateView:
        sizes: Counter[str] = Counter()
        names: dict[str, list[str]] = {}
        for row in near_rows:
            sizes[row["near_group"]] += 1
            names.setdefault(row["near_group"], [])
            if len(names[row["near_group"]]) < PER_GROUP:
                names[row["near_group"]].append(row["filename"])
        shown = dict(sorted(sizes.items(), key=lambda item: (-item[1], item[0]))[:SHOWN])
        members = {name: group for group in shown for name in names[group]}
        return cls(len(sizes), sum(sizes.values()), shown, members)

    def offer_batch(self, rows: list[dict[str, str]], _classes: list[list[tuple[int, str]]]) -> None:
        """Keep those of ``rows`` that are a shown group's members (called for every labels.csv row)."""
        if not self.members:
            return
        for row in rows:
            group = self.members.get(row["filename"])
            if group is not None:
                self.rows.setdefault(group, []).append(row)


def near_duplicate_blocks(view: NearDuplicateView, bits: int,
                          strip: Callable[[str, list[dict[str, str]], int, str], Cell],
                          found: int | None = None, gated: int = 0) -> list[Block]:
    """The card's blocks for ``view`` (a build with ``near_duplicate_bits`` ``bits``); ``strip(path, rows,
    limit, alt)`` adds a strip of thumbnails (``Card.strip``). ``found``: the groups the build formed among the
    images new to the version, as its manifest records them (``published.counts.near_duplicate_groups``, the
    number the datasets page shows; None: not recorded). ``gated``: the images the build left out of the search
    (``published.counts.near_duplicate_gated``)."""
    blocks: list[Block] = [Heading("Near-duplicates")]
    formed = "" if not found else (
        f" This build formed {found:,} groups among the images new to this version (the number the datasets page "
        "shows): a group under several labels is rejected (near_duplicate_label_conflict) unless "
        "near_duplicate_labels is keep, and new images near published ones join their group.")
    if bits > 0 and gated:
        formed += (f" {gated:,} images took no part in the search: their hash says too little to "
                   f"be trusted ({GATE}; docs/near-duplicates.md).")
    if not view.groups:
        what = "off (near_duplicate_bits 0)" if bits <= 0 else f"on ({bits} bits) and found no group"
        if bits > 0 and found:
            what = f"on ({bits} bits) and the version has no group"
        return [*blocks, Para(f"The near-duplicate search is {what}; identical files are never in two splits."
                              + formed)]
    blocks.append(Para(f"{view.groups:,} groups of near-duplicate images ({view.records:,} records), each kept in "
                       f"one split (near_duplicate_bits {bits}; near_duplicates.csv lists them)." + formed + " The "
                       f"{len(view.shown)} largest, up to {PER_GROUP} images each:"))
    rows: list[tuple[Cell, ...]] = []
    for number, (group, size) in enumerate(view.shown.items()):
        members = sorted(view.rows.get(group, []), key=lambda row: row["filename"])
        shown = strip(f"card/near-duplicates/group-{number:02d}.png", members, PER_GROUP,
                      f"near-duplicate group {group}")
        rows.append((group, size, ", ".join(sorted({row["split"] for row in members})),
                     ", ".join(sorted({row["label"] for row in members})), shown))
    blocks.append(Table(("group", "records", "split", "labels", "images"), rows, legend={
        "group": "the group's key (near_group in near_duplicates.csv)", "records": "the records in the group",
        "split": "the split that holds them all", "labels": "their classes (more than one: the same picture "
        "under several labels)", "images": f"thumbnails of up to {PER_GROUP} of them"}))
    return blocks
