"""Edge cases of the image options and metadata columns found in review: a resumed build with other options,
PNG EXIF that decoders ignore, a carriage return in a value, JPEG's side limit, a changed separator,
a float where a whole number belongs."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from image_tfrecords import cli, stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import ConfigError
from image_tfrecords.records.example import decode_example
from image_tfrecords.records.tfrecord import read_records
from image_tfrecords.storage import Storage


def _build(source: Path, dest: Path, version: str, *flags: str) -> dict[str, Any]:
    code = cli.main(["build", "--source", str(source), "--destination", str(dest), "--dataset", "d",
                     "--version", version, "--workers", "1", "--no-progress", *flags])
    assert code == 0
    return json.loads((dest / "d" / version / "manifest.json").read_text())


def _records(version: Path) -> dict[str, dict[str, Any]]:
    out = {}
    for shard in sorted(version.glob("*.tfrecord")):
        with open(shard, "rb") as f:
            for record in read_records(f, "none"):
                example = decode_example(record)
                out[example["image/filename"][0].decode()] = example
    return out


def _photos(folder: Path, count: int = 6) -> None:
    rng = np.random.default_rng(0)
    (folder / "a").mkdir(parents=True)
    for i in range(count):
        Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)).save(folder / "a" / f"p{i}.png")


def test_a_resumed_build_with_other_options_does_not_keep_shards_made_with_the_old_ones(tmp_path: Path) -> None:
    source, dest = tmp_path / "src", tmp_path / "out"
    _photos(source)
    common = {"source": str(source), "destination": str(dest), "dataset": "d", "version": "v1",
              "shard_size_mb": 0.005, "resize": "32x32", "encoding": "png"}

    def stop() -> None:
        raise RuntimeError("interrupted before publishing")

    with pytest.raises(RuntimeError):  # every shard written and checked with fit crop, nothing published
        stages.run_pipeline(BuildConfig(**common, fit="crop"), Storage(), before_publish=stop)
    stages.run_pipeline(BuildConfig(**common, fit="stretch"), Storage())  # resumed with fit stretch
    fresh = _build(source, tmp_path / "fresh", "v1", "--shard-size-mb", "0.005", "--resize", "32x32", "--fit",
                   "stretch", "--encoding", "png")
    resumed = json.loads((dest / "d" / "v1" / "manifest.json").read_text())
    assert resumed["splits"] == fresh["splits"]


def test_png_exif_in_a_text_chunk_is_ignored_as_inspection_ignores_it(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    pixels = np.zeros((40, 80, 3), np.uint8)
    pixels[:20, :40] = (255, 0, 0)  # red top-left quadrant
    exif = Image.Exif()
    exif[0x0112] = 6
    raw = exif.tobytes()
    info = PngImagePlugin.PngInfo()
    info.add_text("Raw profile type exif", f"\nexif\n{len(raw):8d}\n{raw.hex()}")
    Image.fromarray(pixels).save(source / "a" / "tagged.png", pnginfo=info)
    Image.fromarray(pixels).save(source / "a" / "plain.png")
    _build(source, tmp_path / "out", "v1", "--resize", "longest:60", "--encoding", "raw", "--splits", "train=1",
           "--max-reject-fraction", "1")
    records = _records(tmp_path / "out" / "d" / "v1")
    for name in ("a/tagged.png", "a/plain.png"):
        image = np.frombuffer(records[name]["image/raw"][0], np.uint8).reshape(records[name]["image/shape"])
        assert image.shape == (30, 60, 3) and tuple(image[2, 2]) == (255, 0, 0), name


def test_a_carriage_return_in_a_value_round_trips(tmp_path: Path) -> None:
    source = tmp_path / "src"
    _photos(source, 3)
    with open(source / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label", "caption", "weight"])
        writer.writerow(["a/p0.png", "x", "before\rafter", "1.5"])
        writer.writerow(["a/p1.png", "x", "two\r\nlines", "2"])
        writer.writerow(["a/p2.png", "y", "plain", "3"])
    _build(source, tmp_path / "out", "v1", "--columns", "caption=string,weight=float", "--splits", "train=1")
    records = _records(tmp_path / "out" / "d" / "v1")
    assert records["a/p0.png"]["caption"] == [b"before\rafter"] and records["a/p0.png"]["weight"] == [1.5]
    assert records["a/p1.png"]["caption"] == [b"two\r\nlines"] and records["a/p1.png"]["weight"] == [2.0]
    with open(tmp_path / "out" / "d" / "v1" / "labels.csv", newline="") as f:
        assert [r["caption"] for r in csv.DictReader(f)] == ["before\rafter", "two\r\nlines", "plain"]


def test_a_jpeg_side_over_the_limit_is_a_reject_not_a_failed_build(tmp_path: Path) -> None:
    source = tmp_path / "src"
    _photos(source, 4)
    Image.new("RGB", (66_000, 2), (9, 9, 9)).save(source / "a" / "panorama.png")
    manifest = _build(source, tmp_path / "out", "v1", "--encoding", "jpeg", "--max-reject-fraction", "0.5")
    assert manifest["num_records"] == 4 and manifest["rejects_by_reason"] == {"too_many_pixels": 1}
    with open(tmp_path / "out" / "d" / "v1" / "rejects.csv", newline="") as f:
        (reject,) = csv.DictReader(f)
    assert reject["filename"] == "a/panorama.png" and "at most 65500 px" in reject["detail"]
    with pytest.raises(ConfigError, match="resize"):
        BuildConfig("s", "o", "d", "v", resize="longest:65501")


def test_a_changed_separator_rewrites_every_shard(tmp_path: Path) -> None:
    source, dest = tmp_path / "src", tmp_path / "out"
    _photos(source, 3)
    with open(source / "labels.csv", "w", newline="") as f:
        csv.writer(f).writerows([["filename", "label", "tags"], ["a/p0.png", "x", "p;q"], ["a/p1.png", "x", "r"],
                                 ["a/p2.png", "y", ""]])
    _build(dest.parent / "src", dest, "v1", "--columns", "tags=string_list", "--splits", "train=1")
    second = _build(source, dest, "v2", "--columns", "tags=string_list", "--splits", "train=1",
                    "--label-separator", ";")
    assert second["build"]["mode"] == "full" and "label_separator" in second["build"]["full_because"]
    assert _records(dest / "d" / "v2")["a/p0.png"]["tags"] == [b"p", b"q"]


@pytest.mark.parametrize("field", ["channels", "jpeg_quality"])
def test_whole_number_options_refuse_floats(field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        BuildConfig("s", "o", "d", "v", **{field: 3.0})
