"""The card's pass over a single-label labels.csv as columns (``storage.csv_blocks``), for the rows a night
cannot avoid reading: the counts per class and split come from ``numpy.unique`` of a block's columns, the
sample picker and the near-duplicate view see only the rows that can matter to them (the block's few smallest
SHA-256 per class, the shown groups' members), the quality sums are the ones ``QualityScan.offer_batch``
makes of the same ``SCAN_BATCH`` rows in the same order, and only the 8-byte row hashes of the diff are made
row by row. What it learns is what ``LabelScan.of`` learns of the same rows (tests/unit/test_card_columns.py).

A table it cannot take so (multi-label rows, a quoted field, a value that is not UTF-8, a label id that is not
a plain decimal) raises ``Quoted`` or a ``ValueError`` before the caller uses anything: the caller then
scans the rows (``LabelScan.of``) with fresh watchers."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

from ..images.quality import FLAGS, parse_flags
from ..storage.csv_blocks import Block, Quoted, within
from .near_duplicates import NearDuplicateView
from .quality import _COLUMNS, WORST, ClassQuality, QualityScan
from .stats import SCAN_BATCH, LabelScan, SamplePicker

Table = Callable[[], AbstractContextManager[tuple[list[str], Iterator[Block]]]]
REQUIRED = ("filename", "label", "label_id", "split", "sha256")


def scan_columns(table: Table, picker: SamplePicker, quality: QualityScan, near: NearDuplicateView) -> LabelScan:
    """``LabelScan.of(rows, picker, hashes=True, watchers=(quality, near))`` of a single-label table's rows, read
    as columns (``table()``: its header's names and its blocks)."""
    scan = LabelScan()
    with table() as (names, found):
        at = {name: j for j, name in enumerate(names)}
        if missing := [name for name in REQUIRED if name not in at]:
            raise Quoted(f"no column {', '.join(missing)}")
        batches = _QualityBatches(quality, names, at)
        for block in found:
            block.data.decode("utf-8")  # a value that is not UTF-8 (UnicodeDecodeError): the rows, as they read it
            ids, labels = block.integers(at["label_id"]), block.column(at["label"])
            _count(scan, block, at, ids, labels)
            _offer_samples(picker, block, names, ids, labels, block.hex_prefixes(at["sha256"]))
            _offer_near(near, block, names, at)
            _hash_rows(scan, block.column(at["filename"]).tolist(), block.column(at["sha256"]).tolist())
            batches.add(block, ids, labels)
        batches.flush()
    return scan


def _text(value: bytes) -> str:
    return value.decode("utf-8")


def _row(block: Block, names: list[str], i: int) -> dict[str, str]:
    """Row ``i`` of ``block`` as ``documents.list_rows`` gives it (a dict of its values)."""
    start, stop = int(block.starts[i, 0]), int(block.stops[i, -1])
    return dict(zip(names, block.data[start:stop].decode("utf-8").split(","), strict=True))


def _first_seen(values: Any) -> Iterator[tuple[int, int]]:
    """Each distinct value of ``values`` (non-negative integers) with its count, in the order they first appear."""
    import numpy as np

    unique, first, counts = np.unique(values, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    return zip(unique[order].tolist(), counts[order].tolist(), strict=True)


def _count(scan: LabelScan, block: Block, at: dict[str, int], ids: Any, labels: Any) -> None:
    """Records per split and per (class name, split), and each class name's id (its first row's), added in the
    order the rows first show them (as ``Counter.update`` of the rows would)."""
    import numpy as np

    split_values, split_of = np.unique(block.column(at["split"]), return_inverse=True)
    label_values, label_first, label_of = np.unique(labels, return_index=True, return_inverse=True)
    for split, n in _first_seen(split_of):
        scan.records[_text(split_values[split])] += n
    for pair, n in _first_seen(label_of.astype(np.int64) * len(split_values) + split_of):
        label, split = divmod(pair, len(split_values))
        scan.counts[_text(label_values[label]), _text(split_values[split])] += n
    for k in np.argsort(label_first, kind="stable").tolist():
        scan.ids.setdefault(_text(label_values[k]), int(ids[label_first[k]]))


def _hash_rows(scan: LabelScan, filenames: list[bytes], hashes: list[bytes]) -> None:
    """The diff's 8-byte hashes of each row's filename and of (filename, sha256), as ``LabelScan.of`` makes them
    of the decoded text (UTF-8 checked, so the bytes are the text's)."""
    blake2b = hashlib.blake2b
    scan.names += b"".join([blake2b(name, digest_size=8).digest() for name in filenames])
    scan.contents += b"".join([blake2b(name + b"\0" + sha, digest_size=8).digest()
                               for name, sha in zip(filenames, hashes, strict=True)])


def _class_names(ids: Any, labels: Any) -> dict[int, str]:
    """Each class id of a block with the label of its first row there."""
    import numpy as np

    unique, first = np.unique(ids, return_index=True)
    return {int(cid): _text(labels[i]) for cid, i in zip(unique.tolist(), first.tolist(), strict=True)}


def _offer_samples(picker: SamplePicker, block: Block, names: list[str], ids: Any, labels: Any,
                   prefixes: Any) -> None:
    """Offer the picker the rows of ``block`` that can be among the ``keep`` smallest SHA-256 of their class: in
    each class, those whose 64-bit prefix is at most its ``keep``-th smallest in the block (ties included). What
    the picker keeps does not depend on which rows it was offered beside the smallest (``SamplePicker``)."""
    import numpy as np

    if not block.count:
        return
    order = np.lexsort((prefixes, ids))
    by_class, by_prefix = ids[order], prefixes[order]
    starts = np.flatnonzero(np.concatenate(([True], by_class[1:] != by_class[:-1])))
    ends = np.concatenate((starts[1:], [len(order)]))
    bound = by_prefix[np.minimum(starts + picker.keep - 1, ends - 1)]  # each class's keep-th smallest prefix
    group = np.repeat(np.arange(len(starts)), ends - starts)
    chosen = np.sort(order[by_prefix <= bound[group]]).tolist()
    class_names = _class_names(ids, labels)
    rows = [_row(block, names, i) for i in chosen]
    picker.offer_batch(rows, [[(int(ids[i]), class_names[int(ids[i])])] for i in chosen])


def _offer_near(near: NearDuplicateView, block: Block, names: list[str], at: dict[str, int]) -> None:
    """Offer the near-duplicate view the rows of the groups it shows (it keeps nothing else)."""
    import numpy as np

    if not near.members:
        return
    members = np.array([name.encode("utf-8") for name in near.members])
    rows = [_row(block, names, i) for i in np.flatnonzero(within(block.column(at["filename"]), members)).tolist()]
    if rows:
        near.offer_batch(rows, [])


class _QualityBatches:
    """The quality section's sums, made of the same batches of ``SCAN_BATCH`` rows as ``LabelScan.of`` makes
    (the rows from the table's start, whatever its blocks), so that the sums are the same floats."""

    def __init__(self, quality: QualityScan, names: list[str], at: dict[str, int]) -> None:
        self.quality, self.names, self.at = quality, names, at
        self.parts: list[_Part] = []  # the pending batch's rows, a run of a block each
        self.pending = 0

    def add(self, block: Block, ids: Any, labels: Any) -> None:
        import numpy as np

        measures = np.stack([self._floats(block, name) for name in _COLUMNS], axis=1) if block.count else \
            np.zeros((0, len(_COLUMNS)))
        j = self.at.get("quality")
        cells = block.column(j) if j is not None else np.zeros(block.count, dtype="S1")
        start = 0
        while start < block.count:
            stop = min(block.count, start + SCAN_BATCH - self.pending)
            self.parts.append(_Part(block, ids[start:stop], labels[start:stop], measures[start:stop],
                                    cells[start:stop], start))
            self.pending += stop - start
            start = stop
            if self.pending == SCAN_BATCH:
                self.flush()

    def _floats(self, block: Block, name: str) -> Any:
        """Column ``name`` as floats, an empty cell (or an absent column) NaN, as ``offer_batch`` reads them."""
        import numpy as np

        j = self.at.get(name)
        if j is None:
            return np.full(block.count, np.nan)
        column = block.column(j)
        return np.where(column == b"", b"nan", column).astype(np.float64)

    def flush(self) -> None:
        """``QualityScan.offer_batch`` of the pending batch's rows."""
        import numpy as np

        if not self.pending:
            return
        quality, parts = self.quality, self.parts
        self.parts, self.pending = [], 0
        table = np.concatenate([part.measures for part in parts])
        measured = ~np.isnan(table).any(axis=1)
        quality.unmeasured += int((~measured).sum())
        kept = np.flatnonzero(measured)
        if not len(kept):
            return
        table, ids = table[kept], np.concatenate([part.ids for part in parts])[kept]
        labels = np.concatenate([part.labels for part in parts])[kept]
        below = np.flatnonzero(ids < quality.max_classes)
        unique, first = np.unique(ids[below], return_index=True)
        for k in np.argsort(first, kind="stable").tolist():
            cid = int(unique[k])
            if cid not in quality.classes:
                quality.classes[cid] = (_text(labels[below[first[k]]]), ClassQuality())
        values = quality.add_measured(table, below, ids[below])
        cells = np.concatenate([part.cells for part in parts])[kept]
        flagged = np.flatnonzero(cells != b"")
        if len(flagged):
            self._flags(cells[flagged], flagged, ids[flagged], values, table,
                        lambda place: self._row_at(parts, int(kept[place])))

    def _flags(self, cells: Any, places: Any, ids: Any, values: Any, table: Any,
               row_at: Callable[[int], dict[str, str]]) -> None:
        """What ``QualityScan.offer_flags`` does for each measured row with a ``quality`` cell (``cells``, at
        ``places``, of classes ``ids``), by distinct cell: the flags counted in the order the rows first show them,
        per class likewise, and only each flag's worst few rows (ties included) offered to its ``WORST``."""
        import numpy as np

        quality = self.quality
        distinct, cell_of = np.unique(cells, return_inverse=True)
        parsed = [parse_flags(_text(cell)) for cell in distinct.tolist()]
        if unknown := {flag for flags in parsed for flag in flags} - set(FLAGS):
            raise ValueError(f"unknown quality flags {sorted(unknown)}")  # the rows fail on them as they always did
        for cell, n in _first_seen(cell_of):
            for flag in parsed[cell]:
                quality.flags[flag] += n
        below = np.flatnonzero(ids < quality.max_classes)
        top = int(ids.max()) + 1
        for pair, n in _first_seen(cell_of[below].astype(np.int64) * top + ids[below]):
            cell, cid = divmod(pair, top)
            for flag in parsed[cell]:
                quality.classes[cid][1].flags[flag] += n
        for flag in FLAGS:
            cells_with = np.array([c for c, flags in enumerate(parsed) if flag in flags], dtype=np.int64)
            having = np.flatnonzero(within(cell_of, cells_with))
            if not len(having):
                continue
            keys = -_badness(flag, values[places[having]], table[places[having]])
            if len(keys) > WORST:  # only rows that can be among the WORST: at least the WORST-th largest key
                worse = keys >= np.partition(keys, len(keys) - WORST)[len(keys) - WORST]
                having, keys = having[worse], keys[worse]
            for k, key in zip(having.tolist(), keys.tolist(), strict=True):
                quality.offer_worst(flag, key, row_at(int(places[k])))

    def _row_at(self, parts: list[_Part], number: int) -> dict[str, str]:
        """The batch's row ``number`` (counted over its parts) as a dict."""
        for part in parts:
            if number < len(part.ids):
                return _row(part.block, self.names, part.start + number)
            number -= len(part.ids)
        raise IndexError(number)


@dataclass
class _Part:
    """A run of a block's rows in a batch: its class ids, labels, ``_COLUMNS`` and ``quality`` cells."""

    block: Block
    ids: Any
    labels: Any
    measures: Any
    cells: Any
    start: int  # its first row in the block


def _badness(flag: str, values: Any, measures: Any) -> Any:
    """``quality._BADNESS[flag]`` of rows (``values``: their ``_SUMMED``, ``measures``: their ``_COLUMNS``), with the
    same float operations."""
    import numpy as np

    width, height = measures[:, 4], measures[:, 5]
    signal = {"dark": values[:, 0], "bright": -values[:, 0], "flat": values[:, 1], "blurry": values[:, 2],
              "grey_as_colour": values[:, 3], "tiny": np.minimum(width, height)}
    if flag in signal:
        return signal[flag]
    return -np.maximum(width, height) / np.maximum(1.0, np.minimum(width, height))  # odd_aspect
