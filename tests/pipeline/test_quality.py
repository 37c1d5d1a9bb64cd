"""Image-quality signals through the command line (issue 25): recorded in labels.csv and the manifest,
summarised on the card with a per-class skew, the reject policy, and reused by a night."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
from PIL import Image, ImageEnhance

from bench.make_corpus import synthetic_photo
from image_tfrecords.storage import Storage
from tests.support import read_csv, run_cli
from tests.tf_reader import read_version

PER_CLASS = 16


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``day`` photos, ``night`` photos (the same kind, darkened: a class a model could tell by brightness
    alone), one grey photo stored as RGB and one tiny image."""
    folder = tmp_path_factory.mktemp("quality") / "source"
    for label in ("day", "night"):
        (folder / label).mkdir(parents=True)
    for i in range(PER_CLASS):
        photo = synthetic_photo(random.Random(i), (320, 240))
        photo.save(folder / "day" / f"d{i:02d}.jpg", quality=90)
        dark = synthetic_photo(random.Random(1000 + i), (320, 240))
        ImageEnhance.Brightness(dark).enhance(0.12).save(folder / "night" / f"n{i:02d}.jpg", quality=90)
    synthetic_photo(random.Random(77), (320, 240)).convert("L").convert("RGB").save(folder / "day" / "grey.jpg")
    synthetic_photo(random.Random(78), (24, 24)).save(folder / "day" / "tiny.png")
    return folder


def build(source: Path, dest: Path, version: str, *extra: str) -> dict:
    result = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", "q", "--version",
                     version, "--no-progress", *extra)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return json.loads((dest / "q" / version / "manifest.json").read_text())


def test_signals_flags_and_the_card(source: Path, tmp_path: Path) -> None:
    manifest = build(source, tmp_path, "v1")
    rows = {row["filename"]: row for row in read_csv(tmp_path / "q" / "v1" / "labels.csv")}
    night = [name for name in rows if name.startswith("night/")]
    assert len(night) == PER_CLASS and all("dark" in rows[name]["quality"].split("|") for name in night)
    assert not any("dark" in rows[name]["quality"] for name in rows if name.startswith("day/"))
    assert "grey_as_colour" in rows["day/grey.jpg"]["quality"]
    # a PNG's pixels are decoded when a build decides on them: the near-duplicate search, on by default
    assert "tiny" in rows["day/tiny.png"]["quality"].split("|")
    assert all(0 <= float(row["brightness"]) <= 255 and float(row["contrast"]) >= 0 for row in rows.values())
    counted = {flag: sum(flag in row["quality"].split("|") for row in rows.values())
               for flag in ("dark", "grey_as_colour")}
    assert {flag: manifest["build"]["quality_flags"][flag] for flag in counted} == counted
    card = (tmp_path / "q" / "v1" / "card.md").read_text()
    section = card[card.index("## Image quality"):]
    assert "1 night: brightness" in section and "dark vs 0%" in section  # the skew is named
    assert (tmp_path / "q" / "v1" / "card" / "quality" / "dark.png").stat().st_size > 0


def test_rejecting_a_flag_keeps_every_other_image(source: Path, tmp_path: Path) -> None:
    manifest = build(source, tmp_path, "v1", "--quality-reject", "dark,tiny", "--max-reject-fraction", "0.6")
    rejects = {row["filename"]: row for row in read_csv(tmp_path / "q" / "v1" / "rejects.csv")}
    assert set(rejects) == {f"night/n{i:02d}.jpg" for i in range(PER_CLASS)} | {"day/tiny.png"}
    assert {row["reason"] for row in rejects.values()} == {"low_quality"}
    assert rejects["day/tiny.png"]["detail"] == "tiny" and rejects["night/n00.jpg"]["detail"].startswith("dark")
    _, splits = read_version(Storage(), str(tmp_path / "q" / "v1"))  # TensorFlow reads what was kept
    stored = sorted(r["image/filename"].decode() for records in splits.values() for r in records)
    assert stored == sorted([f"day/d{i:02d}.jpg" for i in range(PER_CLASS)] + ["day/grey.jpg"])
    assert manifest["params"]["quality_reject"] == "dark,tiny" and manifest["rejects_by_reason"] == {
        "low_quality": PER_CLASS + 1}


def test_a_night_reuses_the_signals(source: Path, tmp_path: Path) -> None:
    night = tmp_path / "source"
    shutil.copytree(source, night)
    build(night, tmp_path / "out", "v1")
    Image.open(night / "day" / "d00.jpg").rotate(90).save(night / "day" / "added.jpg", quality=90)
    manifest = build(night, tmp_path / "out", "v2")
    assert manifest["build"]["files_inspected"] == 1  # the others' signals come from v1's inspection
    first = {r["filename"]: r for r in read_csv(tmp_path / "out" / "q" / "v1" / "labels.csv")}
    second = {r["filename"]: r for r in read_csv(tmp_path / "out" / "q" / "v2" / "labels.csv")}
    columns = ("brightness", "contrast", "sharpness", "colourfulness", "quality")
    assert all([second[name][c] for c in columns] == [row[c] for c in columns] for name, row in first.items())
    assert second["day/added.jpg"]["brightness"] != ""


def test_a_night_takes_over_the_strips_whose_images_did_not_change(source: Path, tmp_path: Path) -> None:
    """The card's thumbnail strips made from the same images are the previous version's bytes (no image
    read, no PNG encoded); strips whose candidates changed are made afresh."""
    night = tmp_path / "source"
    shutil.copytree(source, night)
    build(night, tmp_path / "out", "v1")
    v1 = tmp_path / "out" / "q" / "v1"
    keys = json.loads((v1 / "card" / "strips.json").read_text())["strips"]
    assert {"card/samples/class-00000.png", "card/quality/dark.png"} <= set(keys)
    marker = v1 / "card" / "samples" / "class-00000.png"  # a stand-in: taken over, it shows in v2 as it is
    Image.new("RGB", (3, 3), (1, 2, 3)).save(marker)
    darkest = json.loads((v1 / "card" / "strips.json").read_text())["strips"]["card/quality/dark.png"]
    photo = synthetic_photo(random.Random(555), (320, 240))
    ImageEnhance.Brightness(photo).enhance(0.01).save(night / "night" / "darker.jpg", quality=90)
    build(night, tmp_path / "out", "v2")
    v2 = tmp_path / "out" / "q" / "v2"
    assert (v2 / "card" / "samples" / "class-00000.png").read_bytes() == marker.read_bytes()
    new_keys = json.loads((v2 / "card" / "strips.json").read_text())["strips"]
    assert new_keys["card/samples/class-00000.png"] == keys["card/samples/class-00000.png"]
    assert new_keys["card/quality/dark.png"] != darkest  # the new darkest image joined: made afresh
    assert (v2 / "card" / "quality" / "dark.png").read_bytes() != (v1 / "card" / "quality" / "dark.png").read_bytes()
