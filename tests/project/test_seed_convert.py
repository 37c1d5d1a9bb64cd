"""The benchmark's classic baseline (bench/seed_convert.py), read back with TensorFlow."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bench.seed_convert import find_image_files, split_files

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "seed_convert.py"
BROKEN = "circles/broken.jpg"
INTS = ("image/height", "image/width", "image/channels", "image/class/label")
KEYS = (*INTS, "image/encoded", "image/format", "image/class/text", "image/filename")


def run_seed(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)


def read_shards(output: Path) -> dict[str, list[dict[str, Any]]]:
    """{shard file name: [record]} with each record's features and the shape TensorFlow decodes."""
    import tensorflow as tf

    spec = {k: tf.io.FixedLenFeature([], tf.int64 if k in INTS else tf.string) for k in KEYS}
    shards: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(output.glob("*.tfrecord")):
        records = shards.setdefault(path.name, [])
        for raw in tf.data.TFRecordDataset(str(path)):
            example = tf.io.parse_single_example(raw, spec)
            record = {k: v.numpy() for k, v in example.items()}
            record["decoded_shape"] = tuple(tf.io.decode_image(example["image/encoded"]).shape)
            records.append(record)
    return shards


def by_split(shards: dict[str, list[dict[str, Any]]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for name, records in shards.items():
        out.setdefault(name.split("-")[0], set()).update(r["image/filename"].decode() for r in records)
    return out


@pytest.fixture(scope="module")
def corpus(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample images plus a corrupt file (skipped, as the seed does) and a hidden one (ignored)."""
    path = tmp_path_factory.mktemp("seed_corpus") / "src"
    shutil.copytree(sample_dir, path)
    (path / BROKEN).write_bytes(b"not an image")
    (path / "squares" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    return path


@pytest.fixture(scope="module")
def runs(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[dict, Path]]:
    """{threads: (JSON summary, output folder)} for a 1-thread and a 2-thread run with seed 0."""
    out: dict[int, tuple[dict, Path]] = {}
    for threads in (1, 2):
        output = tmp_path_factory.mktemp(f"seed_out_{threads}")
        result = run_seed("--source", str(corpus), "--output", str(output), "--threads", str(threads))
        assert result.returncode == 0, result.stderr
        assert f"SKIPPED: Unexpected error while decoding {corpus / BROKEN}" in result.stderr
        out[threads] = (json.loads(result.stdout.strip().splitlines()[-1]), output)
    return out


def sources(corpus: Path) -> list[str]:
    return sorted(p.relative_to(corpus).as_posix() for p in corpus.rglob("*")
                  if p.is_file() and not p.name.startswith(".") and p.as_posix() != (corpus / BROKEN).as_posix())


@pytest.mark.parametrize("threads", [1, 2])
def test_every_image_once_with_label_and_shape(runs: dict, corpus: Path, threads: int) -> None:
    summary, output = runs[threads]
    shards = read_shards(output)
    expected_files = [f"{s}-0000{i}-of-00002.tfrecord" for s in ("test", "train", "validation") for i in (0, 1)]
    assert sorted(shards) == expected_files
    assert (output / "labels.txt").read_text() == "0:circles\n1:squares\n2:triangles\n"
    classes = ["circles", "squares", "triangles"]
    seen = []
    for records in shards.values():
        for r in records:
            name = r["image/filename"].decode()
            seen.append(name)
            data = (corpus / name).read_bytes()
            if name.endswith(".png"):  # converted to JPEG, as build_image_data does
                assert r["image/encoded"][:2] == b"\xff\xd8"
            else:
                assert r["image/encoded"] == data
            assert r["image/format"] == b"jpeg"
            assert r["image/class/text"].decode() == name.split("/")[0]
            assert r["image/class/label"] == classes.index(name.split("/")[0])
            width, height = Image.open(corpus / name).size
            assert r["decoded_shape"] == (height, width, 3) == (r["image/height"], r["image/width"],
                                                                r["image/channels"])
    assert sorted(seen) == sources(corpus)
    assert summary["images"] == len(seen) == 60
    assert summary["skipped"] == 1
    assert summary["threads"] == threads
    assert summary["splits"] == {k: len(v) for k, v in by_split(shards).items()}
    assert summary["bytes"] == sum(os.path.getsize(output / name) for name in expected_files)
    assert summary["seconds"] >= summary["import_seconds"] > 0


def test_split_is_the_seeded_shuffle(runs: dict, corpus: Path) -> None:
    files, classes = find_image_files(str(corpus))
    assert classes == ["circles", "squares", "triangles"]
    planned = split_files(files, 0, 0.1, 0.1)
    assert planned == split_files(files, 0, 0.1, 0.1)
    assert {k: len(v) for k, v in planned.items()} == {"train": 49, "validation": 6, "test": 6}
    assert split_files(files, 1, 0.1, 0.1) != planned
    expected = {k: {f.relpath for f in v} - {BROKEN} for k, v in planned.items()}
    assert by_split(read_shards(runs[1][1])) == expected


def test_one_and_two_threads_write_the_same_shards(runs: dict) -> None:
    one, two = (read_shards(runs[t][1]) for t in (1, 2))
    assert {name: [r["image/filename"] for r in records] for name, records in one.items()} == \
        {name: [r["image/filename"] for r in records] for name, records in two.items()}
    assert by_split(one) == by_split(two)


def test_threads_must_divide_the_shards(corpus: Path, tmp_path: Path) -> None:
    result = run_seed("--source", str(corpus), "--output", str(tmp_path), "--threads", "3")
    assert result.returncode == 2
    assert "divide --shards-per-split" in result.stderr
    assert not list(tmp_path.iterdir())
