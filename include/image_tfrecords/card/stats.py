"""The dataset card's statistics, gathered in one pass over labels.csv's columns (``label_table.scan_table``) and
one over rejects.csv: counts per class and split, the sample records (smallest SHA-256 per class), examples, and
the diff against the previous version from 8-byte hashes per image.

Multi-label datasets (labels.csv's ``label`` holds several class names joined by the separator, and
``label_id`` their ids in the same order) count a record once for each of its classes, and also
count records per number of classes and per pair of classes (bounded: pairs among at most
``PAIR_CLASSES`` classes)."""

from __future__ import annotations

import bisect
import heapq
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ..storage.tables import polars

NamesAt = Callable[[list[int]], list[str]]  # row numbers (ascending) -> the file names of those rows, in that order
SAMPLES = 6
EXAMPLES, REJECT_EXAMPLES = 10, 20
PAIR_CLASSES = 1000  # pairs of classes are counted among at most this many classes (<= 499,500 pairs)
SCAN_BATCH = 4096  # rows whose quality signals the card's pass sums together (the order of its float sums)


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
        self.names: dict[int, str] = {}  # class id -> name, for the classes in by_class
        self._worst = -1

    def offer_batch(self, rows: list[dict[str, str]], classes: list[list[tuple[int, str]]]) -> None:
        """Offer each of ``rows`` under each of its ``classes`` (same order): one merge per class and batch,
        not a call per row. What is kept does not depend on how the rows were batched or ordered."""
        groups: dict[int, list[tuple[tuple[str, str], dict[str, str]]]] = {}
        names: dict[int, str] = {}
        for row, row_classes in zip(rows, classes, strict=True):
            for cid, name in row_classes:
                group = groups.get(cid)
                if group is None:
                    group = groups[cid] = []
                    names[cid] = name
                group.append(((row["sha256"], row["filename"]), row))
        for cid in sorted(groups):
            picks = self.by_class.get(cid)
            if picks is None:
                if len(self.by_class) >= self.max_classes:
                    if cid > self._worst:
                        continue
                    del self.by_class[self._worst]
                    del self.names[self._worst]
                picks = self.by_class[cid] = Smallest(self.keep)
                self.names[cid] = names[cid]
                self._worst = max(self.by_class)
            picks.items = heapq.nsmallest(picks.k, picks.items + groups[cid], key=_first)


def _first(item: tuple[Any, Any]) -> Any:
    return item[0]


STRIPS_FILE = "card/strips.json"  # each thumbnail strip's candidates, so that the next card can take it over


@dataclass
class LabelScan:
    """One pass over a labels.csv: records per (class, split) and per split, and row hashes for the diff.

    Multi-label (``separator`` given): a record counts once for each of its classes in ``counts``; ``sizes``
    counts records per (number of classes, split) and ``pairs`` records per pair of class ids."""

    counts: Counter[tuple[str, str]] = field(default_factory=Counter)  # (class, split) -> records with the class
    records: Counter[str] = field(default_factory=Counter)  # split -> records
    ids: dict[str, int] = field(default_factory=dict)  # class name -> id
    sizes: Counter[tuple[int, str]] = field(default_factory=Counter)  # (classes of a record, split) -> records
    pairs: Counter[tuple[int, int]] = field(default_factory=Counter)  # (id a, id b), a < b -> records with both
    pairs_among: int | None = None  # pairs were counted among only this many classes (None: all)
    names: bytearray = field(default_factory=bytearray)  # 8-byte hash of each filename
    contents: bytearray = field(default_factory=bytearray)  # 8-byte hash of each (filename, sha256)
    labelsets: bytearray = field(default_factory=bytearray)  # 8-byte hash of each (filename, class names)
    hashed_labelsets: bool = False

    def classes(self) -> set[str]:
        return {name for name, _ in self.counts}

    def class_totals(self) -> Counter[str]:
        """Records per class, all splits together."""
        out: Counter[str] = Counter()
        for (name, _), n in self.counts.items():
            out[name] += n
        return out

    def pair_classes(self, limit: int | None) -> set[int] | None:
        """The class ids whose pairs are counted: those of the ``limit`` classes with the most records (ties: smaller
        id) where there are more (``pairs_among`` then says so); None: all (``limit`` None: no limit). Memory stays
        bounded by ``limit`` squared whatever the classes."""
        if limit is None:
            return None
        totals = self.class_totals()
        ranked = sorted(totals, key=lambda name: (-totals[name], self.ids[name], name))
        if len(ranked) <= limit:
            return None
        self.pairs_among = limit
        return {self.ids[name] for name in ranked[:limit]}

    def rarest_left_out(self) -> int:
        """With pairs counted among some classes only: the most records a pair with another class can have."""
        if self.pairs_among is None:
            return 0
        totals = sorted(self.class_totals().values(), reverse=True)
        return totals[self.pairs_among] if len(totals) > self.pairs_among else 0

    def top_pairs(self, k: int) -> list[tuple[int, int, int]]:
        """The ``k`` pairs (id a, id b, records) found together on the most records (ties: by ids)."""
        return [(a, b, n) for (a, b), n in heapq.nsmallest(k, self.pairs.items(), key=lambda x: (-x[1], x[0]))]


