"""Every option in ``OPTIONS``, walked (issue 49): a version built incrementally after an option changed holds
what a ``--full`` build of the same history holds, and the option's ``effect`` says what the change does.

For each option in ``WALK``: a base version v1 built with the walk's base arguments, then v2 built on it with
the option changed, once incrementally and once with ``--full`` (on a copy of v1's destination, so that both
have the same history). Both v2s must hold the same records (read with TensorFlow), labels.csv rows, rejects
and inspections. Then, by effect: one that rebuilds shards (``Option.rebuilds``) makes the incremental v2 a
full build, byte for byte the ``--full`` one, and its manifest records the new value; a ``selection`` leaves
v2 incremental and chooses (or reads) other files than v1; a ``none`` leaves v2 incremental with v1's shards,
whole, and the ``--full`` v2 is v1's bytes. An option in neither ``WALK`` nor ``NOT_WALKED`` fails the test
until someone decides.
"""

from __future__ import annotations

import csv
import io
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from bench.make_corpus import synthetic_photo
from image_tfrecords import cli
from image_tfrecords.images.sample import make_sample
from image_tfrecords.options import BY_NAME, OPTIONS
from image_tfrecords.published.manifest import Manifest
from image_tfrecords.rules.base_version import recorded
from image_tfrecords.rules.near_duplicates import MIN_SIDE
from tests.pipeline.test_incremental import signal_handlers_kept

OTHER_SOURCE = "{other source}"  # stands for a copy of the source without one file
OLD, NEW = 978_307_200, 1_577_836_800  # 2001-01-01 and 2020-01-01: the files' times, for as_of
# option -> (the base version's arguments, the arguments that change the option from them)
WALK: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "source": ((), ("--source", OTHER_SOURCE)),
    "splits": ((), ("--splits", "train=0.5,validation=0.25,test=0.25")),
    "salt": ((), ("--salt", "walk")),
    "group_column": ((), ("--group-column", "patient")),
    "near_duplicate_bits": ((), ("--near-duplicate-bits", "0")),  # on by default: off
    "near_duplicate_labels": ((), ("--near-duplicate-labels", "keep")),
    "shard_size_mb": ((), ("--shard-size-mb", "0.05")),
    "compression": ((), ("--compression", "gzip")),
    "max_reject_fraction": ((), ("--max-reject-fraction", "0.5")),
    "quality_reject": ((), ("--quality-reject", "dark")),
    "max_file_mb": ((), ("--max-file-mb", "0.02")),
    "max_pixels": ((), ("--max-pixels", "50000")),
    "chunk_files": ((), ("--chunk-files", "3")),
    "chunk_mb": ((), ("--chunk-mb", "0.01")),
    "resize": ((), ("--resize", "longest:40")),
    "fit": (("--resize", "40x30"), ("--fit", "pad")),
    "upscale": (("--resize", "shortest:240"), ("--upscale",)),
    "encoding": ((), ("--encoding", "png")),
    "jpeg_quality": (("--encoding", "jpeg"), ("--jpeg-quality", "40")),
    "channels": ((), ("--channels", "1")),
    "columns": ((), ("--columns", "weight=float")),
    "label_separator": (("--columns", "tags=string_list"), ("--label-separator", ";")),
    "modern_formats": ((), ("--no-modern-formats",)),
    "gate": ((), ("--gate",)),
    "gate_reject_share": (("--gate",), ("--gate-reject-share", "0.5")),
    "gate_class_share": (("--gate",), ("--gate-class-share", "0.5")),
    "gate_quality_share": (("--gate",), ("--gate-quality-share", "0.5")),
    "gate_near_duplicates_across_labels": (("--gate",), ("--gate-near-duplicates-across-labels", "3")),
    "accept_gate": (("--gate",), ("--accept-gate",)),
    # labels.csv names the files after as_of (missing_file), beside the near-duplicate pair's two rejects
    "as_of": (("--max-reject-fraction", "0.5"), ("--as-of", "2010-01-01T00:00:00+00:00")),
}
NOT_WALKED = {
    "destination": "where the version goes: a build on a base goes where the base is",
    "dataset": "the dataset's folder: a build on a base goes where the base is",
    "version": "the version's name: every build of the walk names its own",
    "full": "the walk's reference build is the --full one",
    "force": "every incremental build of the walk passes it (one whose options change nothing would be skipped)",
    "approval": "the DAG's alone (no flag): it waits for a person when the gate trips, never changes the output",
}
COMMON = ("--dataset", "d", "--workers", "1", "--no-progress", "--shard-size-mb", "0.02")


