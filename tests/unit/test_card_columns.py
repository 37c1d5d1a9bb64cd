"""The card's pass over labels.csv read as columns (``card.label_columns``) learns exactly what the pass over its
rows learns: counts, samples, quality sums (the same floats), flags and worst images, near-duplicate members and
the diff against a previous version; the card rendered from either is the same bytes. Small blocks put the
blocks' edges inside the quality section's batches of ``SCAN_BATCH`` rows."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from image_tfrecords.card import label_columns
from image_tfrecords.card.row_columns import ROWS_FILE, Changes, RowColumns
from image_tfrecords.card.sections import LabelFacts, PreviousVersion, build_card, scan_labels
from image_tfrecords.card.stats import SCAN_BATCH, LabelScan
from image_tfrecords.images.quality import FLAGS
from image_tfrecords.stages.card import _Rows
from image_tfrecords.storage import Storage
from image_tfrecords.storage.csv_blocks import Quoted, first_fields, table_blocks
from tests.pipeline.test_card import REJECTS, make_manifest

Row = dict[str, str]
FIELDS = ("filename", "label", "label_id", "split", "sha256", "width", "height", "brightness", "contrast",
          "sharpness", "colourfulness", "quality", "shard")


def _rows(count: int, seed: int, classes: int = 60, prefix: str = "") -> list[Row]:
    """Rows of ``classes`` classes (past the card's 50 shown), some unmeasured, many flagged, a few ties."""
    rng = random.Random(seed)
    rows = []
    for number in range(count):
        cid = min(int(rng.expovariate(0.08)), classes - 1)
        sha = f"{rng.getrandbits(256):064x}"
        if number % 997 == 5:  # the same 64-bit prefix as the row before: a tie on what the columns sort by
            sha = rows[-1]["sha256"][:16] + sha[16:]
        row = {"filename": f"c{cid:02d}/{prefix}{number:06d}.jpg", "label": f"c{cid:02d}", "label_id": str(cid),
               "split": rng.choice(["train", "train", "validation", "test"]), "sha256": sha}
        if rng.random() < 0.07:
            row |= dict.fromkeys(("width", "height", "brightness", "contrast", "sharpness", "colourfulness"), "")
        else:
            row |= {"width": str(rng.randrange(8, 4000)), "height": str(rng.randrange(8, 4000)),
                    "brightness": f"{rng.uniform(0, 255):.3f}".rstrip("0").rstrip("."),
                    "contrast": f"{rng.uniform(0, 90):.2f}", "sharpness": f"{rng.uniform(0, 3):.3f}",
                    "colourfulness": f"{rng.uniform(0, 120):.1f}"}
        row["quality"] = "|".join(sorted(rng.sample(FLAGS, rng.choice([0, 0, 0, 1, 1, 2]))))
        row["shard"] = f"{row['split']}-00000-of-00001.tfrecord"
        rows.append(row)
    return rows


def _write(path: Path, rows: list[Row]) -> Path:
    def field(value: str) -> str:
        return f'"{value}"' if "," in value else value

    lines = [",".join(FIELDS)] + [",".join(field(row[f]) for f in FIELDS) for row in rows]
    path.write_bytes("".join(line + "\n" for line in lines).encode("utf-8", "surrogateescape"))
    return path


class _SmallBlocks(_Rows):
    """The staged table, its blocks a few KiB each (many blocks, their edges inside the batches)."""

    def columns(self) -> Any:
        return table_blocks(self._storage, self._uri, block_bytes=7_000)


class _RowsOnly:
    """The same table as rows alone (no ``columns``): the pass the columns must match."""

    def __init__(self, table: _Rows) -> None:
        self.table = table

    def __call__(self) -> Iterator[Row]:
        return self.table()


def _near(rows: list[Row]) -> Callable[[], Iterator[Row]]:
    members = [{"filename": row["filename"], "near_group": f"g{i % 3}"} for i, row in enumerate(rows[10:200:9])]
    return lambda: iter(members)


def _facts_key(facts: LabelFacts) -> tuple[Any, ...]:
    quality = facts.quality
    return (facts.scan.dump("x"), list(facts.scan.counts.items()), list(facts.scan.records.items()),
            list(facts.scan.ids.items()),
            {cid: [(key, sorted(row.items())) for key, row in picks.items]
             for cid, picks in facts.picker.by_class.items()},
            facts.picker.names, quality.unmeasured, list(quality.flags.items()),
            {cid: (name, stats.records, stats.sums, list(stats.flags.items()))
             for cid, (name, stats) in quality.classes.items()},
            {flag: sorted((a, b, sorted(r.items())) for a, b, r in heap) for flag, heap in quality.worst.items()},
            facts.near.rows, facts.diff)


def test_the_columns_learn_what_the_rows_learn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage()
    old_rows = _rows(3 * SCAN_BATCH + 123, seed=1)
    new_rows = [row for i, row in enumerate(old_rows) if i % 50] + _rows(700, seed=2, prefix="new")[::3]
    new_rows[7] = {**new_rows[7], "sha256": "f" * 64}  # changed
    changed = new_rows[7]["filename"]
    new_rows.sort(key=lambda row: row["filename"])
    old = _Rows(storage, str(_write(tmp_path / "old.csv", old_rows)))
    labels = _SmallBlocks(storage, str(_write(tmp_path / "labels.csv", new_rows)))
    classes = len({row["label_id"] for row in new_rows})
    previous = PreviousVersion(make_manifest(old_rows, sorted({r["label"] for r in old_rows}), version="v1"), old)
    taken = []
    monkeypatch.setattr("image_tfrecords.card.sections.scan_columns",
                        lambda *a: taken.append(1) or label_columns.scan_columns(*a))

    by_columns = scan_labels(None, classes, labels, lambda: iter(REJECTS), previous, _near(new_rows))
    by_rows = scan_labels(None, classes, _RowsOnly(labels), lambda: iter(REJECTS),
                          PreviousVersion(previous.manifest, _RowsOnly(old)), _near(new_rows))

    assert taken == [1]  # the columns were read once, for the first pass only
    assert _facts_key(by_columns) == _facts_key(by_rows)
    assert by_columns.diff is not None
    assert (by_columns.diff.added, by_columns.diff.removed) == (234, len(old_rows[::50]))
    assert by_columns.diff.changed == 1 and by_columns.diff.examples["changed"] == [changed]
    assert len(by_columns.picker.by_class) == 50 and by_columns.quality.flags and by_columns.quality.unmeasured
    assert by_columns.near.rows  # the shown groups' members were found
    manifest = make_manifest(new_rows, sorted({r["label"] for r in new_rows}))

    def card(facts: LabelFacts) -> dict[str, bytes]:
        return build_card(manifest, labels, lambda: iter(REJECTS), previous, lambda _row: None,
                          labels_sha256="a" * 64, near_rows=_near(new_rows), facts=facts)

    as_columns, as_rows = card(by_columns), card(by_rows)
    assert ROWS_FILE not in as_rows  # (read as rows: no columns to keep)
    assert RowColumns.load(as_columns.pop(ROWS_FILE), "a" * 64) is not None
    assert as_columns == as_rows


def _line_offsets(path: Path) -> Any:
    """Where each row's line begins in the table at ``path`` (after its header), its length last."""
    data = path.read_bytes()
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    return np.concatenate((ends[:-1] + 1, [len(data)])).astype(np.int64)


@pytest.mark.parametrize("fits", [True, False])
def test_a_night_takes_the_kept_rows_columns_from_the_previous_card(tmp_path: Path, fits: bool) -> None:
    """Given which rows it kept of the previous version (the plan's ``Changes``), the card parses only the others,
    and learns exactly what a pass over every row learns; changes that do not fit this table are not used."""
    storage = Storage()
    old_rows = _rows(3 * SCAN_BATCH + 123, seed=1)
    old_path = _write(tmp_path / "old.csv", old_rows)
    _, old_columns = label_columns.scan_columns(_SmallBlocks(storage, str(old_path)), *_watchers())
    saved = RowColumns.load(old_columns.dump("c" * 64), "c" * 64)
    assert saved is not None and RowColumns.load(old_columns.dump("c" * 64), "d" * 64) is None
    new_rows = [row for i, row in enumerate(old_rows) if i % 50] + _rows(700, seed=2, prefix="new")[::3]
    new_rows[7] = {**new_rows[7], "sha256": "f" * 64}  # changed
    new_rows.sort(key=lambda row: row["filename"])
    path = _write(tmp_path / "labels.csv", new_rows)
    labels = _SmallBlocks(storage, str(path))
    was = {(row["filename"], row["sha256"]): i for i, row in enumerate(old_rows)}
    origins = np.array([was.get((row["filename"], row["sha256"]), -1) for row in new_rows], dtype=np.int64)
    offsets = _line_offsets(path)
    if not fits:
        offsets = offsets[:-1]
    changes = Changes(saved, origins, offsets)
    previous = PreviousVersion(make_manifest(old_rows, sorted({r["label"] for r in old_rows}), version="v1"),
                               _Rows(storage, str(old_path)), columns=saved)
    classes = len({row["label_id"] for row in new_rows})
    by_changes = scan_labels(None, classes, labels, lambda: iter(REJECTS), previous, _near(new_rows), changes)
    by_rows = scan_labels(None, classes, _RowsOnly(labels), lambda: iter(REJECTS),
                          PreviousVersion(previous.manifest, _RowsOnly(previous.labels)), _near(new_rows))
    assert _facts_key(by_changes) == _facts_key(by_rows)
    new = int((origins < 0).sum())
    assert new == 234 + 1
    assert by_changes.parsed == (new if fits else len(new_rows))
    assert changes.taken == (len(new_rows) - new if fits else None)
    assert by_changes.columns is not None
    whole = label_columns.scan_columns(labels, *_watchers())[1]
    assert by_changes.columns.dump("e" * 64) == whole.dump("e" * 64)  # the columns parsing every row makes
    assert (by_changes.columns.starts == whole.starts).all() and (by_changes.columns.stops == whole.stops).all()


@pytest.mark.parametrize("damage", ["quoted", "label_id", "ragged", "not_utf8", "flag"])
def test_a_table_the_columns_cannot_take_is_scanned_as_rows(tmp_path: Path, damage: str) -> None:
    """A quoted field, a label id that is not a plain decimal, a short row, a value that is not UTF-8, a flag
    the card does not know: the pass starts over on the rows with fresh watchers (or fails as the rows do)."""
    rows = _rows(500, seed=3)
    measured = next(i for i, row in enumerate(rows) if row["width"])
    if damage == "quoted":
        rows[measured]["filename"] = "c01/a,b.jpg"
    elif damage == "label_id":
        rows[measured]["label_id"] = "+" + rows[measured]["label_id"]
    elif damage == "not_utf8":
        rows[measured]["filename"] = "c02/\udcff.jpg"  # the byte 0xff, as a surrogate escape
    elif damage == "flag":
        rows[measured]["quality"] = "mystery"
    path = _write(tmp_path / "labels.csv", rows)
    if damage == "ragged":
        path.write_bytes(path.read_bytes() + b"c00/x.jpg,c00,0\n")
    storage = Storage()
    table = _SmallBlocks(storage, str(path))
    with pytest.raises((Quoted, ValueError)):
        label_columns.scan_columns(table, *_watchers())
    if damage in ("ragged", "flag"):  # the rows fail too: a short row has no split; a "mystery" has no badness
        with pytest.raises(KeyError):
            scan_labels(None, 60, table, lambda: iter(REJECTS), None)
        return
    facts = scan_labels(None, 60, table, lambda: iter(REJECTS), None)
    assert facts.scan.records.total() == len(rows)
    assert _facts_key(facts) == _facts_key(scan_labels(None, 60, _RowsOnly(table), lambda: iter(REJECTS), None))


def _watchers() -> tuple[Any, ...]:
    from image_tfrecords.card.near_duplicates import NearDuplicateView
    from image_tfrecords.card.quality import QualityScan
    from image_tfrecords.card.stats import SamplePicker

    return SamplePicker(50, 12), QualityScan(50), NearDuplicateView.of([])


def test_first_fields_cuts_the_wanted_names_and_refuses_quotes(tmp_path: Path) -> None:
    rows = _rows(2000, seed=4)
    path = _write(tmp_path / "labels.csv", rows)
    storage = Storage()
    wanted = [0, 1, 17, 999, 1000, 1998, 1999]
    assert first_fields(storage, str(path), wanted, block_bytes=4096) == [rows[i]["filename"] for i in wanted]
    assert first_fields(storage, str(path), []) == []
    rows[17]["filename"] = "c01/a,b.jpg"
    _write(path, rows)
    with pytest.raises(Quoted):
        first_fields(storage, str(path), [5])
    names = _Rows(storage, str(path)).names_at(wanted)  # a quoted table: the names come from its rows
    assert list(names) == [rows[i]["filename"] for i in wanted]


def test_a_saved_scan_of_the_columns_is_the_rows_scan(tmp_path: Path) -> None:
    """The scan the card saves (labels-scan.bin, which the next version's diff loads) is the same bytes."""
    rows = _rows(SCAN_BATCH + 10, seed=6)
    table = _SmallBlocks(Storage(), str(_write(tmp_path / "labels.csv", rows)))
    scan = label_columns.scan_columns(table, *_watchers())[0]
    assert scan.dump("b" * 64) == LabelScan.of(iter(table()), None, hashes=True).dump("b" * 64)
