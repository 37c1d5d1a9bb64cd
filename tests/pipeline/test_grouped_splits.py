"""Grouped splits (issue 25): a labels.csv column (``--group-column``) keys the split, so all of a
patient's images land in one split; read back with TensorFlow. Nights keep published records where
they are; a near-duplicate pair with two group values follows the smaller group value; clear errors."""

from __future__ import annotations

import csv
import random
import shutil
from collections import defaultdict
from pathlib import Path

import pytest

from image_tfrecords.rules.splits import assign_split
from image_tfrecords.storage import Storage
from tests.near_duplicates_corpus import write_corpus
from tests.support import one_line, read_csv, run_cli
from tests.tf_reader import read_version

SPLITS = {"train": 0.6, "validation": 0.2, "test": 0.2}
PATIENTS = 12


def write_source(folder: Path, images: int, seed: int, start: int = 0) -> dict[str, str]:
    """``images`` small noisy JPEGs in ``folder`` and their rows (appended to its labels.csv): filename ->
    patient, every tenth image without one."""
    from PIL import Image

    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows: dict[str, str] = {}
    for i in range(start, start + images):
        image = Image.effect_noise((40, 32), 40 + rng.random() * 30).convert("RGB")
        name = f"scans/img{i:04d}.jpg"
        (folder / name).parent.mkdir(exist_ok=True)
        image.save(folder / name, quality=90)
        rows[name] = "" if i % 10 == 9 else f"patient-{rng.randrange(PATIENTS):02d}"
    labels = folder / "labels.csv"
    new = not labels.exists()
    with open(labels, "a", newline="") as f:
        writer = csv.writer(f)
        if new:
            writer.writerow(["filename", "label", "patient"])
        writer.writerows([name, "ab"[i % 2], patient] for i, (name, patient) in enumerate(rows.items()))
    return rows


def build(source: Path, dest: Path, version: str, *extra: str) -> None:
    result = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", "d", "--version",
                     version, "--no-progress", "--splits", "train=0.6,validation=0.2,test=0.2", *extra)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def splits_of(version: Path) -> dict[str, str]:
    return {row["filename"]: row["split"] for row in read_csv(version / "labels.csv")}


def test_every_patient_lands_in_one_split(tmp_path: Path) -> None:
    patients = write_source(tmp_path / "source", 120, seed=1)
    build(tmp_path / "source", tmp_path / "out", "v1", "--group-column", "patient")
    version = tmp_path / "out" / "d" / "v1"
    manifest, records = read_version(Storage(), str(version))  # TensorFlow reads every record
    read = {r["image/filename"].decode(): split for split, rows in records.items() for r in rows}
    assert sorted(read) == sorted(patients)
    by_patient: dict[str, set[str]] = defaultdict(set)
    for name, split in read.items():
        if patients[name]:
            by_patient[patients[name]].add(split)
            assert split == assign_split("", "", SPLITS, patients[name])
        else:  # an empty cell: the content hash decides, as without a group column
            sha = next(r["sha256"] for r in read_csv(version / "labels.csv") if r["filename"] == name)
            assert split == assign_split(sha, "", SPLITS)
    assert all(len(splits) == 1 for splits in by_patient.values()), by_patient
    assert len({next(iter(s)) for s in by_patient.values()}) >= 2  # the patients are spread over splits
    assert manifest["params"]["group_column"] == "patient"
    # without the column, the same source splits by content: patients straddle splits
    build(tmp_path / "source", tmp_path / "plain", "v1")
    plain: dict[str, set[str]] = defaultdict(set)
    for name, split in splits_of(tmp_path / "plain" / "d" / "v1").items():
        plain[patients[name]].add(split)
    assert any(len(splits) > 1 for patient, splits in plain.items() if patient)


def test_a_night_keeps_published_records_and_full_agrees(tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_source(source, 60, seed=2)
    build(source, tmp_path / "out", "v1", "--group-column", "patient")
    first = splits_of(tmp_path / "out" / "d" / "v1")
    shutil.copytree(tmp_path / "out", tmp_path / "full")
    added = write_source(source, 30, seed=3, start=60)  # new images of the same patients
    rows = read_csv(source / "labels.csv")  # and a published image moved to another patient's records
    moved = next(r for r in rows if r["filename"] in first and r["patient"])
    moved["patient"] = next(p for p in (f"patient-{i:02d}" for i in range(PATIENTS))
                            if assign_split("", "", SPLITS, p) != first[moved["filename"]])
    with open(source / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, ["filename", "label", "patient"])
        writer.writeheader()
        writer.writerows(rows)
    build(source, tmp_path / "out", "v2", "--group-column", "patient")
    build(source, tmp_path / "full", "v2", "--group-column", "patient", "--full")
    second = splits_of(tmp_path / "out" / "d" / "v2")
    assert all(second[name] == split for name, split in first.items())  # published records never move
    for name, patient in added.items():  # a new image goes where its patient's rule puts it
        if patient:
            assert second[name] == assign_split("", "", SPLITS, patient)
    assert second == splits_of(tmp_path / "full" / "d" / "v2")  # incremental and --full agree


def test_a_near_duplicate_pair_follows_the_smaller_group_value(tmp_path: Path) -> None:
    source = tmp_path / "source"
    _, variants = write_corpus(source, 6, 6, seed=11)
    rows = []
    for number, (original, copies) in enumerate(variants.items()):  # a photo and its variants: two patients
        rows.append([original, original.split("/")[0], f"z-patient-{number}"])
        rows += [[copy, copy.split("/")[0], f"a-patient-{number}"] for copy in copies]
    with open(source / "labels.csv", "w", newline="") as f:
        csv.writer(f).writerows([["filename", "label", "patient"], *rows])
    build(source, tmp_path / "out", "v1", "--group-column", "patient", "--near-duplicate-bits", "12")
    splits = splits_of(tmp_path / "out" / "d" / "v1")
    groups = {r["filename"]: r["near_group"] for r in read_csv(tmp_path / "out" / "d" / "v1" / "near_duplicates.csv")}
    followed = 0
    for number, original in enumerate(variants):
        if original in groups:  # grouped with its variants: the group goes where a-patient-N's rule says
            assert splits[original] == assign_split("", "", SPLITS, f"a-patient-{number}")
            followed += 1
    assert followed >= 5


@pytest.mark.parametrize(("column", "layout", "message"), [
    ("patient", "folders", "group_column patient is a column of a labels.csv, and "),
    ("ward", "labels", "has no column ward, which group_column names"),
    ("label", "labels", "group_column must name another labels.csv column than label"),
])
def test_a_group_column_that_cannot_be_read_is_one_clear_error(tmp_path: Path, column: str, layout: str,
                                                               message: str) -> None:
    source = tmp_path / "source"
    write_source(source, 4, seed=4)
    if layout == "folders":
        (source / "labels.csv").unlink()
    result = run_cli("build", "--source", str(source), "--destination", str(tmp_path / "out"), "--dataset", "d",
                     "--group-column", column, "--no-progress")
    assert result.returncode != 0
    assert message in one_line(result.stderr)
    assert not (tmp_path / "out" / "d" / "latest.json").exists()
