"""The passes over every row that read their tables as columns (``storage.csv_blocks``) stage exactly what the
row-by-row passes stage: a night is staged twice, once as columns and once with every table read row by row
(as a table holding a quoted field is), and each staged table is compared byte for byte."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import stages
from image_tfrecords.card import label_columns
from image_tfrecords.card.row_columns import ROWS_FILE
from image_tfrecords.config import BuildConfig
from image_tfrecords.rules import base_version, splits
from image_tfrecords.stages import inspect as inspect_stage
from image_tfrecords.stages import plan as plan_stage
from image_tfrecords.stages import split as split_stage
from image_tfrecords.storage import Storage
from image_tfrecords.storage.csv_blocks import Quoted
from tests.pipeline.test_incremental import Images, add, night_source

STAGED_BEFORE_SHARDS = ("discover", "inspect", "split", "plan")


def _staged_tables(cfg: BuildConfig, storage: Storage) -> dict[str, str]:
    """Each staged file of the metadata stages (not the shards' work) and its SHA-256."""
    root = Path(cfg.staging_uri)
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.parts[len(root.parts)] != "shards"}


def _stage_night(cfg: BuildConfig, storage: Storage) -> dict[str, str]:
    by_name = {stage.name: stage for stage in stages.PIPELINE}
    for name in STAGED_BEFORE_SHARDS:
        stage = by_name[name]
        if stage.per_image:
            stage.run(cfg, storage, workers=1)
        else:
            stage.run(cfg, storage)
    return _staged_tables(cfg, storage)


def _row_by_row(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make every column reader say its table is quoted; returns the modules patched."""
    def quoted(*_args: Any, **_kwargs: Any) -> Any:
        raise Quoted("this test reads every table row by row")

    patched = []
    for module in (base_version, splits, plan_stage, split_stage, inspect_stage):
        if hasattr(module, "blocks"):
            monkeypatch.setattr(module, "blocks", quoted)
            patched.append(module.__name__)
    return patched


def test_a_night_staged_as_columns_is_the_night_staged_row_by_row(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Added, deleted and changed images, a duplicate of a kept image and one of a new image: the staged listing,
    inspection join, images.csv, records, rejects, labels.csv, members and plan are the same bytes both ways."""
    storage = Storage()
    source, dest = night_source(tmp_path)
    circles = sorted((source.folder / "circles").iterdir())
    source.put("squares/copy_of_a_circle.jpg", circles[0].read_bytes())  # same bytes, another label: both rejected
    source.put("circles/zz_copy.jpg", circles[1].read_bytes())  # same bytes, same label: the later name is a duplicate
    add(source, Images(tmp_path / "more", seed=2000), "triangles", "extra", 2)
    copy = tmp_path / "copy"
    shutil.copytree(dest, copy)
    cfg = BuildConfig(source=source.uri, destination=str(dest), dataset="d", version="v2", shard_size_mb=0.02)
    as_columns = _stage_night(cfg, storage)

    assert len(_row_by_row(monkeypatch)) == 5
    cfg_rows = BuildConfig(source=source.uri, destination=str(copy), dataset="d", version="v2", shard_size_mb=0.02)
    by_rows = _stage_night(cfg_rows, storage)
    assert {"labels.csv", "records.csv", "images.csv", "inspected.csv", "rejects.csv", "plan.json",
            "inspect/carried.csv"} <= set(as_columns)
    assert any(name.startswith("members/") for name in as_columns)
    assert as_columns == by_rows
    rejects = (Path(cfg.staging_uri) / "rejects.csv").read_text()
    assert "label_conflict" in rejects and "duplicate" in rejects
    assert '"' not in (Path(cfg.staging_uri) / "labels.csv").read_text()  # (the columns path was the one taken)



def test_the_cards_pass_over_a_staged_night_is_the_same_as_columns_and_as_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The card's pass over the staged labels.csv (real quality cells, flags, a previous version to diff) learns
    the same as columns (``card.label_columns``) and as rows."""
    from image_tfrecords.stages import card as card_stage
    from tests.unit.test_card_columns import _facts_key

    storage = Storage()
    source, dest = night_source(tmp_path)
    add(source, Images(tmp_path / "more", seed=2000), "triangles", "extra", 3)
    cfg = BuildConfig(source=source.uri, destination=str(dest), dataset="d", version="v2", shard_size_mb=0.02)
    _stage_night(cfg, storage)
    taken = []
    monkeypatch.setattr("image_tfrecords.card.sections.scan_columns",
                        lambda *a: taken.append(1) or label_columns.scan_columns(*a))
    as_columns = card_stage.card_facts(cfg, storage)
    monkeypatch.delattr(card_stage._Rows, "columns")
    monkeypatch.delattr(card_stage._Rows, "names_at")
    by_rows = card_stage.card_facts(cfg, storage)
    assert taken == [1]
    assert as_columns.diff is not None
    assert (as_columns.diff.added, as_columns.diff.removed, as_columns.diff.changed) == (12, 2, 1)
    assert _facts_key(as_columns) == _facts_key(by_rows)
    assert as_columns.columns is not None and by_rows.columns is None
    assert as_columns.parsed == 12 + 1  # the added and changed rows: the kept ones' columns are the previous card's
    monkeypatch.undo()
    saved = Path(dest) / "d" / "v1" / ROWS_FILE
    saved.write_bytes(saved.read_bytes()[:-8])  # the previous card's columns, damaged: every row is parsed
    again = card_stage.card_facts(cfg, storage)
    assert again.parsed == again.columns.count == as_columns.columns.count  # type: ignore[union-attr]
    assert _facts_key(again) == _facts_key(by_rows)