def _examples(lookup: NamesAt, hashes: Any, targets: dict[str, Any], k: int = EXAMPLES) -> dict[str, list[str]]:
    """For each target (array of filename hashes), the ``k`` smallest matching file names. ``hashes``: the filename
    hash of each row of a table, in order (a scan's ``names``); ``lookup``: the file names of some of its rows
    (``label_table.names_at``), asked only for the rows that match (not at all where none does)."""
    import numpy as np

    wanted = {name: np.flatnonzero(within(hashes, target)) for name, target in targets.items()}
    every = np.unique(np.concatenate([*wanted.values(), np.zeros(0, dtype=np.int64)]))
    if not len(every):
        return {name: [] for name in targets}
    names = np.array(lookup(every.tolist()), dtype=object)
    return {name: heapq.nsmallest(k, names[np.searchsorted(every, numbers)].tolist())
            for name, numbers in wanted.items()}


def within(values: Any, others: Any) -> Any:
    """Whether each of ``values`` is one of ``others`` (numpy arrays of the diff's 64-bit hashes), by a hash set
    (polars): several times faster than ``numpy.isin``."""
    pl = polars()

    return pl.Series(values).is_in(pl.Series(others).implode()).to_numpy()


@dataclass
class Diff:
    added: int
    removed: int
    changed: int
    examples: dict[str, list[str]]
    relabelled: int | None = None  # same filename, other classes (None: not compared)


def diff_versions(current: LabelScan, names_at: NamesAt, previous: LabelScan, previous_names_at: NamesAt) -> Diff:
    """Images added, removed and changed (same filename, new sha256), with the smallest example names (``names_at``,
    ``previous_names_at``: the file names of rows of this version's and the previous version's labels.csv); when
    both scans hashed their label sets, also relabelled (same filename, other classes)."""
    import numpy as np

    names, contents = (np.frombuffer(b, dtype="<u8") for b in (current.names, current.contents))
    old_names, old_contents = (np.frombuffer(b, dtype="<u8") for b in (previous.names, previous.contents))
    known = within(names, old_names)
    added = np.sort(names[~known])
    changed = np.sort(names[known & ~within(contents, old_contents)])
    removed = np.sort(old_names[~within(old_names, names)])
    targets = {"added": added, "changed": changed}
    relabelled = None
    if current.hashed_labelsets and previous.hashed_labelsets:
        sets, old_sets = (np.frombuffer(b, dtype="<u8") for b in (current.labelsets, previous.labelsets))
        targets["relabelled"] = np.sort(names[known & ~within(sets, old_sets)])
        relabelled = len(targets["relabelled"])
    examples = _examples(names_at, names, targets)
    examples |= _examples(previous_names_at, old_names, {"removed": removed})
    return Diff(len(added), len(removed), len(changed), examples, relabelled)


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


