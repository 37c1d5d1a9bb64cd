"""validate's pass over labels.csv (``_label_columns``) and the duplicate resolver's over images.csv
(``content_columns``) read their tables as polars columns, one path for every name: a name or label holding a
comma, a quote, a line feed, a carriage return or non-ASCII text gives what ``csv`` reads, and a damaged table is
refused as before."""

from __future__ import annotations

import csv
import hashlib
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import BuildError
from image_tfrecords.records.schema import LABELS_FIELDS
from image_tfrecords.rules.splits import DuplicateResolver, content_columns
from image_tfrecords.shards.checks import name_hash
from image_tfrecords.stages.validate import _label_columns
from image_tfrecords.staging import IMAGE_FIELDS, LABELS, staged
from image_tfrecords.storage import Storage
from image_tfrecords.storage.documents import RowWriter

HOSTILE = ["a,comma", 'a "quote"', "line\nfeed", "cr\ronly", "crlf\r\nboth", '"', " spaces ", "caf\u00e9 \u65e5\u672c",
           "\u2028sep", "plain"]
CLASSES = ["cat", 'odd, "label"', "caf\u00e9\nline", "", "dog"]


def _sha(i: int) -> str:
    """Every 7th image: the bytes of the one five before (the same label); every 11th, of the one before (another)."""
    return hashlib.sha256(b"%d" % (i - 5 if i % 7 == 0 and i >= 5 else i - 1 if i % 11 == 0 else i)).hexdigest()


def _images(count: int = 60) -> list[dict[str, Any]]:
    return [{"label": CLASSES[i % len(CLASSES)], "filename": f"{CLASSES[i % len(CLASSES)]}/{HOSTILE[i % len(HOSTILE)]}"
             f"_{i}.jpg", "num_bytes": 100 + i, "sha256": _sha(i), "width": 4, "height": 3, "channels": 3,
             "format": "jpeg", "quality": "" if i % 3 else "dark"} for i in range(count)]


