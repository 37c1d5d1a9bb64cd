"""Image options and metadata columns across nightly builds: changing an option rewrites every shard,
keeping them reuses the shards of the night before; a changed metadata value rewrites its record."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from image_tfrecords import cli, labels
from image_tfrecords.images.sample import make_sample
from image_tfrecords.records.example import decode_example
from image_tfrecords.records.tfrecord import read_records


def _build(source: Path, dest: Path, version: str, *flags: str) -> dict[str, Any]:
    code = cli.main(["build", "--source", str(source), "--destination", str(dest), "--dataset", "d",
                     "--version", version, "--workers", "1", "--no-progress", "--shard-size-mb", "0.02", *flags])
    assert code == 0
    return json.loads((dest / "d" / version / "manifest.json").read_text())


def _labels_file(source: Path, weights: dict[str, str]) -> None:
    with open(source / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label", "weight"])
        for name, weight in sorted(weights.items()):
            writer.writerow([name, name.split("/")[0], weight])


def test_options_decide_shard_reuse_and_metadata_changes_rewrite(tmp_path: Path) -> None:
    source, dest = tmp_path / "src", tmp_path / "out"
    make_sample(str(source), per_class=8, seed=3)
    names = sorted(str(p.relative_to(source)) for p in source.rglob("*.*"))
    weights = {name: str(i / 4) for i, name in enumerate(names)}
    _labels_file(source, weights)
    first = _build(source, dest, "v1", "--columns", "weight=float")
    assert first["columns"] == {"weight": "float"} and first["features"]["weight"] == {"dtype": "float", "shape": []}
    assert first["image"]["resize"] == "none" and first["build"]["mode"] == "full"

    resized = _build(source, dest, "v2", "--columns", "weight=float", "--resize", "longest:16", "--force")
    assert resized["build"]["mode"] == "full"
    assert resized["build"]["full_because"] == "resize changed since version v1"
    assert resized["params"]["resize"] == "longest:16"
    frame = labels(str(dest / "d" / "v2"))  # the records the writer made have no encoded size in labels.csv
    assert str(frame["encoded_bytes"].dtype) == "Int64" and frame["encoded_bytes"].isna().all()
    assert str(frame["width"].dtype) == "int64" and frame["weight"].tolist()[:2] == ["0.0", "0.25"]

    again = _build(source, dest, "v3", "--columns", "weight=float", "--resize", "longest:16", "--force")
    assert again["build"]["mode"] == "incremental"
    assert again["build"]["shards_reused"] == sum(len(s["shards"]) for s in again["splits"].values())
    shas = {s["file"]: s["sha256"] for split in resized["splits"].values() for s in split["shards"]}
    assert {s["file"]: s["sha256"] for split in again["splits"].values() for s in split["shards"]} == shas

    changed = names[0]
    _labels_file(source, {**weights, changed: "99.5"})
    night = _build(source, dest, "v4", "--columns", "weight=float", "--resize", "longest:16")
    assert night["build"]["mode"] == "incremental"
    assert night["build"]["shards_rewritten"] + night["build"]["shards_written"] >= 1
    with open(dest / "d" / "v4" / "labels.csv", newline="") as f:
        rows = {r["filename"]: r for r in csv.DictReader(f)}
    assert rows[changed]["weight"] == "99.5"
    assert "resize" in rows[changed]["transform"].split("+") and rows[changed]["encoded_sha256"] == ""
    shard = dest / "d" / "v4" / rows[changed]["shard"]
    with open(shard, "rb") as f:
        records = [decode_example(r) for r in read_records(f, "none")]
    mine = [r for r in records if r["image/filename"] == [changed.encode()]]
    assert len(mine) == 1 and mine[0]["weight"] == [99.5]
    assert max(mine[0]["image/width"][0], mine[0]["image/height"][0]) == 16


def test_resize_never_makes_an_image_over_max_pixels(tmp_path: Path) -> None:
    import pytest
    from PIL import Image

    from image_tfrecords.config import BuildConfig
    from image_tfrecords.errors import ConfigError

    with pytest.raises(ConfigError, match="resize 4000x4000 makes images of up to 16000000 pixels"):
        BuildConfig("src", "out", "d", "v", resize="4000x4000", fit="pad", max_pixels=10_000_000)
    BuildConfig("src", "out", "d", "v", resize="4000x4000", max_pixels=10_000_000)  # crop never enlarges

    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    for i in range(4):
        Image.new("RGB", (64, 48), (40 * i, 90, 20)).save(source / "a" / f"photo{i}.png")
    Image.new("RGB", (400, 10), (1, 2, 3)).save(source / "a" / "strip.png")  # shortest:100 -> 4000x100
    manifest = _build(source, tmp_path / "out", "v1", "--resize", "shortest:100", "--upscale",
                      "--max-pixels", "100000", "--max-reject-fraction", "0.5")
    assert manifest["num_records"] == 4 and manifest["rejects_by_reason"] == {"too_many_pixels": 1}
    with open(tmp_path / "out" / "d" / "v1" / "rejects.csv", newline="") as f:
        (reject,) = csv.DictReader(f)
    assert reject["filename"] == "a/strip.png" and "4000x100" in reject["detail"]
