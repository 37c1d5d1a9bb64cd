"""The dataset card's statistics, gathered in one streaming pass over labels.csv and rejects.csv:
counts per class and split, the sample records (smallest SHA-256 per class), examples, and the
diff against the previous version from 8-byte hashes per image."""

from __future__ import annotations

import bisect
import hashlib
import heapq
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

Rows = Callable[[], Iterable[dict[str, str]]]
SAMPLES = 6
EXAMPLES, REJECT_EXAMPLES = 10, 20


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