def _write(uri: str, fields: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    with RowWriter(Storage(), uri, fields) as writer:
        for row in rows:
            writer.write(row)


def _read(uri: str) -> list[dict[str, str]]:
    with open(uri, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _cfg(tmp_path: Path) -> BuildConfig:
    return BuildConfig(source=str(tmp_path / "src"), destination=str(tmp_path / "dst"), dataset="d", version="v1")


def _labels_table(tmp_path: Path, rows: list[dict[str, Any]]) -> BuildConfig:
    cfg = _cfg(tmp_path)
    _write(staged(cfg, LABELS), LABELS_FIELDS, rows)
    return cfg


def _label_rows() -> list[dict[str, Any]]:
    splits = ["train", "validation", "test", "train"]
    return [{**row, "split": splits[i % 4], "label_id": i % 5, "shard": f"{splits[i % 4]}-00000-of-00001.tfrecord",
             "shard_position": i} for i, row in enumerate(_images())]


def test_label_columns_read_hostile_names_as_csv_does(tmp_path: Path) -> None:
    cfg = _labels_table(tmp_path, _label_rows())
    text = Path(staged(cfg, LABELS)).read_bytes()
    assert all(odd in text for odd in (b",comma", b'""quote""', b"line\nfeed", b"cr\ronly", b"crlf\r\n"))
    counts, digests, contents = _label_columns(cfg, Storage())
    expected_counts: Counter[str] = Counter()
    expected_digests: Counter[str] = Counter()
    expected_contents: dict[str, list[int]] = {}
    for row in _read(staged(cfg, LABELS)):
        expected_counts[row["split"]] += 1
        expected_digests[row["split"]] += name_hash(row["filename"])
        expected_contents.setdefault(row["split"], []).append(int(row["sha256"][:16], 16))
    assert counts == expected_counts and digests == expected_digests
    assert {split: prefixes.tolist() for split, prefixes in contents.items()} == expected_contents
    assert all(prefixes.dtype == np.uint64 for prefixes in contents.values())


def test_label_columns_of_a_table_without_rows(tmp_path: Path) -> None:
    assert _label_columns(_labels_table(tmp_path, []), Storage()) == (Counter(), Counter(), {})


def test_label_columns_refuse_a_damaged_table(tmp_path: Path) -> None:
    rows = _label_rows()
    cfg = _labels_table(tmp_path, [*rows[:5], {**rows[5], "sha256": "not-a-digest"}])
    with pytest.raises(ValueError, match="is not hex digits: 'not-a-digest'"):
        _label_columns(cfg, Storage())
    _write(staged(cfg, LABELS), tuple(f for f in LABELS_FIELDS if f != "sha256"), rows)
    with pytest.raises(KeyError, match="sha256"):
        _label_columns(cfg, Storage())
    uri = Path(staged(cfg, LABELS))
    _write(str(uri), LABELS_FIELDS, rows)
    uri.write_bytes(uri.read_bytes() + b"x,y" + b",z" * len(LABELS_FIELDS) + b"\n")  # a row of more fields
    with pytest.raises(BuildError, match="is not a table this package wrote"):
        _label_columns(cfg, Storage())


def _first_pass_by_rows(rows: list[dict[str, str]]) -> tuple[list[int], list[int], dict[str, int]]:
    """What ``DuplicateResolver`` learns of ``rows`` in its own first pass (without columns)."""
    label_number: dict[str, int] = {}
    numbers = [label_number.setdefault(row["label"], len(label_number)) for row in rows]
    return [int(row["sha256"][:16], 16) for row in rows], numbers, label_number


def _content(uri: str) -> tuple[Any, Any, dict[str, int]] | None:
    col = {name: i for i, name in enumerate(IMAGE_FIELDS)}
    return content_columns(Storage(), uri, ",".join(col), col)


def test_content_columns_read_hostile_names_and_labels_as_rows_do(tmp_path: Path) -> None:
    uri = str(tmp_path / "images.csv")
    _write(uri, IMAGE_FIELDS, _images())
    found = _content(uri)
    assert found is not None
    prefixes, numbers, label_number = found
    rows = _read(uri)
    assert (prefixes.tolist(), numbers.tolist(), label_number) == _first_pass_by_rows(rows)
    assert list(label_number) == CLASSES and prefixes.dtype == np.uint64 and numbers.dtype == np.int64
    triples = [(row["filename"], row["label"], row["sha256"]) for row in rows]
    by_columns, by_rows = DuplicateResolver(triples, found), DuplicateResolver(triples)
    assert by_columns.verdicts == by_rows.verdicts and by_columns.kept_labels() == by_rows.kept_labels()
    assert any(reason == "duplicate" for reason, _ in by_columns.verdicts.values())
    assert any(reason == "label_conflict" for reason, _ in by_columns.verdicts.values())


def test_content_columns_of_a_table_without_rows(tmp_path: Path) -> None:
    uri = str(tmp_path / "images.csv")
    _write(uri, IMAGE_FIELDS, [])
    found = _content(uri)
    assert found is not None
    assert (found[0].dtype, found[1].dtype, len(found[0]), len(found[1]), found[2]) == (np.uint64, np.int64, 0, 0, {})
    assert DuplicateResolver([], found).kept_labels() == set()


def test_content_columns_leave_a_damaged_digest_or_other_columns_to_the_rows(tmp_path: Path) -> None:
    """A sha256 that is not hex digits, or another header: None (the resolver reads the rows, whose ``int`` reads or
    refuses each value as it did); an upper-case digest reads as ``int`` reads it."""
    images = _images(10)
    uri = str(tmp_path / "images.csv")
    _write(uri, IMAGE_FIELDS, [*images[:4], {**images[4], "sha256": "zz" + images[4]["sha256"][2:]}])
    assert _content(uri) is None
    _write(uri, IMAGE_FIELDS, [*images[:4], {**images[4], "sha256": ""}])
    assert _content(uri) is None
    _write(uri, ("label", "filename", "sha256"), images)
    assert _content(uri) is None
    _write(uri, IMAGE_FIELDS, [{**row, "sha256": row["sha256"].upper()} for row in images])
    found = _content(uri)
    assert found is not None and found[0].tolist() == _first_pass_by_rows(_read(uri))[0]
