"""The card's one pass over labels.csv, on polars columns.

labels.csv is read whole as a table of text columns (``storage.tables.read_table``: every file name, however odd, by
the same code), and all the card learns of its rows comes from those columns (``scan_table``): the records per class
and split (``group_by``), each record's classes (a multi-label cell split on the separator), the pairs of classes,
the sample picker's candidates (each class's few smallest sha256), the quality sums (``bincount`` of the same
``SCAN_BATCH`` rows in the same order as ever: the same floats), the worst images of each flag, the
near-duplicate groups' members and the diff's 8-byte hashes. Only the few rows the card shows become dicts.
Memory: the table (about 300 bytes a labels.csv row) and a few numpy columns."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ..images.quality import FLAGS, parse_flags
from ..storage.tables import polars
from .near_duplicates import NearDuplicateView
from .quality import _COLUMNS, WORST, ClassQuality, QualityScan, badness
from .stats import SCAN_BATCH, LabelScan, SamplePicker

if TYPE_CHECKING:
    import polars as pl

Rows = Callable[[], Iterable[dict[str, str]]]
REQUIRED = ("filename", "label", "label_id", "split", "sha256")  # the columns the card cannot do without


def rows_table(rows: Iterable[dict[str, str]]) -> pl.DataFrame:
    """Rows given as dicts (a caller's that has no file) as the table ``read_table`` makes of a labels.csv: every
    column text, an empty value null."""
    pl = polars()

    rows = list(rows)
    names = list(dict.fromkeys(name for row in rows for name in row)) or list(REQUIRED)
    return pl.DataFrame({name: [row.get(name) or None for row in rows] for name in names},
                        schema=dict.fromkeys(names, pl.String))


def label_table(labels: Rows, columns: list[str] | None = None) -> pl.DataFrame:
    """The table of ``labels``: its own (a ``table()`` method: a stored labels.csv read by polars; ``columns``: those
    alone, several times faster), else its rows'."""
    own = getattr(labels, "table", None)
    return own(columns) if own is not None else rows_table(labels())


def names_at(table: pl.DataFrame) -> Callable[[list[int]], list[str]]:
    """``numbers`` (row numbers) -> the file names of those rows of ``table``, in that order."""
    return lambda numbers: table["filename"].gather(numbers).fill_null("").to_list()


def scan_table(table: pl.DataFrame, separator: str | None = None, picker: SamplePicker | None = None,
               quality: QualityScan | None = None, near: NearDuplicateView | None = None, pairs: bool = False,
               pair_limit: int | None = None, labelsets: bool = False) -> LabelScan:
    """What the card learns of labels.csv's rows (``table``, as ``read_table`` reads it): the ``LabelScan`` (counts and
    the diff's hashes), and what ``picker``, ``quality`` and ``near`` keep of the rows. ``separator``: multi-label
    cells (None: single-label); ``pairs``: count the pairs of classes found together, among the ``pair_limit``
    classes with the most records where there are more (None: among all); ``labelsets``: also hash each record's
    classes (to find relabelled images). ``ValueError`` for a table the card cannot read (a missing column, a label
    id that is not a whole number, a multi-label row with more labels than ids, a quality flag it does not know)."""
    frame = _text(table)
    classes = _classes(frame, separator)
    scan = LabelScan(hashed_labelsets=labelsets)
    _count(scan, frame, classes, separator is not None)
    if pairs:
        _count_pairs(scan, classes, scan.pair_classes(pair_limit))
    if picker is not None:
        _offer_samples(picker, frame, classes)
    if quality is not None:
        _quality(quality, frame, classes)
    if near is not None:
        _offer_near(near, frame)
    _hash(scan, frame, classes if labelsets else None)
    return scan


def _text(table: pl.DataFrame) -> pl.DataFrame:
    """``table`` with an empty value of the columns the pass compares as "" (as the card's rows always had it; the
    rows it keeps get theirs in ``_dicts``); ``ValueError`` for a missing column."""
    pl = polars()

    if missing := [name for name in REQUIRED if name not in table.columns]:
        raise ValueError(f"labels.csv has no column {', '.join(missing)}")
    return table.with_columns(pl.col(name).fill_null("") for name in (*REQUIRED, "quality") if name in table.columns)


def _dicts(frame: pl.DataFrame, rows: Iterable[int]) -> list[dict[str, str]]:
    """Rows ``rows`` of ``frame`` as dicts, an empty value "" (the few rows the card shows or keeps)."""
    return frame[list(rows)].fill_null("").to_dicts()


def _classes(frame: pl.DataFrame, separator: str | None) -> pl.DataFrame:
    """Each record's classes, one row a (record, class): ``row`` (its row number), ``cid`` and ``name``, by row and
    then id. Single-label: the one class its ``label_id`` and ``label`` give (whatever the name holds); multi-label:
    both cells split on ``separator`` (an empty cell: no class), an id given twice once, under its last name."""
    pl = polars()

    row = pl.int_range(pl.len(), dtype=pl.Int64).alias("row")
    if separator is None:
        pairs = frame.select(row, pl.col("label_id").alias("ids"), pl.col("label").alias("name"))
    else:
        def split(column: str) -> pl.Expr:
            empty = pl.lit([], dtype=pl.List(pl.String))
            return pl.when(pl.col(column) == "").then(empty).otherwise(pl.col(column).str.split(separator))

        lists = frame.select(row, split("label_id").alias("ids"), split("label").alias("name"))
        counts = lists.select(pl.col("name").list.len(), pl.col("ids").list.len())
        if len(bad := (counts["name"] != counts["ids"]).arg_true()):
            at = int(bad[0])
            raise ValueError(f"labels.csv row {frame['filename'][at]!r}: {counts['name'][at]} labels but "
                             f"{counts['ids'][at]} label ids")
        pairs = lists.filter(pl.col("name").list.len() > 0).explode(["ids", "name"])
    ids = pairs["ids"].cast(pl.Int64, strict=False)
    if len(bad := ids.is_null().arg_true()):
        at = int(bad[0])
        raise ValueError(f"labels.csv row {frame['filename'][int(pairs['row'][at])]!r}: label id "
                         f"{pairs['ids'][at]!r} is not a whole number")
    pairs = pairs.with_columns(cid=ids).select("row", "cid", "name")
    if separator is not None:  # by row and id (a stable sort), an id given twice in a row: its last pair kept
        pairs = pairs.sort("row", "cid", maintain_order=True)
        again = (pl.col("row") == pl.col("row").shift(-1)) & (pl.col("cid") == pl.col("cid").shift(-1))
        pairs = pairs.filter(~again.fill_null(False))
    return pairs


def _in_order(frame: pl.DataFrame, keys: list[str]) -> list[tuple[Any, ...]]:
    """(``keys``' values, count) of each distinct ``keys`` in ``frame``, in the order the rows first show them (as
    ``Counter.update`` of the rows would add them)."""
    return frame.group_by(keys, maintain_order=True).len().rows()


def _count(scan: LabelScan, frame: pl.DataFrame, classes: pl.DataFrame, multi: bool) -> None:
    """Records per split, per (class name, split) and (multi-label) per (number of classes, split); each class
    name's id (its first record's)."""
    import numpy as np
    pl = polars()

    scan.records = Counter(dict(_in_order(frame, ["split"])))
    placed = classes.with_columns(split=frame["split"].gather(classes["row"]))
    scan.counts = Counter({(name, split): n for name, split, n in _in_order(placed, ["name", "split"])})
    scan.ids = dict(classes.unique("name", keep="first", maintain_order=True).select("name", "cid").rows())
    if multi:
        sizes = np.bincount(classes["row"].to_numpy(), minlength=frame.height)
        table = pl.DataFrame({"size": sizes, "split": frame["split"]})
        scan.sizes = Counter({(int(size), split): n for size, split, n in _in_order(table, ["size", "split"])})


def _count_pairs(scan: LabelScan, classes: pl.DataFrame, keep: set[int] | None) -> None:
    """Records per pair of class ids (a, b), a < b, found together (both in ``keep``, when given)."""
    pl = polars()

    ids = classes.select("row", "cid")
    if keep is not None:
        ids = ids.filter(pl.col("cid").is_in(sorted(keep)))
    both = ids.join(ids, on="row", suffix="_b").filter(pl.col("cid") < pl.col("cid_b"))
    scan.pairs = Counter({(a, b): n for a, b, n in both.group_by("cid", "cid_b").len().rows()})


def _first_names(classes: pl.DataFrame) -> dict[int, str]:
    """Each class id with the name of its first record."""
    return dict(classes.unique("cid", keep="first", maintain_order=True).select("cid", "name").rows())


def _offer_samples(picker: SamplePicker, frame: pl.DataFrame, classes: pl.DataFrame) -> None:
    """Offer the picker, in row order, the rows that can be among their class's ``keep`` smallest (sha256, filename)
    in the classes it keeps (the ``max_classes`` smallest ids): those whose sha256 is at most the class's ``keep``-th
    smallest (ties included). What it keeps does not depend on which other rows it is offered (``SamplePicker``)."""
    pl = polars()

    if not classes.height:
        return
    shown = classes["cid"].unique().bottom_k(picker.max_classes).implode()
    keys = classes.select("row", "cid", frame["sha256"].gather(classes["row"]).alias("sha256"))
    keys = keys.filter(pl.col("cid").is_in(shown))
    chosen = keys.filter(pl.col("sha256") <= pl.col("sha256").bottom_k(picker.keep).max().over("cid"))
    names = _first_names(classes)
    by_row: dict[int, list[tuple[int, str]]] = {}
    for number, cid in chosen.select("row", "cid").iter_rows():
        by_row.setdefault(number, []).append((cid, names[cid]))
    picker.offer_batch(_dicts(frame, by_row), list(by_row.values()))


def _offer_near(near: NearDuplicateView, frame: pl.DataFrame) -> None:
    """Offer the near-duplicate view the rows of the groups it shows (it keeps nothing else)."""
    import numpy as np
    pl = polars()

    if not near.members:
        return
    found = np.flatnonzero(frame["filename"].is_in(pl.Series(list(near.members), dtype=pl.String).implode()))
    if len(found):
        near.offer_batch(_dicts(frame, found.tolist()), [])


def _measures(frame: pl.DataFrame) -> Any:
    """``quality._COLUMNS`` of every row as floats (rows x columns), NaN where a cell is empty or the column absent (a
    version from before 0.7.0): a row with a NaN was not measured. ``ValueError`` for a cell that is not a number."""
    pl = polars()

    nan = float("nan")
    present = [name for name in _COLUMNS if name in frame.columns]
    numbers = frame.select(pl.col(name).cast(pl.Float64, strict=False) for name in present)
    for name in present:  # (an empty cell is null: a cell that is not a number is one null more)
        if numbers[name].null_count() > frame[name].null_count():
            at = int((numbers[name].is_null() & frame[name].is_not_null()).arg_true()[0])
            raise ValueError(f"labels.csv row {frame['filename'][at]!r}: {name} {frame[name][at]!r} is not a number")
    absent = pl.repeat(nan, frame.height, dtype=pl.Float64)
    return numbers.select(pl.col(name).fill_null(nan) if name in present else absent.alias(name)
                          for name in _COLUMNS).to_numpy()


def _quality(quality: QualityScan, frame: pl.DataFrame, classes: pl.DataFrame) -> None:
    """The quality sums per class (ids below ``max_classes``) of the measured rows, then the flags and the worst."""
    import numpy as np

    measures = _measures(frame)
    measured = ~np.isnan(measures).any(axis=1)
    quality.unmeasured += int((~measured).sum())
    rows, cids = classes["row"].to_numpy(), classes["cid"].to_numpy()
    counted = np.flatnonzero((cids < quality.max_classes) & measured[rows])  # the (record, class) pairs summed
    unique, seen = np.unique(cids[counted], return_index=True)
    for k in np.argsort(seen, kind="stable").tolist():  # each class under its first measured record's name
        quality.classes.setdefault(int(unique[k]), (classes["name"][int(counted[seen[k]])], ClassQuality()))
    _sums(quality, measures, rows[counted], cids[counted], frame.height)
    _flags(quality, frame, measures, measured, rows[counted], cids[counted])


def _sums(quality: QualityScan, measures: Any, rows: Any, cids: Any, count: int) -> None:
    """Add rows ``rows`` (measured) to the sums of their classes ``cids`` (one pair a (record, class), by row): the
    pairs of each ``SCAN_BATCH`` rows from the table's start summed apart (``bincount``, in row order), then added to
    the class's sums batch after batch (adding a 0.0 changes no sum): the same floats as ever."""
    import numpy as np

    values = np.concatenate([measures[:, :4], measures[:, 4:5] * measures[:, 5:6]], axis=1)  # quality._SUMMED
    unique, inverse = np.unique(cids, return_inverse=True)
    batches = count // SCAN_BATCH + 1
    key = inverse * batches + rows // SCAN_BATCH  # (class, batch)
    shape = (len(unique), batches)
    records = np.bincount(key, minlength=len(unique) * batches).reshape(shape)
    sums = [np.bincount(key, weights=values[rows, j], minlength=len(unique) * batches).reshape(shape)
            for j in range(values.shape[1])]
    stacked = np.stack(sums)  # (summed value, class, batch); 0.0 where the class has no record in the batch
    for k, cid in enumerate(unique.tolist()):
        stats = quality.classes[cid][1]
        stats.records += int(records[k].sum())
        running = np.concatenate([np.array(stats.sums)[:, None], stacked[:, k]], axis=1)
        stats.sums = np.cumsum(running, axis=1)[:, -1].tolist()  # (cumsum: one addition after another, in order)


def _first_seen(values: Any) -> Iterator[tuple[int, int]]:
    """Each distinct value of ``values`` (non-negative integers) with its count, in the order they first appear."""
    import numpy as np

    unique, first, counts = np.unique(values, return_index=True, return_counts=True)
    order = np.argsort(first, kind="stable")
    return zip(unique[order].tolist(), counts[order].tolist(), strict=True)


def _flags(quality: QualityScan, frame: pl.DataFrame, measures: Any, measured: Any, rows: Any, cids: Any) -> None:
    """The flags of the measured rows with a ``quality`` cell, counted by distinct cell in the order the rows first
    show them (and per class: ``rows``/``cids``, the (record, class) pairs summed), and each flag's worst few rows
    (ties included) offered to its ``WORST``."""
    import numpy as np
    pl = polars()

    if "quality" not in frame.columns:
        return
    places = np.flatnonzero(measured & (frame["quality"] != "").to_numpy())
    if not len(places):
        return
    cells = frame["quality"].gather(places)
    distinct = cells.unique(maintain_order=True)
    cell_of = cells.replace_strict(distinct, pl.Series(range(len(distinct))), return_dtype=pl.Int64).to_numpy()
    parsed = [parse_flags(cell) for cell in distinct.to_list()]
    if unknown := {flag for flags in parsed for flag in flags} - set(FLAGS):
        raise ValueError(f"labels.csv has unknown quality flags {sorted(unknown)}")
    for cell, n in _first_seen(cell_of):
        for flag in parsed[cell]:
            quality.flags[flag] += n
    row_cell = np.full(frame.height, -1, dtype=np.int64)
    row_cell[places] = cell_of
    pair_cells = row_cell[rows]
    flagged = pair_cells >= 0
    ids, id_of = np.unique(cids[flagged], return_inverse=True)
    for pair, n in _first_seen(pair_cells[flagged] * len(ids) + id_of):
        cell, k = divmod(pair, len(ids))
        for flag in parsed[cell]:
            quality.classes[int(ids[k])][1].flags[flag] += n
    _offer_worst(quality, frame, measures, places, cell_of, parsed)


def _offer_worst(quality: QualityScan, frame: pl.DataFrame, measures: Any, places: Any, cell_of: Any,
                 parsed: list[list[str]]) -> None:
    """Offer each flag's ``WORST`` the rows with it that can be among the worst: those whose key is at least the
    ``WORST``-th largest (ties included), in row order."""
    import numpy as np

    values = np.concatenate([measures[:, :4], measures[:, 4:5] * measures[:, 5:6]], axis=1)  # quality._SUMMED
    offers: list[tuple[str, float, int]] = []
    for flag in FLAGS:
        having = places[np.isin(cell_of, [c for c, flags in enumerate(parsed) if flag in flags])]
        if not len(having):
            continue
        keys = -badness(flag, values[having], measures[having])
        if len(keys) > WORST:
            worse = keys >= np.partition(keys, len(keys) - WORST)[len(keys) - WORST]
            having, keys = having[worse], keys[worse]
        offers += [(flag, key, place) for key, place in zip(keys.tolist(), having.tolist(), strict=True)]
    wanted = sorted({place for _, _, place in offers})
    rows = dict(zip(wanted, _dicts(frame, wanted), strict=True)) if wanted else {}
    for flag, key, place in offers:
        quality.offer_worst(flag, key, rows[place])


def _hash(scan: LabelScan, frame: pl.DataFrame, classes: pl.DataFrame | None) -> None:
    """The diff's 8-byte hashes of each row: of its file name, of (file name, sha256) and (``classes`` given) of
    (file name, its class names sorted)."""
    pl = polars()

    scan.names += _hashes(frame, pl.col("filename"))
    scan.contents += _hashes(frame, pl.concat_str("filename", pl.lit("\0"), "sha256"))
    if classes is not None:
        sets = classes.group_by("row", maintain_order=True).agg("name").select(
            "row", pl.col("name").list.sort().list.join("\0"))
        named = frame.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("row"), "filename").join(
            sets, on="row", how="left", maintain_order="left").fill_null("")
        scan.labelsets += _hashes(named, pl.concat_str("filename", pl.lit("\0"), "name"))


def _hashes(frame: pl.DataFrame, texts: pl.Expr) -> bytes:
    """The 8-byte hash of each of ``texts`` (an expression over ``frame``'s rows), one after another (little-endian):
    polars' own hash with fixed seeds. Only scans made by this process are compared (the diff reads the previous
    version's labels.csv again, nothing saved), so the hash need not stay the same from one polars to the next."""
    return frame.select(texts.hash(seed=0x5EED)).to_series().to_numpy().astype("<u8").tobytes()