def test_every_option_is_walked_or_says_why_not() -> None:
    names = [o.name for o in OPTIONS]
    missing = [name for name in names if name not in WALK and name not in NOT_WALKED]
    assert not missing, f"decide how tests/pipeline/test_options_walk.py walks {missing} (WALK or NOT_WALKED)"
    assert not set(WALK) & set(NOT_WALKED) and set(WALK) | set(NOT_WALKED) == set(names)
    assert all(BY_NAME[name].cli_flag for name in WALK)
    assert not [name for name in NOT_WALKED if BY_NAME[name].rebuilds]  # those must be walked


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The source (and a copy), and the base versions built so far (base arguments -> destination)."""
    root = tmp_path_factory.mktemp("walk")
    source = root / "src"
    make_sample(str(source), per_class=4, seed=7)
    noise = Image.frombytes("RGB", (100, 100), random.Random(7).randbytes(100 * 100 * 3))
    noise.save(source / "circles" / "heavy.png")  # about 30 kB: over --max-file-mb 0.02
    Image.new("RGB", (250, 250), (200, 30, 30)).save(source / "circles" / "large.png")  # over --max-pixels 50000
    Image.new("RGB", (120, 120), (2, 2, 2)).save(source / "squares" / "dark.jpg", quality=90)  # flagged dark
    photo = synthetic_photo(random.Random(7), (MIN_SIDE + 64, MIN_SIDE + 24))  # a hash the gate lets through
    photo.save(source / "triangles" / "photo.jpg", quality=90)  # and a near-duplicate under another label
    photo.resize((MIN_SIDE + 40, MIN_SIDE + 8)).save(source / "circles" / "near.jpg", quality=80)
    Image.new("RGB", (64, 48), (30, 120, 200)).save(source / "squares" / "photo.avif")  # a modern format
    names = sorted(p.relative_to(source).as_posix() for p in source.rglob("*.*"))
    with open(source / "labels.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "label", "weight", "tags", "patient"])
        for i, name in enumerate(names):
            writer.writerow([name, name.split("/")[0], i / 4, "a|b" if i % 2 else "c", f"p{i % 3}"])
    for path in source.rglob("*"):
        os.utime(path, (OLD, NEW if path.name.endswith("_001.jpg") else OLD))  # three files after as_of
    other = root / "other"
    shutil.copytree(source, other)  # copy2: the same times; without one file
    (other / "triangles" / "triangle_003.jpg").unlink()
    kept = [line for line in (other / "labels.csv").read_text().splitlines(keepends=True) if "triangle_003" not in line]
    (other / "labels.csv").write_text("".join(kept))
    os.utime(other / "labels.csv", (OLD, OLD))
    return {"root": root, "source": source, "other": other, "bases": {}}


def _build(walk: dict[str, Any], dest: Path, version: str, *args: str) -> dict[str, Any]:
    """Build through the CLI in this process; the published version's manifest."""
    args = tuple(str(walk["other"]) if a == OTHER_SOURCE else a for a in args)
    with signal_handlers_kept():
        code = cli.main(["build", "--source", str(walk["source"]), "--destination", str(dest), "--version", version,
                         *COMMON, *args])
    assert code == 0, (version, args)
    return json.loads((dest / "d" / version / "manifest.json").read_text())


def _copy_of_base(walk: dict[str, Any], base: tuple[str, ...], to: Path) -> dict[str, Any]:
    """A copy, at ``to``, of the destination holding v1 built with ``base`` (built once per ``base``)."""
    if base not in walk["bases"]:
        dest = walk["root"] / f"base{len(walk['bases'])}"
        _build(walk, dest, "v1", *base)
        walk["bases"][base] = dest
    shutil.copytree(walk["bases"][base], to)
    return json.loads((to / "d" / "v1" / "manifest.json").read_text())


