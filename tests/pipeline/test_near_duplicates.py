"""Near-duplicate groups through the command line (issue 25): a corpus of distinct photos and their
variants (re-encodes, resizes, crops, EXIF-rotated copies, brightness), built and read back with
TensorFlow; nights that add variants of published photos; near-duplicates under two labels."""

from __future__ import annotations

import itertools
import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
from PIL import Image, ImageDraw

from image_tfrecords.images.perceptual import distance
from image_tfrecords.options import DEFAULT_SPLITS as SPLITS
from image_tfrecords.options import default
from image_tfrecords.rules import near_duplicates as nd
from image_tfrecords.rules.splits import assign_split
from image_tfrecords.storage import Storage
from tests.near_duplicates_corpus import KINDS, write_corpus
from tests.support import read_csv, run_cli
from tests.tf_reader import read_version

PHOTOS, WITH_VARIANTS = 48, 20


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], dict[str, list[str]]]:
    folder = tmp_path_factory.mktemp("near") / "source"
    originals, variants = write_corpus(folder, PHOTOS, WITH_VARIANTS, seed=7)
    return folder, originals, variants


def build(source: Path, dest: Path, version: str, *extra: str) -> None:
    result = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", "d", "--version",
                     version, "--workers", "2", "--no-progress", "--near-duplicate-bits", "12", *extra)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]


def groups_of(version: Path) -> dict[str, str]:
    return {row["filename"]: row["near_group"] for row in read_csv(version / "near_duplicates.csv")}


