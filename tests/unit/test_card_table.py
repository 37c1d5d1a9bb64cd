"""The card's one pass over labels.csv's columns (``card.label_table.scan_table``) learns what a plain pass over its
rows, one by one, learns (``_reference``, the semantics the card has always had): counts, classes per record,
pairs of classes, samples, quality sums and flags, the worst images and the diff's hashes; for single- and
multi-label tables alike, whatever the file names hold (a comma, a quote, a newline: read by polars, one code path);
and a table it cannot read fails, naming what is wrong."""

from __future__ import annotations

import heapq
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.card.label_table import label_table, rows_table, scan_table
from image_tfrecords.card.near_duplicates import NearDuplicateView
from image_tfrecords.card.quality import WORST, QualityScan
from image_tfrecords.card.sections import LabelFacts, PreviousVersion, build_card, scan_labels
from image_tfrecords.card.stats import SCAN_BATCH, SamplePicker
from image_tfrecords.images.quality import FLAGS
from image_tfrecords.stages.card import _Rows
from image_tfrecords.storage import Storage
from image_tfrecords.storage.documents import csv_writer
from image_tfrecords.storage.tables import polars
from tests.pipeline.test_card import REJECTS, make_manifest

Row = dict[str, str]
FIELDS = ("filename", "label", "label_id", "split", "sha256", "width", "height", "brightness", "contrast",
          "sharpness", "colourfulness", "quality", "num_bytes")
MEASURES = ("brightness", "contrast", "sharpness", "colourfulness", "width", "height")
ODD = ("a,b", 'q"uote', "new\nline", "cr\rret", " lead", "tail ", "ünï", "tab\t", '"')