def _records(version: Path, manifest: dict[str, Any]) -> dict[str, bytes]:
    """Each record's serialized bytes, by file name, as TensorFlow reads the version's shards."""
    import tensorflow as tf

    compression = "GZIP" if manifest["compression"] == "gzip" else ""
    spec = {"image/filename": tf.io.FixedLenFeature([], tf.string)}
    out: dict[str, bytes] = {}
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            for raw in tf.data.TFRecordDataset(str(version / shard["file"]), compression_type=compression):
                name = tf.io.parse_single_example(raw, spec)["image/filename"].numpy().decode()
                assert name not in out
                out[name] = raw.numpy()
    return out


def _rows(path: Path, drop: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """A CSV's rows, sorted, without the ``drop`` columns."""
    rows = [{k: v for k, v in row.items() if k not in drop}
            for row in csv.DictReader(io.StringIO(path.read_text(), newline=""))]
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True))


def _shards(manifest: dict[str, Any]) -> dict[str, list[tuple[str, int, str]]]:
    return {name: [(s["file"], s["num_records"], s["sha256"]) for s in split["shards"]]
            for name, split in manifest["splits"].items()}


@pytest.mark.parametrize("name", list(WALK))
def test_a_build_after_an_option_changed_holds_what_a_full_build_holds(walk: dict[str, Any], name: str) -> None:
    base, change = WALK[name]
    folder = walk["root"] / name
    v1 = _copy_of_base(walk, base, folder / "inc")
    _copy_of_base(walk, base, folder / "full")
    inc = _build(walk, folder / "inc", "v2", *base, *change, "--force")
    full = _build(walk, folder / "full", "v2", *base, *change, "--full")
    inc_dir, full_dir = folder / "inc" / "d" / "v2", folder / "full" / "d" / "v2"

    assert _records(inc_dir, inc) == _records(full_dir, full)
    assert _rows(inc_dir / "labels.csv", ("shard", "shard_position")) == \
        _rows(full_dir / "labels.csv", ("shard", "shard_position"))
    for table in ("rejects.csv", "inspected.csv"):
        assert _rows(inc_dir / table) == _rows(full_dir / table), table
    for key in ("classes", "features", "params", "image", "columns", "compression", "num_records", "num_rejected",
                "rejects_by_reason", "skipped_by_kind"):
        assert inc[key] == full[key], key
    assert full["build"]["mode"] == "full"
    effect = BY_NAME[name].effect
    if BY_NAME[name].rebuilds:  # nothing of v1's shards: the same bytes as the full build
        assert inc["build"]["mode"] == "full"
        assert inc["build"]["full_because"] in (f"{name} changed since version v1",
                                                "version v1 has other record features")
        assert _shards(inc) == _shards(full)
        assert (inc_dir / "labels.csv").read_bytes() == (full_dir / "labels.csv").read_bytes()
        assert recorded(Manifest.parse(v1), name) != recorded(Manifest.parse(inc), name), \
            f"v2's manifest does not record {name}: a build after it could not tell"
        return
    assert inc["build"]["mode"] == "incremental", inc["build"]["full_because"]  # v1's shards taken over
    v1_dir = folder / "inc" / "d" / "v1"
    if effect == "selection":  # it chose other files, or read them otherwise
        assert _selected(v1_dir, v1) != _selected(full_dir, full), f"{change} selected what the base did"
    else:  # "none": the same shards, whole, and the same labels.csv
        assert effect == "none"
        assert _shards(inc) == _shards(full) == _shards(v1)
        assert {s["reused_from"]["file"] for split in inc["splits"].values() for s in split["shards"]} == \
            {s["file"] for split in v1["splits"].values() for s in split["shards"]}
        assert (inc_dir / "labels.csv").read_bytes() == (full_dir / "labels.csv").read_bytes() == \
            (v1_dir / "labels.csv").read_bytes()


def _selected(version: Path, manifest: dict[str, Any]) -> tuple[Any, ...]:
    """Which files a version took as records, rejected or skipped, and how it inspected them."""
    return (sorted(_records(version, manifest)), _rows(version / "rejects.csv"), manifest["skipped_by_kind"],
            _rows(version / "inspected.csv"))
