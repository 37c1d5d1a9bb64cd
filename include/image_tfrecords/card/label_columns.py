"""The card's pass over a single-label labels.csv as columns, for the rows a night cannot avoid reading.

The table becomes ``RowColumns`` (``card.row_columns``): parsed from its blocks (``storage.csv_blocks``), or, on a
night whose plan says which rows it kept of the previous version (``Changes``), the kept rows' columns taken from
the ones that version's card saved and only the new rows parsed. ``scan_row_columns`` then learns from the columns:
the counts per class and split come from ``numpy.unique``, the sample picker and the near-duplicate view see only
the rows that can matter to them (each class's few smallest SHA-256, the shown groups' members, read by where their
lines are), the quality sums are the ones ``QualityScan.offer_batch`` makes of the same ``SCAN_BATCH`` rows in the
same order. What it learns is what ``LabelScan.of`` learns of the same rows (tests/unit/test_card_columns.py).

A table it cannot take so (multi-label rows, a quoted field, a value that is not UTF-8, a label id that is not
a plain decimal) raises ``Quoted`` or a ``ValueError`` before the caller uses anything: the caller then
scans the rows (``LabelScan.of``) with fresh watchers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..images.quality import FLAGS, parse_flags
from ..storage.csv_blocks import Block, within
from .near_duplicates import NearDuplicateView
from .quality import WORST, ClassQuality, QualityScan
from .row_columns import Changes, LineReader, RowColumns, header_places
from .stats import SCAN_BATCH, LabelScan, SamplePicker, _hash8

RowsAt = Callable[[Any], list[dict[str, str]]]  # row numbers (ascending) -> those rows, as dicts


class Table(Protocol):
    """A labels.csv that can be read as columns (``columns()``: its header's names and its blocks) and by where its
    lines are (``lines()``: a ``LineReader``): ``stages.card._Rows``."""

    def columns(self) -> AbstractContextManager[tuple[list[str], Iterator[Block]]]: ...

    def lines(self) -> AbstractContextManager[LineReader]: ...


def scan_columns(table: Table, picker: SamplePicker, quality: QualityScan, near: NearDuplicateView,
                 changes: Changes | None = None) -> tuple[LabelScan, RowColumns]:
    """``LabelScan.of(rows, picker, hashes=True, watchers=(quality, near))`` of a single-label table's rows, read
    as columns, and those columns (``RowColumns``, which the card keeps for the next version). ``changes``: the
    rows a night kept of the previous version, whose columns are taken from that version's instead of parsed."""
    with table.lines() as reader:
        columns = changes.columns(reader) if changes is not None else None
        if columns is None:
            with table.columns() as (names, found):
                at = header_places(names)
                columns = RowColumns.concat([RowColumns.of_block(block, at) for block in found])

        def rows_at(numbers: Any) -> list[dict[str, str]]:
            return reader.rows(columns.starts[numbers], columns.stops[numbers])

        return scan_row_columns(columns, rows_at, picker, quality, near), columns


def scan_row_columns(columns: RowColumns, rows_at: RowsAt, picker: SamplePicker, quality: QualityScan,
                     near: NearDuplicateView) -> LabelScan:
    """What ``LabelScan.of`` learns of a table's rows (with the picker, quality and near-duplicate watchers), from
    their columns; ``rows_at`` reads the few rows the watchers keep."""
    scan = LabelScan()
    _count(scan, columns.splits, columns.ids, columns.labels)
    _offer_samples(picker, rows_at, columns.ids, columns.labels, columns.prefixes)
    _offer_near(near, rows_at, columns.names)
    scan.names += columns.names.astype("<u8").tobytes()
    scan.contents += columns.contents.astype("<u8").tobytes()
    for first in range(0, columns.count, SCAN_BATCH):
        last = min(columns.count, first + SCAN_BATCH)
        _quality_batch(quality, columns.measures[first:last], columns.ids[first:last], columns.labels[first:last],
                       columns.cells[first:last], lambda numbers, first=first: rows_at(numbers + first))
    return scan


def _text(value: bytes) -> str:
    return value.decode("utf-8")


def _first_seen(values: Any) -> Iterator[tuple[int, int]]:
    """Each distinct value of ``values`` (non-negative integers) with its count, in the order they first appear."""
    import numpy as np

    unique, first, counts = np.unique(values, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    return zip(unique[order].tolist(), counts[order].tolist(), strict=True)


def _count(scan: LabelScan, splits: Any, ids: Any, labels: Any) -> None:
    """Records per split and per (class name, split), and each class name's id (its first row's), added in the
    order the rows first show them (as ``Counter.update`` of the rows would)."""
    import numpy as np

    split_values, split_of = np.unique(splits, return_inverse=True)
    label_values, label_first, label_of = np.unique(labels, return_index=True, return_inverse=True)
    for split, n in _first_seen(split_of):
        scan.records[_text(split_values[split])] += n
    for pair, n in _first_seen(label_of.astype(np.int64) * len(split_values) + split_of):
        label, split = divmod(pair, len(split_values))
        scan.counts[_text(label_values[label]), _text(split_values[split])] += n
    for k in np.argsort(label_first, kind="stable").tolist():
        scan.ids.setdefault(_text(label_values[k]), int(ids[label_first[k]]))


def _class_names(ids: Any, labels: Any) -> dict[int, str]:
    """Each class id with the label of its first row."""
    import numpy as np

    unique, first = np.unique(ids, return_index=True)
    return {int(cid): _text(labels[i]) for cid, i in zip(unique.tolist(), first.tolist(), strict=True)}


def _offer_samples(picker: SamplePicker, rows_at: RowsAt, ids: Any, labels: Any, prefixes: Any) -> None:
    """Offer the picker the rows that can be among the ``keep`` smallest SHA-256 of their class: in each class,
    those whose 64-bit prefix is at most its ``keep``-th smallest (ties included). What the picker keeps does not
    depend on which rows it was offered beside the smallest (``SamplePicker``)."""
    import numpy as np

    if not len(ids):
        return
    order = np.lexsort((prefixes, ids))
    by_class, by_prefix = ids[order], prefixes[order]
    starts = np.flatnonzero(np.concatenate(([True], by_class[1:] != by_class[:-1])))
    ends = np.concatenate((starts[1:], [len(order)]))
    bound = by_prefix[np.minimum(starts + picker.keep - 1, ends - 1)]  # each class's keep-th smallest prefix
    group = np.repeat(np.arange(len(starts)), ends - starts)
    chosen = np.sort(order[by_prefix <= bound[group]])
    class_names = _class_names(ids, labels)
    picker.offer_batch(rows_at(chosen), [[(int(ids[i]), class_names[int(ids[i])])] for i in chosen.tolist()])


def _offer_near(near: NearDuplicateView, rows_at: RowsAt, names: Any) -> None:
    """Offer the near-duplicate view the rows of the groups it shows (it keeps nothing else): those whose file name
    hashes as one of theirs, then only those whose name is."""
    import numpy as np

    if not near.members:
        return
    wanted = np.frombuffer(b"".join(_hash8(name) for name in near.members), dtype="<u8")
    rows = [row for row in rows_at(np.flatnonzero(within(names, wanted))) if row["filename"] in near.members]
    if rows:
        near.offer_batch(rows, [])


def _quality_batch(quality: QualityScan, measures: Any, ids: Any, labels: Any, cells: Any, rows_at: RowsAt) -> None:
    """``QualityScan.offer_batch`` of one batch of ``SCAN_BATCH`` rows (from the table's start, as ``LabelScan.of``
    makes them), from their columns: the same sums of the same rows in the same order, so the same floats."""
    import numpy as np

    measured = ~np.isnan(measures).any(axis=1)
    quality.unmeasured += int((~measured).sum())
    kept = np.flatnonzero(measured)
    if not len(kept):
        return
    table, ids, labels = measures[kept], ids[kept], labels[kept]
    below = np.flatnonzero(ids < quality.max_classes)
    unique, first = np.unique(ids[below], return_index=True)
    for k in np.argsort(first, kind="stable").tolist():
        cid = int(unique[k])
        if cid not in quality.classes:
            quality.classes[cid] = (_text(labels[below[first[k]]]), ClassQuality())
    values = quality.add_measured(table, below, ids[below])
    cells = cells[kept]
    flagged = np.flatnonzero(cells != b"")
    if len(flagged):
        _flags(quality, cells[flagged], flagged, ids[flagged], values, table,
               lambda place: rows_at(np.array([kept[place]]))[0])


def _flags(quality: QualityScan, cells: Any, places: Any, ids: Any, values: Any, table: Any,
           row_at: Callable[[int], dict[str, str]]) -> None:
    """What ``QualityScan.offer_flags`` does for each measured row with a ``quality`` cell (``cells``, at
    ``places``, of classes ``ids``), by distinct cell: the flags counted in the order the rows first show them,
    per class likewise, and only each flag's worst few rows (ties included) offered to its ``WORST``."""
    import numpy as np

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