def _rows(count: int, seed: int, classes: int = 60, prefix: str = "", multi: str | None = None) -> list[Row]:
    """Rows of ``classes`` classes (past the card's 50 shown), every seventh with an odd file name, some not
    measured, many flagged, a few ties on the sha256's first 16 digits; ``multi``: 0 to 5 classes a row joined by
    it (now and then an id given twice)."""
    rng = random.Random(seed)
    rows: list[Row] = []
    for number in range(count):
        cid = min(int(rng.expovariate(0.08)), classes - 1)
        name = f"c{cid:02d}/{prefix}{number:06d}.jpg"
        if number % 7 == 0:
            name = ODD[number // 7 % len(ODD)] + name
        sha = f"{rng.getrandbits(256):064x}"
        if number % 997 == 5:
            sha = rows[-1]["sha256"][:16] + sha[16:]
        label, label_id = f"c{cid:02d}", str(cid)
        if multi is not None:
            ids = sorted(rng.sample(range(classes), rng.choice([0, 1, 1, 2, 3, 5])))
            ids += ids[:1] if number % 13 == 0 else []
            label, label_id = multi.join(f"c{i:02d}" for i in ids), multi.join(map(str, ids))
        row = {"filename": name, "label": label, "label_id": label_id, "sha256": sha,
               "split": rng.choice(["train", "train", "validation", "test"]), "num_bytes": str(number)}
        row |= dict.fromkeys(MEASURES, "") if rng.random() < 0.07 else {
            "width": str(rng.randrange(8, 4000)), "height": str(rng.randrange(8, 4000)),
            "brightness": repr(rng.uniform(0, 255)), "contrast": f"{rng.uniform(0, 90):.2f}",
            "sharpness": f"{rng.uniform(0, 3):.3f}", "colourfulness": f"{rng.uniform(0, 120):.1f}"}
        row["quality"] = "|".join(sorted(rng.sample(FLAGS, rng.choice([0, 0, 0, 1, 1, 2]))))
        rows.append(row)
    return rows


def _write(path: Path, rows: list[Row]) -> str:
    """``rows`` as this package writes labels.csv."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv_writer(f)
        writer.writerow(FIELDS)
        writer.writerows([[row[name] for name in FIELDS] for row in rows])
    return str(path)


def _hash8(text: str) -> bytes:
    """The card's 8-byte hash of one text (polars' own, with the card's seed), made alone."""
    return polars().Series([text]).hash(seed=0x5EED).to_numpy().astype("<u8").tobytes()


def _classes(row: Row, separator: str | None) -> list[tuple[int, str]]:
    if separator is None:
        return [(int(row["label_id"]), row["label"])]
    names = row["label"].split(separator) if row["label"] else []
    ids = row["label_id"].split(separator) if row["label_id"] else []
    return sorted(dict(zip(map(int, ids), names, strict=True)).items())


def _reference(rows: list[Row], separator: str | None, keep: int = 12, shown: int = 50) -> dict[str, Any]:
    """What the card learns of ``rows``, row by row in plain Python."""
    counts: Counter[tuple[str, str]] = Counter()
    records: Counter[str] = Counter()
    sizes: Counter[tuple[int, str]] = Counter()
    pairs: Counter[tuple[int, int]] = Counter()
    ids: dict[str, int] = {}
    picks: dict[int, list[tuple[str, str]]] = {}
    flags: Counter[str] = Counter()
    quality: dict[int, tuple[str, list[float], Counter[str]]] = {}  # cid -> name, [records, *sums], flags
    worst: dict[str, list[tuple[float, str]]] = {}
    unmeasured = 0
    hashes = bytearray()
    for row in rows:
        classes, split = _classes(row, separator), row["split"]
        records[split] += 1
        for cid, name in classes:
            counts[name, split] += 1
            ids.setdefault(name, cid)
            picks.setdefault(cid, []).append((row["sha256"], row["filename"]))
        if separator is not None:
            sizes[len(classes), split] += 1
            pairs.update((a, b) for i, (a, _) in enumerate(classes) for b, _ in classes[i + 1:])
        hashes += _hash8(row["filename"]) + _hash8(row["filename"] + "\0" + row["sha256"]) + _hash8(
            row["filename"] + "\0" + "\0".join(sorted(name for _, name in classes)))
        if not all(row[name] for name in MEASURES):
            unmeasured += 1
            continue
        b, c, s, col, w, h = (float(row[name]) for name in MEASURES)
        found = [flag for flag in row["quality"].split("|") if flag]
        flags.update(found)
        for cid, name in classes:
            if cid < shown:
                entry = quality.setdefault(cid, (name, [0] * 6, Counter()))
                entry[1][:] = [x + y for x, y in zip(entry[1], (1, b, c, s, col, w * h), strict=True)]
                entry[2].update(found)
        bad = {"dark": b, "bright": -b, "flat": c, "blurry": s, "grey_as_colour": col, "tiny": min(w, h),
               "odd_aspect": -max(w, h) / max(1.0, min(w, h))}
        for flag in found:
            worst.setdefault(flag, []).append((-bad[flag], row["sha256"]))
    return {"counts": counts, "records": records, "ids": ids, "sizes": sizes, "pairs": pairs, "hashes": bytes(hashes),
            "picks": {cid: [name for _, name in sorted(picks[cid])[:keep]] for cid in sorted(picks)[:shown]},
            "flags": flags, "quality": quality, "unmeasured": unmeasured,
            "worst": {flag: heapq.nlargest(WORST, found) for flag, found in worst.items()}}


def facts_key(facts: LabelFacts) -> tuple[Any, ...]:
    """All ``scan_labels`` learnt (its scan, picks, quality, near-duplicate rows, diff), to compare two passes."""
    quality = facts.quality
    scan = facts.scan
    return (bytes(scan.names), bytes(scan.contents), bytes(scan.labelsets), scan.hashed_labelsets,
            sorted(scan.sizes.items()), list(facts.scan.counts.items()), list(facts.scan.records.items()),
            list(facts.scan.ids.items()),
            {cid: [(key, sorted(row.items())) for key, row in picks.items]
             for cid, picks in facts.picker.by_class.items()},
            facts.picker.names, quality.unmeasured, list(quality.flags.items()),
            {cid: (name, stats.records, stats.sums, list(stats.flags.items()))
             for cid, (name, stats) in quality.classes.items()},
            {flag: sorted((a, b, sorted(r.items())) for a, b, r in heap) for flag, heap in quality.worst.items()},
            facts.near.rows, facts.diff, facts.rejects)


def _learnt(table: Any, separator: str | None, members: list[str]) -> tuple[dict[str, Any], NearDuplicateView]:
    """``scan_table`` of ``table`` as ``_reference`` gives it, and the near-duplicate view it fed (one group, of
    ``members``)."""
    picker, quality = SamplePicker(50, 12), QualityScan(50)
    near = NearDuplicateView.of([{"filename": name, "near_group": "g"} for name in members])
    scan = scan_table(table, separator, picker, quality, near, pairs=separator is not None, labelsets=True)
    rows = len(scan.names) // 8
    hashes = b"".join(bytes(part[8 * i:8 * i + 8]) for i in range(rows)
                      for part in (scan.names, scan.contents, scan.labelsets))
    return {"counts": scan.counts, "records": scan.records, "ids": scan.ids, "sizes": scan.sizes, "pairs": scan.pairs,
            "hashes": hashes, "picks": {cid: [row["filename"] for _, row in picker.by_class[cid].items]
                                        for cid in sorted(picker.by_class)},
            "flags": quality.flags, "unmeasured": quality.unmeasured,
            "quality": {cid: (name, [stats.records, *stats.sums], stats.flags)
                        for cid, (name, stats) in quality.classes.items()},
            "worst": {flag: sorted(((key, sha) for key, sha, _ in heap), reverse=True)
                      for flag, heap in quality.worst.items()}}, near


@pytest.mark.parametrize("separator", [None, "|", ";"])
def test_the_columns_learn_what_the_rows_learn_one_by_one(tmp_path: Path, separator: str | None) -> None:
    rows = _rows(3 * SCAN_BATCH + 123, seed=1, multi=separator)
    expected = _reference(rows, separator)
    from_file = _Rows(Storage(), _write(tmp_path / "labels.csv", rows))
    for table in (label_table(from_file), rows_table(rows)):  # the file read by polars, or the rows as dicts
        learnt, near = _learnt(table, separator, [rows[7]["filename"], rows[8]["filename"], "none"])
        for key in ("counts", "records", "ids", "sizes"):  # (in the order the rows first show them, too)
            assert list(learnt[key].items()) == list(expected[key].items()), key
        assert learnt["pairs"] == expected["pairs"]
        assert learnt["hashes"] == expected["hashes"]
        assert learnt["picks"] == expected["picks"] and len(learnt["picks"]) == 50
        assert (learnt["unmeasured"], learnt["flags"]) == (expected["unmeasured"], expected["flags"])
        assert list(learnt["quality"]) == list(expected["quality"])  # classes in the order measured rows show them
        for cid, (name, sums, flags) in expected["quality"].items():
            assert learnt["quality"][cid][0] == name and learnt["quality"][cid][2] == flags
            assert learnt["quality"][cid][1] == pytest.approx(sums, rel=1e-12)
        assert learnt["worst"] == expected["worst"] and set(learnt["worst"]) == set(FLAGS)
        assert near.rows["g"] == [rows[7], rows[8]]  # the shown group's members, as rows
    assert any("\n" in row["filename"] for row in rows) and any('"' in row["filename"] for row in rows)


def test_a_card_of_odd_names_read_from_its_file_is_the_card_of_its_rows(tmp_path: Path) -> None:
    """The card (and its diff against a previous version) made from the files, read by polars, is the card made
    from the same rows given as dicts: the same bytes."""
    storage = Storage()
    old_rows = _rows(SCAN_BATCH + 500, seed=2)
    new_rows = [row for i, row in enumerate(old_rows) if i % 40] + _rows(300, seed=3, prefix="new")
    new_rows[3] = {**new_rows[3], "sha256": "f" * 64}  # changed
    classes = sorted({row["label"] for row in old_rows + new_rows})
    manifest = make_manifest(new_rows, classes, previous_version="v1")
    old_manifest = make_manifest(old_rows, classes, version="v1")

    def card(labels: Any, old: Any) -> dict[str, bytes]:
        previous = PreviousVersion(old_manifest, old)
        facts = scan_labels(None, len(classes), labels, lambda: iter(REJECTS), previous)
        assert facts.diff is not None and facts.diff.changed == 1 and facts.diff.removed == len(old_rows[::40])
        assert new_rows[3]["filename"] in facts.diff.examples["changed"]
        return build_card(manifest, labels, lambda: iter(REJECTS), previous, lambda _row: None, facts=facts)

    from_files = card(_Rows(storage, _write(tmp_path / "labels.csv", new_rows)),
                      _Rows(storage, _write(tmp_path / "old.csv", old_rows)))
    assert from_files == card(lambda: iter(new_rows), lambda: iter(old_rows))
    assert "card/label-rows.bin" not in from_files  # the card keeps no private copy of labels.csv's columns


@pytest.mark.parametrize(("damage", "message"), [
    ("label_id", "label id '5x' is not a whole number"), ("ids", "2 labels but 1 label ids"),
    ("flag", "unknown quality flags ['mystery']"), ("column", "labels.csv has no column split"),
    ("measure", "brightness 'bright' is not a number")])
def test_a_table_the_card_cannot_read_fails_naming_what_is_wrong(damage: str, message: str) -> None:
    rows = _rows(50, seed=4, multi="|" if damage == "ids" else None)
    at = next(i for i, row in enumerate(rows) if all(row[name] for name in MEASURES) and row["label"])
    if damage == "label_id":
        rows[at]["label_id"] = "5x"
    elif damage == "ids":
        rows[at] |= {"label": "c01|c02", "label_id": "1"}
    elif damage == "flag":
        rows[at]["quality"] = "mystery"
    elif damage == "measure":
        rows[at]["brightness"] = "bright"
    else:
        rows = [{key: value for key, value in row.items() if key != "split"} for row in rows]
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")) as failed:
        scan_table(rows_table(rows), "|" if damage == "ids" else None, SamplePicker(50, 12), QualityScan(50))
    if damage in ("label_id", "ids", "measure"):
        assert repr(rows[at]["filename"]) in str(failed.value)  # the row is named