def test_variants_grouped_in_one_split_and_distinct_photos_never(corpus, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source, originals, variants = corpus
    build(source, tmp_path, "v1")
    version = tmp_path / "d" / "v1"
    labels = {row["filename"]: row for row in read_csv(version / "labels.csv")}
    assert not read_csv(version / "rejects.csv")  # near-duplicates under one label are all kept
    groups = groups_of(version)
    pairs = [(original, copy) for original, copies in variants.items() for copy in copies]
    grouped = [groups.get(a) is not None and groups.get(a) == groups.get(b) for a, b in pairs]
    assert sum(grouped) >= 0.95 * len(pairs) == 0.95 * WITH_VARIANTS * len(KINDS), [
        pair for pair, ok in zip(pairs, grouped, strict=True) if not ok]
    distinct = list(itertools.combinations(originals, 2))
    together = [(a, b) for a, b in distinct if groups.get(a) is not None and groups.get(a) == groups.get(b)]
    assert len(together) <= 0.001 * len(distinct), together
    for a, b in pairs:  # every variant where its photo is, grouped or not found
        assert labels[a]["split"] == labels[b]["split"] or groups.get(a) != groups.get(b)
    assert all(labels[a]["split"] == labels[b]["split"] for (a, b), ok in zip(pairs, grouped, strict=True) if ok)
    for name, group in groups.items():  # the published file agrees with labels.csv
        assert labels[name]["split"] == next(r["split"] for r in read_csv(version / "near_duplicates.csv")
                                             if r["filename"] == name) and len(group) == 16
    manifest, splits = read_version(Storage(), str(version))  # TensorFlow reads every record
    assert sorted(r["image/filename"].decode() for records in splits.values() for r in records) == sorted(labels)
    assert manifest["build"]["near_duplicates"]["groups_found"] >= 0.95 * WITH_VARIANTS
    card = (version / "card.md").read_text()  # the card shows the largest groups side by side
    section = card[card.index("## Near-duplicates"):].split("\n## ", 1)[0]
    assert f"{len(set(groups.values())):,} groups of near-duplicate images ({len(groups):,} records)" in section
    strips = sorted((version / "card" / "near-duplicates").iterdir())
    assert len(strips) == 6 and all(path.stat().st_size > 0 for path in strips)
    largest = max(Counter(groups.values()).values())
    assert f"| {largest} |" in section


def test_nights_keep_published_splits_and_full_agrees(corpus, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source, originals, variants = corpus
    night = tmp_path / "source"
    night.mkdir()
    for name in originals:  # the first version: the photos alone
        (night / name).parent.mkdir(exist_ok=True)
        shutil.copy(source / name, night / name)
    build(night, tmp_path / "out", "v1")
    first = {r["filename"]: r["split"] for r in read_csv(tmp_path / "out" / "d" / "v1" / "labels.csv")}
    shutil.copytree(tmp_path / "out", tmp_path / "full")  # the same base for a --full night
    for copies in variants.values():  # the night: their variants arrive
        for name in copies:
            shutil.copy(source / name, night / name)
    build(night, tmp_path / "out", "v2")
    build(night, tmp_path / "full", "v2", "--full")
    second = {r["filename"]: r["split"] for r in read_csv(tmp_path / "out" / "d" / "v2" / "labels.csv")}
    assert all(second[name] == split for name, split in first.items())  # published records never move
    groups = groups_of(tmp_path / "out" / "d" / "v2")
    joined = [(a, b) for a, copies in variants.items() for b in copies
              if groups.get(b) and groups.get(b) == groups.get(a)]
    assert len(joined) >= 0.95 * WITH_VARIANTS * len(KINDS)
    assert all(second[b] == first[a] for a, b in joined)  # each variant joined its photo's published split
    full = {r["filename"]: r["split"] for r in read_csv(tmp_path / "full" / "d" / "v2" / "labels.csv")}
    assert full == second  # a --full rebuild on the same base gives the same records, in the same splits
    assert groups_of(tmp_path / "full" / "d" / "v2") == groups


def test_near_duplicates_under_two_labels(corpus, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    source, originals, variants = corpus
    photo = next(iter(variants))
    copy = next(name for name in variants[photo] if "_quality" in name)
    other = "beta" if not photo.startswith("beta/") else "gamma"
    folder = tmp_path / "src"
    for name in [*originals[:10], photo]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / name, folder / name)
    (folder / other).mkdir(exist_ok=True)
    shutil.copy(source / copy, folder / other / "relabelled.jpg")
    build(folder, tmp_path / "out", "v1")
    rejects = {r["filename"]: r for r in read_csv(tmp_path / "out" / "d" / "v1" / "rejects.csv")}
    assert {name: r["reason"] for name, r in rejects.items()} == {
        photo: "near_duplicate_label_conflict", f"{other}/relabelled.jpg": "near_duplicate_label_conflict"}
    assert "labelled" in rejects[photo]["detail"]
    build(folder, tmp_path / "keep", "v1", "--near-duplicate-labels", "keep")
    labels = {r["filename"]: r for r in read_csv(tmp_path / "keep" / "d" / "v1" / "labels.csv")}
    assert labels[photo]["split"] == labels[f"{other}/relabelled.jpg"]["split"]
    assert not read_csv(tmp_path / "keep" / "d" / "v1" / "rejects.csv")
    build(folder, tmp_path / "off", "v1", "--near-duplicate-bits", "0")  # off: as before, both kept
    assert not read_csv(tmp_path / "off" / "d" / "v1" / "rejects.csv")
    assert read_csv(tmp_path / "off" / "d" / "v1" / "near_duplicates.csv") == []


def faint(size: tuple[int, int], colour: tuple[int, int, int]) -> Image.Image:
    """A near-uniform picture: ``colour`` with a faint left-to-right ramp (contrast about 5): every such
    picture hashes alike, whatever its colour."""
    ramp = Image.linear_gradient("L").rotate(90).resize(size).point(lambda v: v * 16 // 255)
    return Image.merge("RGB", [ramp.point(lambda v, c=c: min(255, c + v)) for c in colour])


def shape(size: tuple[int, int], colour: tuple[int, int, int]) -> Image.Image:
    """A small flat graphic (as ``image-tfrecords sample`` draws): a disc on a plain background."""
    image = Image.new("RGB", size, (240, 240, 240))
    ImageDraw.Draw(image).ellipse((size[0] // 8, size[1] // 6, size[0] // 2, size[1] * 2 // 3), fill=colour)
    return image


def test_by_default_variants_share_a_split_and_unreliable_hashes_group_with_nothing(corpus, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Issue 51: a build with no near-duplicate option groups photos with their variants; flat pictures and
    small graphics, whose hashes are alike across labels, are left out by the reliability gate and counted."""
    source, _, variants = corpus
    folder = tmp_path / "src"
    chosen = dict(list(variants.items())[:6])
    for name in [*chosen, *(copy for copies in chosen.values() for copy in copies)]:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source / name, folder / name)
    unreliable = {"alpha/faint.jpg": faint((480, 360), (60, 90, 200)),
                  "beta/faint.png": faint((480, 360), (200, 90, 60)),
                  "alpha/disc.jpg": shape((nd.MIN_SIDE - 8, nd.MIN_SIDE - 20), (200, 30, 30)),
                  "gamma/disc.png": shape((nd.MIN_SIDE - 8, nd.MIN_SIDE - 20), (30, 30, 200))}
    for name, image in unreliable.items():
        image.save(folder / name)
    result = run_cli("build", "--source", str(folder), "--destination", str(tmp_path), "--dataset", "d", "--version",
                     "v1", "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    version = tmp_path / "d" / "v1"
    assert not read_csv(version / "rejects.csv")  # nothing lost: no label conflict among the unreliable ones
    labels = {row["filename"]: row for row in read_csv(version / "labels.csv")}
    groups = groups_of(version)
    inspected = {row["filename"]: row for row in read_csv(version / "inspected.csv")}
    left_out = {name for name, row in inspected.items() if nd.gated(row)}
    pairs = [(photo, copy) for photo, copies in chosen.items() for copy in copies if not {photo, copy} & left_out]
    assert len(pairs) >= 0.9 * len(chosen) * len(KINDS)
    assert all(labels[a]["split"] == labels[b]["split"] for a, b in pairs)
    assert sum(groups.get(a) is not None and groups.get(a) == groups.get(b) for a, b in pairs) >= 0.95 * len(pairs)
    assert set(unreliable) <= left_out and not left_out & set(groups)
    hashes = {name: row["phash"] for name, row in inspected.items()}
    # near, and across labels: without the gate, both were rejected (the discs are left out for their size)
    assert distance(hashes["alpha/faint.jpg"], hashes["beta/faint.png"]) <= default("near_duplicate_bits")
    manifest = json.loads((version / "manifest.json").read_text())
    near = manifest["build"]["near_duplicates"]
    assert near["bits"] == default("near_duplicate_bits") > 0 and near["gated"] == len(left_out)
    assert manifest["params"]["near_duplicate_bits"] == default("near_duplicate_bits")


def test_the_sample_images_lose_nothing_by_default(sample_dir: Path, tmp_path: Path) -> None:
    """``image-tfrecords sample``'s flat shapes: by default none is grouped or rejected, and each is where its
    content hash puts it, as with the search off."""
    result = run_cli("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", "d",
                     "--version", "v1", "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    version = tmp_path / "d" / "v1"
    labels = read_csv(version / "labels.csv")
    assert len(labels) == 60 and not read_csv(version / "rejects.csv") and not groups_of(version)
    assert all(row["split"] == assign_split(row["sha256"], "", SPLITS) for row in labels)
    near = json.loads((version / "manifest.json").read_text())["build"]["near_duplicates"]
    assert near["groups_found"] == 0
    assert near["gated"] == sum(nd.gated(row) for row in read_csv(version / "inspected.csv")) > 0
