"""Incremental nightly builds (issue 12): each night builds on the version before it.

Real parts only: local folders and the SeaweedFS S3 server of ``conftest``, TensorFlow as the reader.
Every incremental version is checked against a ``--full`` build of the same source (a second dataset
built night by night with ``full=True``, so its class ids follow the same history) and against a
model of the layout an incremental build must make (``expected``), computed here from the previous
version's records and the full build's ``labels.csv``: which previous shards are kept whole (reused),
which lose records or take added ones (rewritten), and which new shards hold the rest, record by
record and in order.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from image_tfrecords import cli, stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.images.sample import make_sample
from image_tfrecords.published import layout
from image_tfrecords.rules.base_version import INSPECTOR
from image_tfrecords.storage import Storage, join
from tests.tf_reader import FEATURE_KEYS

ROOT = Path(__file__).resolve().parents[2]
SHARD_MB = 0.02  # ~5 sample images per shard: several shards per split, from a few dozen images
CLASSES = ("circles", "squares", "triangles")
INT_FEATURES = ("image/height", "image/width", "image/channels", "image/class/label")
SHARD_NAME = re.compile(r"(?P<split>.+)-(?P<i>\d{5})-of-(?P<n>\d{5})\.tfrecord")


# -- sources: a local folder (the truth), mirrored to S3 for the S3 runs --------------------------------
class Source:
    """The images a build reads: ``folder`` always holds them; with a ``bucket`` every change is also
    made to ``s3://bucket/src`` (which is then the build's source)."""

    def __init__(self, folder: Path, storage: Storage, bucket: str | None = None) -> None:
        self.folder, self.storage = folder, storage
        self.uri = f"s3://{bucket}/src" if bucket else str(folder)
        if bucket:
            for name, data in self.files().items():
                storage.write_bytes(join(self.uri, name), data)

    def files(self) -> dict[str, bytes]:
        return {p.relative_to(self.folder).as_posix(): p.read_bytes()
                for p in sorted(self.folder.rglob("*")) if p.is_file()}

    def put(self, name: str, data: bytes) -> None:
        path = self.folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        if self.uri.startswith("s3://"):
            self.storage.write_bytes(join(self.uri, name), data)

    def delete(self, name: str) -> None:
        (self.folder / name).unlink()
        if self.uri.startswith("s3://"):
            self.storage.delete(join(self.uri, name))

    def rename(self, old: str, new: str) -> None:
        os.rename(self.folder / old, self.folder / new)  # keeps the mtime: only the name changed
        if self.uri.startswith("s3://"):
            self.storage.copy(join(self.uri, old), join(self.uri, new))
            self.storage.delete(join(self.uri, old))


class Images:
    """Image bytes never seen before: sample images of seeds no other helper uses."""

    def __init__(self, folder: Path, seed: int = 1000) -> None:
        self.folder, self.seed = folder, seed
        self.pool: list[tuple[str, bytes]] = []  # (".jpg" or ".png", bytes)

    def take(self, count: int, ext: str | None = None) -> list[tuple[str, bytes]]:
        out: list[tuple[str, bytes]] = []
        while len(out) < count:
            found = next((item for item in self.pool if ext is None or item[0] == ext), None)
            if found is None:
                self.seed += 1
                batch = self.folder / f"seed-{self.seed}"
                make_sample(str(batch), per_class=5, seed=self.seed)
                self.pool += [(p.suffix, p.read_bytes()) for p in sorted(batch.rglob("*")) if p.is_file()]
                continue
            self.pool.remove(found)
            out.append(found)
        return out


def add(source: Source, images: Images, label: str, tag: str, count: int) -> dict[str, bytes]:
    """Add ``count`` new images to class ``label``; returns {name: bytes}."""
    added = {f"{label}/{tag}_{k}{ext}": data for k, (ext, data) in enumerate(images.take(count))}
    for name, data in added.items():
        source.put(name, data)
    return added


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- building ------------------------------------------------------------------------------------------
def config(source: str, dest: str, dataset: str, version: str, **kwargs: Any) -> BuildConfig:
    return BuildConfig(source=source, destination=dest, dataset=dataset, version=version,
                       **{"shard_size_mb": SHARD_MB, **kwargs})


def build(storage: Storage, source: str, dest: str, dataset: str, version: str, **kwargs: Any) -> dict[str, Any]:
    """``cli.build`` in this process, on one worker (no fork of a process that has TensorFlow loaded)."""
    force = kwargs.pop("force", False)
    return cli.build(config(source, dest, dataset, version, **kwargs), workers=1, progress=False, storage=storage,
                     force=force)


@contextlib.contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """``cli.main`` installs SIGTERM/SIGINT handlers: give pytest its own back afterwards."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``image-tfrecords ARGS`` in this process: (exit status, stdout, stderr)."""
    capsys.readouterr()
    with signal_handlers_kept():
        status = cli.main(["build", *args, "--workers", "1", "--no-progress"])
    out, err = capsys.readouterr()
    return status, out, err


# -- reading a published version -----------------------------------------------------------------------
@dataclass
class Version:
    """A published version as TensorFlow reads it, with its manifest, labels.csv and inspected.csv."""

    name: str
    uri: str
    manifest: dict[str, Any]
    records: list[dict[str, Any]]  # in split, shard and record order
    labels: list[dict[str, str]]
    inspected: list[dict[str, str]]
    shard_sha: dict[str, str] = field(default_factory=dict)  # shard file -> sha256 of its bytes as read

    @property
    def build(self) -> dict[str, Any]:
        return self.manifest["build"]

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        """Shard file -> its manifest entry (with its split)."""
        return {s["file"]: {**s, "split": split} for split, info in self.manifest["splits"].items()
                for s in info["shards"]}

    @property
    def rows(self) -> list[tuple[Any, ...]]:
        """What must not depend on how the version was built: one sorted tuple per record."""
        return sorted((r["filename"], r["sha256"], r["label"], r["label_id"], r["split"]) for r in self.records)

    def members(self) -> dict[str, list[str]]:
        """Shard file -> file names of its records, in record order."""
        out: dict[str, list[str]] = defaultdict(list)
        for record in self.records:
            out[record["shard"]].append(record["filename"])
        return out


def _csv(storage: Storage, uri: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(storage.read_text(uri), newline="")))


def tf_records(storage: Storage, version_uri: str, manifest: dict[str, Any]) -> tuple[list[dict[str, Any]],
                                                                                     dict[str, str]]:
    """Every record of a version, read with ``tf.data.TFRecordDataset`` and ``tf.io.parse_single_example``,
    its image decoded with ``tf.io.decode_image`` (in split, shard and record order); and each shard's sha256."""
    import tensorflow as tf

    spec = {key: tf.io.FixedLenFeature([], tf.int64 if key in INT_FEATURES else tf.string) for key in FEATURE_KEYS}

    def parse(path: Any, raw: Any) -> tuple[Any, Any, Any]:
        example = tf.io.parse_single_example(raw, spec)
        return path, example, tf.shape(tf.io.decode_image(example["image/encoded"], expand_animations=False))

    with tempfile.TemporaryDirectory() as tmp:
        paths, shard_sha = [], {}
        for info in manifest["splits"].values():
            for shard in info["shards"]:
                paths.append(os.path.join(tmp, shard["file"]))  # S3 or local: TensorFlow reads a local copy
                storage.download(join(version_uri, shard["file"]), paths[-1])
                data = Path(paths[-1]).read_bytes()
                shard_sha[shard["file"]] = sha(data)
                assert len(data) == shard["num_bytes"]
        if not paths:
            return [], shard_sha
        compression = "GZIP" if manifest["compression"] == "gzip" else ""
        found = tf.data.Dataset.from_tensor_slices(paths).flat_map(
            lambda path: tf.data.TFRecordDataset(path, compression_type=compression).map(lambda raw: (path, raw)))
        records = []
        for path, example, shape in found.map(parse):
            record = {key: value.numpy() for key, value in example.items()}
            assert tuple(shape.numpy()) == (record["image/height"], record["image/width"], record["image/channels"])
            name = os.path.basename(path.numpy().decode())
            records.append({"filename": record["image/filename"].decode(), "sha256": record["image/sha256"].decode(),
                            "label": record["image/class/text"].decode(), "label_id": int(record["image/class/label"]),
                            "split": SHARD_NAME.fullmatch(name)["split"], "shard": name,
                            "encoded": record["image/encoded"]})
        return records, shard_sha


def read(storage: Storage, version_uri: str) -> Version:
    manifest = json.loads(storage.read_bytes(join(version_uri, "manifest.json")))
    records, shard_sha = tf_records(storage, version_uri, manifest)
    return Version(manifest["version"], version_uri, manifest, records, _csv(storage, join(version_uri, "labels.csv")),
                   _csv(storage, join(version_uri, "inspected.csv")), shard_sha)


def check_version(storage: Storage, v: Version, files: dict[str, bytes]) -> None:
    """What every published version must be: the source's images, counted and placed as its files say."""
    manifest = v.manifest
    assert sorted(r["filename"] for r in v.records) == sorted(files)
    for r in v.records:
        data = files[r["filename"]]
        assert r["sha256"] == sha(data) and r["encoded"] == data  # sample images are stored as they are
        assert r["label"] == r["filename"].split("/")[0]
        assert manifest["classes"][r["label_id"]] == r["label"]
    assert manifest["num_records"] == len(v.records)
    counts = Counter(r["shard"] for r in v.records)
    for split, info in manifest["splits"].items():
        assert info["num_records"] == sum(r["split"] == split for r in v.records)
        names = [s["file"] for s in info["shards"]]
        assert names == [f"{split}-{i:05d}-of-{len(names):05d}.tfrecord" for i in range(len(names))]
        for shard in info["shards"]:
            assert shard["num_records"] == counts[shard["file"]] > 0
            assert v.shard_sha[shard["file"]] == shard["sha256"]
            index = storage.read_bytes(join(v.uri, layout.index_file(shard["file"])))
            assert sha(index) == shard["index_sha256"]
            assert len(index.splitlines()) == shard["num_records"]
    by_name = {r["filename"]: r for r in v.records}
    place = {name: i for names in v.members().values() for i, name in enumerate(names)}
    assert len(v.labels) == len(v.records)
    for row in v.labels:  # labels.csv names the shard, the place in it and the split of each record
        record = by_name[row["filename"]]
        assert (row["shard"], int(row["shard_position"]), row["split"], row["sha256"], int(row["label_id"])) == \
            (record["shard"], place[row["filename"]], record["split"], record["sha256"], record["label_id"])
    splits_of: dict[str, set[str]] = defaultdict(set)
    for r in v.records:
        splits_of[r["sha256"]].add(r["split"])
    assert all(len(s) == 1 for s in splits_of.values()), "an image content is in two splits"
    # inspected.csv: one row per source file, in listing order, with its size
    assert [row["filename"] for row in v.inspected] == sorted(files)
    assert all(int(row["num_bytes"]) == len(files[row["filename"]]) and not row["reason"] for row in v.inspected)
    build = v.build
    shards = v.entries
    assert build["shards_reused"] + build["shards_rewritten"] + build["shards_written"] == len(shards)
    assert build["shards_reused"] == sum("reused_from" in s for s in shards.values())
    assert build["files_inspected"] + build["inspections_reused"] == len(files)
    assert build["inspector"] == INSPECTOR
    assert storage.exists(join(v.uri, "_SUCCESS"))


# -- what an incremental build must do, computed from the previous version and a full build -------------
def shard_count(num_bytes: int, num_records: int, shard_mb: float) -> int:
    return 0 if not num_records else max(1, min(num_records, math.ceil(num_bytes / (shard_mb * 1e6))))


@dataclass
class Planned:
    """One shard of the expected incremental layout."""

    members: list[str]  # file names, in record order
    origin: str | None = None  # the previous shard it is made from (None: a new shard)
    reused: bool = False  # copied whole (else rewritten from ``origin``, or new)


@dataclass
class Expected:
    survivors: set[str]  # records the previous version holds byte for byte
    splits: dict[str, list[Planned]]
    full_shards: int  # how many shards a full build makes of this source

    @property
    def shards(self) -> list[Planned]:
        return [p for planned in self.splits.values() for p in planned]

    @property
    def counts(self) -> tuple[int, int, int]:
        """(reused, rewritten, new) shards."""
        return (sum(p.reused for p in self.shards), sum(bool(p.origin) and not p.reused for p in self.shards),
                sum(p.origin is None for p in self.shards))


def expected(prev: Version, full: Version) -> Expected:
    """The incremental layout on ``prev`` for the source ``full`` was built from (stages/plan.py's rules):

    per split, the previous shards that keep records, in their order (reused when they keep all and get
    nothing appended; else rewritten: their surviving records in their order); the added and changed
    records, in order-key order, first fill the *tail* (the kept shard keeping the fewest bytes, when
    below shard_size_mb) up to shard_size_mb; the rest are dealt round robin to new shards.
    """
    from image_tfrecords.rules.shards import order_key

    params = full.manifest["params"]
    target = params["shard_size_mb"] * 1e6
    before = {row["filename"]: {k: v for k, v in row.items() if k not in ("shard", "shard_position")}
              for row in prev.labels}
    now = [{k: v for k, v in row.items() if k not in ("shard", "shard_position")} for row in full.labels]
    size = {row["filename"]: int(row["encoded_bytes"]) for row in now}
    survivors = {row["filename"] for row in now if before.get(row["filename"]) == row}
    old_members = prev.members()
    splits: dict[str, list[Planned]] = {}
    full_shards = 0
    for split in full.manifest["splits"]:
        rows = [(number, row) for number, row in enumerate(now) if row["split"] == split]
        full_shards += shard_count(sum(size[r["filename"]] for _, r in rows), len(rows), params["shard_size_mb"])
        old = [s["file"] for s in prev.manifest["splits"].get(split, {"shards": []})["shards"]]
        kept = {s: [f for f in old_members[s] if f in survivors] for s in old}
        mine = [s for s in old if kept[s]]
        held = {s: sum(size[f] for f in kept[s]) for s in mine}
        fresh = [r["filename"] for _, (_, _, r) in sorted(
            ((order_key(params["salt"], r["sha256"]), n), (order_key(params["salt"], r["sha256"]), n, r))
            for n, r in rows if r["filename"] not in survivors)]
        tail = min((s for s in mine if held[s] < target), key=lambda s: (held[s], old.index(s)), default=None)
        appended: list[str] = []
        if tail is not None:
            room, used = target - held[tail], 0
            for name in fresh:
                if used + size[name] > room:
                    break
                used += size[name]
                appended.append(name)
        rest = fresh[len(appended):]
        new = shard_count(sum(size[f] for f in rest), len(rest), params["shard_size_mb"])
        splits[split] = [Planned(kept[s] + (appended if s == tail else []), s,
                                 len(kept[s]) == len(old_members[s]) and not (s == tail and appended))
                         for s in mine] + [Planned(rest[j::new]) for j in range(new)]
    return Expected(survivors, splits, full_shards)


def check_night(storage: Storage, prev: Version, cur: Version, full: Version, files: dict[str, bytes],
                touched: dict[str, bytes]) -> str:
    """Check ``cur`` (built incrementally on ``prev``) against ``full`` and the reuse model; returns its mode.

    ``touched``: the files added, changed or renamed since ``prev`` (the only ones inspection may read).
    """
    check_version(storage, cur, files)
    check_version(storage, full, files)
    assert cur.rows == full.rows, "the incremental version holds other records than a full build"
    assert cur.manifest["classes"][: len(prev.manifest["classes"])] == prev.manifest["classes"], \
        "a class id changed"
    assert cur.manifest["classes"] == full.manifest["classes"]
    assert [{k: v for k, v in r.items() if k not in ("shard", "shard_position")} for r in cur.labels] == \
        [{k: v for k, v in r.items() if k not in ("shard", "shard_position")} for r in full.labels]
    assert cur.inspected == full.inspected, "an inspection taken over differs from a fresh one"
    assert full.build["mode"] == "full" and full.build["full_because"] == "full rebuild asked for"
    assert full.build["shards_reused"] == full.build["shards_rewritten"] == 0
    assert full.build["files_inspected"] == len(files)
    assert all("reused_from" not in s for s in full.entries.values())
    want = expected(prev, full)
    assert want.full_shards == len(full.entries)  # the model's full layout is the full build's
    build = cur.build
    assert build["base_version"] == prev.name
    # inspection reuse holds in an incremental build and in a compaction alike
    assert build["files_inspected"] == len(touched)
    assert build["inspections_reused"] == len(files) - len(touched)
    if len(want.shards) > 1.5 * want.full_shards:
        assert build["mode"] == "full", f"{len(want.shards)} shards vs {want.full_shards} in full: must compact"
        assert build["full_because"] == f"compaction: an incremental build would make {len(want.shards)} shards, " \
                                        f"more than 1.5x the {want.full_shards} of a full build"
        assert cur.shard_sha == full.shard_sha  # planned as a full build: the same shards
        return "full"
    assert build["mode"] == "incremental" and build["full_because"] == "", build
    assert (build["shards_reused"], build["shards_rewritten"], build["shards_written"]) == want.counts
    assert build["source_bytes_read"] == 2 * sum(map(len, touched.values()))  # inspected once, written once
    members = cur.members()
    for split, planned in want.splits.items():
        names = [s["file"] for s in cur.manifest["splits"][split]["shards"]]
        assert len(names) == len(planned), split
        for name, plan in zip(names, planned, strict=True):
            entry = cur.entries[name]
            assert members[name] == plan.members, f"{name} (from {plan.origin}): other records or another order"
            if plan.reused:
                assert entry["reused_from"] == {"version": prev.name, "file": plan.origin}
                assert entry["sha256"] == prev.entries[plan.origin]["sha256"] == cur.shard_sha[name]
                if not cur.uri.startswith("s3://"):  # copied as a hard link
                    assert os.path.samefile(join(cur.uri, name), join(prev.uri, plan.origin))
            else:
                assert "reused_from" not in entry
                assert entry.get("rewritten_from") == (
                    {"version": prev.name, "file": plan.origin} if plan.origin else None)
    return "incremental"


# -- 1, 2: a chain of nights, locally and on S3 ---------------------------------------------------------
@pytest.fixture(params=["local", "s3"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Storage, str, str | None]:
    """(storage, destination, bucket or None)."""
    if request.param == "s3":
        bucket = request.getfixturevalue("bucket")
        request.getfixturevalue("s3_env")
        return Storage(), f"s3://{bucket}/out", bucket
    return Storage(), str(tmp_path / "out"), None


def base_source(tmp_path: Path, storage: Storage, bucket: str | None, per_class: int) -> Source:
    make_sample(str(tmp_path / "src"), per_class=per_class, seed=0)
    return Source(tmp_path / "src", storage, bucket)


def test_nightly_chain_matches_full_builds(where: tuple[Storage, str, str | None], tmp_path: Path) -> None:
    """Seven nights (add, empty a small class, delete, change, rename, new class, empty a big class): each
    version is built on the one before and holds what a full build of the same source holds (the full
    builds go to a local folder), with stable class ids. Every night is incremental but the last:
    emptying a third of the images leaves the shards too fragmented, and it compacts."""
    storage, dest, bucket = where
    full_dest = str(tmp_path / "full")  # full builds of the same source, to a local folder
    make_sample(str(tmp_path / "src"), per_class=20, seed=0)
    images = Images(tmp_path / "fresh")
    for k, (ext, data) in enumerate(images.take(3)):  # a small fourth class, emptied on night 2
        (tmp_path / "src" / "diamonds").mkdir(exist_ok=True)
        (tmp_path / "src" / "diamonds" / f"diamond_{k}{ext}").write_bytes(data)
    source = Source(tmp_path / "src", storage, bucket)

    def night(version: str) -> tuple[Version, Version]:
        build(storage, source.uri, dest, "inc", version)
        build(storage, source.uri, full_dest, "full", version, full=True)
        return read(storage, join(dest, "inc", version)), read(storage, join(full_dest, "full", version))

    prev, full = night("n0")
    check_version(storage, prev, source.files())
    assert prev.build["mode"] == "full" and prev.build["full_because"] == "no previous version"
    assert prev.rows == full.rows and prev.manifest["classes"] == ["circles", "diamonds", "squares", "triangles"]
    assert len(prev.manifest["splits"]["train"]["shards"]) >= 5

    def add_images() -> dict[str, bytes]:
        return {k: v for label in CLASSES for k, v in add(source, images, label, "a", 2).items()}

    def delete_some() -> dict[str, bytes]:
        for name in ("circles/circle_001.jpg", "squares/square_002.jpg", "triangles/triangle_003.jpg",
                     "triangles/triangle_004.png"):
            source.delete(name)
        return {}

    def change_one() -> dict[str, bytes]:
        name, ((_, data),) = "circles/circle_005.jpg", images.take(1, ".jpg")
        assert data != source.files()[name]
        source.put(name, data)
        return {name: data}

    def rename_one() -> dict[str, bytes]:
        source.rename("triangles/triangle_006.jpg", "triangles/renamed_006.jpg")
        return {"triangles/renamed_006.jpg": source.files()["triangles/renamed_006.jpg"]}

    def new_class() -> dict[str, bytes]:
        return add(source, images, "arrows", "new", 4)  # sorts first, yet takes the next id

    def empty(label: str) -> dict[str, bytes]:
        for name in [n for n in source.files() if n.startswith(f"{label}/")]:
            source.delete(name)
        return {}

    nights = {"add": add_images, "empty diamonds": lambda: empty("diamonds"), "delete": delete_some,
              "change": change_one, "rename": rename_one, "new class": new_class,
              "empty squares": lambda: empty("squares")}
    modes = {}
    for i, (what, change) in enumerate(nights.items(), 1):
        touched = change()
        cur, full = night(f"n{i}")
        modes[what] = check_night(storage, prev, cur, full, source.files(), touched)
        if what in ("add", "change", "rename", "new class", "empty diamonds"):  # shards left intact are reused
            assert cur.build["shards_reused"] > 0, what
        if what in ("delete", "change", "rename", "empty diamonds"):
            assert cur.build["shards_rewritten"] > 0, what
        prev = cur
    # emptying a third of the images leaves most shards part empty: a compaction, legitimately
    assert modes == {**dict.fromkeys(nights, "incremental"), "empty squares": "full"}, modes
    assert prev.manifest["classes"] == ["circles", "diamonds", "squares", "triangles", "arrows"]
    assert {r["label"] for r in prev.records} == {"arrows", "circles", "triangles"}
    assert json.loads(storage.read_bytes(join(dest, "inc", "latest.json"))) == {"version": "n7"}


def test_unchanged_files_are_not_read_again(tmp_path: Path) -> None:
    """An unchanged image made unreadable: the incremental night takes its inspection and record over
    without opening it; a full build rejects it as unreadable (permission denied)."""
    if os.geteuid() == 0 and not shutil.which("setpriv"):
        pytest.skip("running as root, which reads mode-000 files, and no setpriv to drop that power")
    source, dest = base_source(tmp_path, Storage(), None, per_class=10), tmp_path / "out"
    assert build(Storage(), source.uri, str(dest), "d", "v1")["num_records"] == 30
    images = Images(tmp_path / "fresh")
    added = {k: v for label in CLASSES for k, v in add(source, images, label, "new", 1).items()}
    locked = "squares/square_003.jpg"
    (source.folder / locked).chmod(0)

    def cli_build(version: str, *extra: str) -> subprocess.CompletedProcess[str]:
        drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] if os.geteuid() == 0 else []
        return subprocess.run([*drop, sys.executable, "-m", "image_tfrecords", "build", "--source", source.uri,
                               "--destination", str(dest), "--dataset", "d", "--version", version, "--shard-size-mb",
                               str(SHARD_MB), "--workers", "1", "--no-progress", *extra],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)

    try:
        incremental = cli_build("v2")
        full = cli_build("v3", "--full")
    finally:
        (source.folder / locked).chmod(0o644)
    assert incremental.returncode == 0, incremental.stderr
    v2 = read(Storage(), str(dest / "d" / "v2"))
    check_version(Storage(), v2, source.files())
    assert v2.build["mode"] == "incremental"
    assert v2.build["files_inspected"] == len(added) == 3
    assert v2.build["source_bytes_read"] == 2 * sum(map(len, added.values()))
    assert locked in {r["filename"] for r in v2.records}

    assert full.returncode == 0, full.stderr
    v3 = layout.read_manifest(Storage(), str(dest / "d" / "v3"))
    assert v3["build"]["mode"] == "full" and v3["build"]["files_inspected"] == 33
    assert v3["num_records"] == 32 and v3["rejects_by_reason"] == {"unreadable": 1}
    rejects = (dest / "d" / "v3" / "rejects.csv").read_text().splitlines()
    assert rejects == ["filename,reason,detail", f"{locked},unreadable,permission denied"]
    inspected = {row["filename"]: row for row in _csv(Storage(), str(dest / "d" / "v3" / "inspected.csv"))}
    assert (inspected[locked]["reason"], inspected[locked]["sha256"]) == ("unreadable", "")

    # That reject says nothing of the file's content: the next night reads it again (its name, size and
    # mtime are unchanged: chmod moves only ctime), and now that it can be read it is a record again.
    after = cli_build("v4")
    assert after.returncode == 0, after.stderr
    v4 = layout.read_manifest(Storage(), str(dest / "d" / "v4"))
    assert v4["build"]["mode"] == "incremental" and v4["build"]["base_version"] == "v3"
    assert v4["build"]["files_inspected"] == 1 and v4["build"]["inspections_reused"] == 32
    assert (v4["num_records"], v4["num_rejected"]) == (33, 0)


# -- 3. determinism ---------------------------------------------------------------------------------------
def tree(folder: Path, dest: Path | None = None) -> dict[str, str]:
    """Each file under ``folder`` and its SHA-256; with ``dest``, of card.md and card.html with ``dest`` (where the
    version was published, which their "Load this version" names) replaced by ``DEST``."""
    def content(p: Path) -> bytes:
        data = p.read_bytes()
        return data.replace(str(dest).encode(), b"DEST") if dest is not None and p.name in ("card.md", "card.html") \
            else data
    return {p.relative_to(folder).as_posix(): sha(content(p)) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_same_base_and_source_give_identical_versions(tmp_path: Path) -> None:
    """v2 built twice on the same v1 (two copies of the destination; one worker and two) is byte-identical."""
    storage = Storage()
    source, one = base_source(tmp_path, storage, None, per_class=16), tmp_path / "one"
    build(storage, source.uri, str(one), "d", "v1")
    two = tmp_path / "two"
    shutil.copytree(one, two)
    images = Images(tmp_path / "fresh")
    for label in CLASSES:
        add(source, images, label, "new", 2)
    source.delete("circles/circle_002.jpg")
    source.put("squares/square_001.jpg", images.take(1, ".jpg")[0][1])
    build(storage, source.uri, str(one), "d", "v2")
    result = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", source.uri,
                             "--destination", str(two), "--dataset", "d", "--version", "v2",
                             "--shard-size-mb", str(SHARD_MB), "--workers", "2", "--no-progress"],
                            cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    a, b = (layout.read_manifest(storage, str(d / "d" / "v2")) for d in (one, two))
    assert a["build"]["mode"] == b["build"]["mode"] == "incremental"
    assert a["build"]["shards_reused"] > 0 and a["build"]["shards_rewritten"] > 0 and a["build"]["shards_written"] > 0
    shards = {s["file"]: s["sha256"] for info in a["splits"].values() for s in info["shards"]}
    assert shards == {s["file"]: s["sha256"] for info in b["splits"].values() for s in info["shards"]}
    assert a == b
    files_a, files_b = tree(one / "d" / "v2", one), tree(two / "d" / "v2", two)
    assert files_a == files_b
    assert {f: files_a[f] for f in shards} == shards


# -- 4. self-contained versions ---------------------------------------------------------------------------
def test_newest_version_stands_alone(where: tuple[Storage, str, str | None], tmp_path: Path) -> None:
    """After three nights the older versions are deleted: the newest still loads, and builds on."""
    from image_tfrecords import load_split

    storage, dest, bucket = where
    source, images = base_source(tmp_path, storage, bucket, per_class=12), Images(tmp_path / "fresh")
    dataset = join(dest, "d")
    build(storage, source.uri, dest, "d", "v0")
    for i in range(1, 4):
        add(source, images, CLASSES[i - 1], f"n{i}", 3)
        source.delete(sorted(n for n in source.files() if n.startswith(CLASSES[i % 3]))[0])
        build(storage, source.uri, dest, "d", f"v{i}")
    newest = read(storage, join(dataset, "v3"))
    assert newest.build["mode"] == "incremental" and newest.build["shards_reused"] > 0
    assert any(s.get("reused_from", {}).get("version") == "v2" for s in newest.entries.values())
    for old in ("v0", "v1", "v2"):
        storage.delete_tree(join(dataset, old))
    assert sorted({info.key.split("/")[0] for info in storage.iter_files(dataset)}) == ["latest.json", "v3"]
    listed = {info.key for info in storage.iter_files(join(dataset, "v3"))}
    for shard in newest.entries:
        assert {shard, layout.index_file(shard)} <= listed
    again = read(storage, join(dataset, "v3"))
    check_version(storage, again, source.files())
    assert again.rows == newest.rows
    for split, info in again.manifest["splits"].items():
        got = list(load_split(dataset, split, as_dict=True, storage=storage))  # through latest.json
        assert sorted(r["image/filename"].numpy().decode() for r in got) == \
            sorted(r["filename"] for r in again.records if r["split"] == split)
        assert len(got) == info["num_records"]
        assert all(r["image"].shape[2] == r["image/channels"] for r in got)
    add(source, images, "circles", "n4", 2)  # the next night builds on what is left
    build(storage, source.uri, dest, "d", "v4")
    v4 = read(storage, join(dataset, "v4"))
    check_version(storage, v4, source.files())
    assert v4.build["mode"] == "incremental" and v4.build["base_version"] == "v3"
    assert v4.build["shards_reused"] > 0 and v4.build["files_inspected"] == 2


# -- 5. a write task killed mid-night, retried --------------------------------------------------------------
def night_source(tmp_path: Path, new: int = 3) -> tuple[Source, Path]:
    """A base v1 in ``out/``, then a night's changes to the source (added, deleted, changed images)."""
    storage = Storage()
    source, dest = base_source(tmp_path, storage, None, per_class=16), tmp_path / "out"
    build(storage, source.uri, str(dest), "d", "v1")
    images = Images(tmp_path / "fresh")
    for label in CLASSES:
        add(source, images, label, "new", new)
    for name in ("circles/circle_003.jpg", "triangles/triangle_007.jpg"):
        source.delete(name)
    source.put("squares/square_002.jpg", images.take(1, ".jpg")[0][1])
    return source, dest


def test_retried_write_task_publishes_what_an_uninterrupted_build_does(tmp_path: Path) -> None:
    source, dest = night_source(tmp_path)
    clean = tmp_path / "clean"
    shutil.copytree(dest, clean)
    storage = Storage()
    cfg = config(source.uri, str(dest), "d", "v2")
    # the night as the DAG's tasks run it: discover inspects the night's few files itself (no inspect_images task),
    # then one write_shards task per shard to write and one more that copies every reused shard
    stages.discover_stage(cfg, storage)
    planned = stages.plan_inspection(cfg, storage)
    assert stages.inspect_in_place(planned) and planned["files_to_read"] == 3 * len(CLASSES) + 1
    stages.inspect_small(cfg, storage, planned["chunks"])
    stages.gather_inspection(cfg, storage)
    stages.split_stage(cfg, storage)
    plan = stages.plan_stage(cfg, storage)
    assert plan["mode"] == "incremental" and plan["reused"] and plan["rewritten"] and plan["written"]
    assert plan["shard_tasks"] == plan["num_tasks"] + 1
    staging = Path(cfg.staging_uri)
    layout_plan = json.loads((staging / stages.PLAN).read_text())
    tasks = [stages.task_shards(cfg, storage, i) for i in range(plan["num_tasks"])]
    to_write = [shard for task in tasks for shard in task]
    assert not set(to_write) & set(layout_plan["reuse"])
    done = [stages.shard_task(cfg, storage, i) for i in range(plan["shard_tasks"])]
    assert [d["label"] for d in done[:-1]] == [t[0] if len(t) == 1 else f"{t[0]} .. {t[-1]}" for t in tasks]
    assert done[-1]["label"] == f"reuse {plan['reused']} shards" and done[-1]["shards"] == plan["reused"]
    with open(staging / stages.LABELS, newline="") as labels:
        assert sum(d["num_records"] for d in done) == len(list(csv.reader(labels))) - 1  # every record, once

    # what a crash leaves: a reused shard not copied yet, a new shard cut short (its receipt from an
    # earlier attempt), a rewritten shard staged without its receipt, a half-written temporary file
    reused = sorted(layout_plan["reuse"])[0]
    rewritten = sorted(layout_plan["rewrite"])[0]
    fresh = next(s for s in to_write if s not in layout_plan["rewrite"])
    (staging / "shards" / reused).unlink()
    shard_file = staging / "shards" / fresh
    shard_file.write_bytes(shard_file.read_bytes()[: shard_file.stat().st_size // 2])
    (staging / "receipts" / f"{rewritten}.json").unlink()
    (staging / "shards" / f"{stages.TMP_PREFIX}crashed").mkdir()
    (staging / "shards" / f"{stages.TMP_PREFIX}crashed" / fresh).write_bytes(b"half a shard")
    untouched = {s: (staging / "shards" / s).stat().st_ino for s in to_write if s not in (fresh, rewritten)}
    with pytest.raises(stages.BuildError, match=rf"shard ({re.escape(reused)} is missing from staging|"
                                                rf"{re.escape(fresh)} is corrupt|{re.escape(rewritten)} )"):
        stages.validate_stage(cfg, storage)  # the damage does not go unnoticed

    # the retried tasks: reuse again, then every shard of every write task again
    assert stages.reuse_stage(cfg, storage)["reused"] == plan["reused"]
    results = {shard: stages.write_and_check(cfg, storage, shard) for shard in to_write}
    for shard, inode in untouched.items():  # intact staged shards are not written again
        assert (staging / "shards" / shard).stat().st_ino == inode, shard
    assert results[fresh]["sha256"] == sha((staging / "shards" / fresh).read_bytes())
    assert results[rewritten]["rewritten_from"]["version"] == "v1"
    stages.validate_stage(cfg, storage)
    stages.card_stage(cfg, storage)
    stages.gate_stage(cfg, storage)
    stages.publish_stage(cfg, storage)
    assert not staging.exists()

    build(storage, source.uri, str(clean), "d", "v2")
    assert tree(dest / "d" / "v2", dest) == tree(clean / "d" / "v2", clean)
    manifest = layout.read_manifest(storage, str(dest / "d" / "v2"))
    assert manifest["build"]["mode"] == "incremental" and manifest["build"]["shards_rewritten"] >= 1
    check_version(storage, read(storage, str(dest / "d" / "v2")), source.files())


def test_a_receipt_left_empty_by_a_crash_has_its_shard_written_again(tmp_path: Path) -> None:
    """Staged files are made durable by one syncfs before the publish: a crash before it may leave a receipt
    empty. The retried write takes that as no receipt (the shard is written again), never as an error."""
    source, dest = night_source(tmp_path)
    storage = Storage()
    cfg = config(source.uri, str(dest), "d", "v2")
    for stage in (stages.discover_stage, stages.inspect_stage, stages.split_stage, stages.plan_stage,
                  stages.reuse_stage):
        stage(cfg, storage)
    staging = Path(cfg.staging_uri)
    shards = stages.all_shards(cfg, storage)
    first = {shard: stages.write_and_check(cfg, storage, shard) for shard in shards}
    emptied = shards[0]
    (staging / "receipts" / f"{emptied}.json").write_bytes(b"")
    inode = (staging / "shards" / emptied).stat().st_ino
    again = stages.write_and_check(cfg, storage, emptied)
    assert (staging / "shards" / emptied).stat().st_ino != inode  # written again, not trusted
    assert again["sha256"] == first[emptied]["sha256"] == sha((staging / "shards" / emptied).read_bytes())
    assert json.loads((staging / "receipts" / f"{emptied}.json").read_text())["sha256"] == again["sha256"]
    for stage in (stages.validate_stage, stages.card_stage, stages.gate_stage, stages.publish_stage):
        stage(cfg, storage)
    check_version(storage, read(storage, str(dest / "d" / "v2")), source.files())


LAUNCHER = """\
import os
import sys
import tempfile
import time

sys.path.insert(0, {root!r})

import image_tfrecords.cli as cli
import image_tfrecords.shards.writer as writer

_read_source = writer.read_source


def slow_read_source(*args, **kwargs):  # only the reads of write_shard: a write stage that takes a while
    time.sleep(float(os.environ["SLOW_WRITE"]))
    return _read_source(*args, **kwargs)


writer.read_source = slow_read_source
sys.exit(cli.main(sys.argv[1:]))
"""


def test_killed_build_rerun_publishes_what_a_clean_build_does(tmp_path: Path) -> None:
    """SIGKILL (the whole process group) while an incremental night writes shards; the same command
    again resumes and publishes the bytes of a build that was never interrupted."""
    source, dest = night_source(tmp_path, new=6)
    clean = tmp_path / "clean"
    shutil.copytree(dest, clean)
    launcher = tmp_path / "slow_cli.py"
    launcher.write_text(LAUNCHER.format(root=str(ROOT)))
    args = ["build", "--source", source.uri, "--destination", str(dest), "--dataset", "d", "--version", "v2",
            "--shard-size-mb", str(SHARD_MB), "--workers", "2", "--no-progress"]
    staging = dest / "d" / "_staging" / "v2"
    with open(tmp_path / "out.log", "w") as out:
        proc = subprocess.Popen([sys.executable, str(launcher), *args], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "SLOW_WRITE": "0.15"}, start_new_session=True)
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 90
        while True:  # one new shard staged, another being written
            assert proc.poll() is None, (tmp_path / "out.log").read_text()
            assert time.monotonic() < deadline, "the build never got to write shards"
            plan = json.loads((staging / stages.PLAN).read_text()) if (staging / stages.PLAN).is_file() else None
            if plan is not None:
                fresh = [s for task in plan["tasks"] for s in task if s not in plan["rewrite"]]
                done = [s for s in fresh if (staging / "receipts" / f"{s}.json").is_file()]
                writing = list((staging / "shards").glob(f"{stages.TMP_PREFIX}*"))
                if done and writing and len(done) < len(fresh):
                    break
            time.sleep(0.02)
        workers = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for worker in workers:
            with contextlib.suppress(psutil.Error):
                worker.kill()
    assert proc.returncode == -signal.SIGKILL
    assert not (dest / "d" / "v2").exists() and staging.is_dir()
    written_before = {s: (staging / "shards" / s).stat().st_ino for s in done}

    rerun = subprocess.run([sys.executable, "-m", "image_tfrecords", *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert rerun.returncode == 0, rerun.stderr
    assert "published d version v2" in rerun.stdout and "incremental on v1" in rerun.stdout
    for shard, inode in written_before.items():  # resumed: what was staged before the kill is published as is
        assert (dest / "d" / "v2" / shard).stat().st_ino == inode, shard
    build(Storage(), source.uri, str(clean), "d", "v2")
    assert tree(dest / "d" / "v2", dest) == tree(clean / "d" / "v2", clean)
    assert not (dest / "d" / "_staging").exists()


# -- 6. compaction ------------------------------------------------------------------------------------------
def full_layout(storage: Storage, version_uri: str) -> dict[str, int]:
    """Split -> how many shards a full build of this version's records makes."""
    manifest = layout.read_manifest(storage, version_uri)
    rows = _csv(storage, join(version_uri, "labels.csv"))
    return {split: shard_count(sum(int(r["encoded_bytes"]) for r in rows if r["split"] == split),
                               sum(r["split"] == split for r in rows), manifest["params"]["shard_size_mb"])
            for split in manifest["splits"]}


def test_small_nights_fill_the_tail_and_deletions_compact(tmp_path: Path) -> None:
    """Nights that add a few images fill each split's smallest shard instead of adding small shards, so
    the shard count follows a full build's; deletions spread over every shard leave them part empty
    until an incremental layout would have more than 1.5x a full build's shards: that night compacts."""
    storage = Storage()
    source, dest = base_source(tmp_path, storage, None, per_class=10), str(tmp_path / "out")
    images = Images(tmp_path / "fresh")
    build(storage, source.uri, dest, "d", "v00")
    history = [layout.read_manifest(storage, join(dest, "d", "v00"))]
    for night in range(1, 7):
        added = add(source, images, CLASSES[night % 3], f"n{night}", 1 + night % 3)
        build(storage, source.uri, dest, "d", f"v{night:02d}")
        manifest = layout.read_manifest(storage, join(dest, "d", f"v{night:02d}"))
        assert manifest["build"]["mode"] == "incremental" and manifest["build"]["shards_reused"] > 0
        assert manifest["build"]["files_inspected"] == len(added)
        full = full_layout(storage, join(dest, "d", f"v{night:02d}"))
        for split, info in manifest["splits"].items():  # at most one part-filled shard more than a full build
            assert len(info["shards"]) <= full[split] + 1, (night, split)
        history.append(manifest)
    for night in range(7, 12):  # a quarter of the images go each night, from every shard
        for name in sorted(source.files())[night % 4::4]:
            source.delete(name)
        build(storage, source.uri, dest, "d", f"v{night:02d}")
        manifest = layout.read_manifest(storage, join(dest, "d", f"v{night:02d}"))
        assert manifest["build"]["files_inspected"] == 0  # inspections are reused, compaction or not
        history.append(manifest)
        if manifest["build"]["mode"] == "full":
            break
        shards = sum(len(info["shards"]) for info in manifest["splits"].values())
        assert shards <= 1.5 * sum(full_layout(storage, join(dest, "d", f"v{night:02d}")).values())
    else:
        pytest.fail("deleting a quarter of the images four nights in a row never compacted")
    counts = [sum(len(info["shards"]) for info in m["splits"].values()) for m in history]
    compacted, before = history[-1]["build"], history[-2]
    assert all(m["build"]["mode"] == "incremental" for m in history[1:-1])
    match = re.fullmatch(r"compaction: an incremental build would make (\d+) shards, more than 1\.5x the (\d+) of "
                         r"a full build", compacted["full_because"])
    assert match, compacted["full_because"]
    would, full_count = map(int, match.groups())
    assert would > 1.5 * full_count and full_count == counts[-1] < counts[-2] <= would
    assert compacted["base_version"] == before["version"]
    assert compacted["shards_reused"] == compacted["shards_rewritten"] == 0
    assert all("reused_from" not in s for info in history[-1]["splits"].values() for s in info["shards"])
    # the compacted version is what a full build of its source makes
    build(storage, source.uri, dest, "check", "v", full=True)
    full_manifest = layout.read_manifest(storage, join(dest, "check", "v"))
    assert {s: [x["sha256"] for x in i["shards"]] for s, i in full_manifest["splits"].items()} == \
        {s: [x["sha256"] for x in i["shards"]] for s, i in history[-1]["splits"].items()}
    # and the next night is incremental again, on the compacted version
    add(source, images, "circles", "after", 1)
    build(storage, source.uri, dest, "d", "v99")
    after = layout.read_manifest(storage, join(dest, "d", "v99"))["build"]
    assert after["mode"] == "incremental" and after["base_version"] == history[-1]["version"]
    assert after["shards_reused"] > 0


# -- 7. a damaged previous version ---------------------------------------------------------------------------
def damaged_night(tmp_path: Path, which: str) -> tuple[Source, Path, str]:
    """v1, then a deletion, with one byte of a v1 shard flipped: the one v2 rewrites, or one it reuses."""
    source, dest = base_source(tmp_path, Storage(), None, per_class=10), tmp_path / "out"
    build(Storage(), source.uri, str(dest), "d", "v1")
    labels = _csv(Storage(), str(dest / "d" / "v1" / "labels.csv"))
    per_shard = Counter(row["shard"] for row in labels)
    victim = next(row for row in labels if row["split"] == "train" and per_shard[row["shard"]] > 1)
    source.delete(victim["filename"])
    shard = victim["shard"] if which == "rewritten" else \
        next(s for s in sorted(per_shard) if s.startswith("train-") and s != victim["shard"])
    path = dest / "d" / "v1" / shard
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    return source, dest, shard


@pytest.mark.parametrize("which", ["rewritten", "reused"])
def test_a_damaged_previous_shard_never_propagates(which: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A base shard with a flipped byte (one the night splices, or one it would reuse whole): the night
    writes that shard from the source instead, says so in the log and the manifest, and holds what a full
    build holds; no byte of the damaged shard reaches the new version."""
    source, dest, shard = damaged_night(tmp_path, which)
    damaged = (dest / "d" / "v1" / shard).read_bytes()
    args = ["--source", source.uri, "--destination", str(dest), "--dataset", "d", "--version", "v2",
            "--shard-size-mb", str(SHARD_MB)]
    status, out, err = run_main(capsys, *args)
    assert status == 0, out + err
    v2 = read(Storage(), str(dest / "d" / "v2"))
    check_version(Storage(), v2, source.files())
    assert v2.build["mode"] == "incremental"
    fallback = v2.build["shards_from_source_after_damage"]
    assert len(fallback) == 1, v2.build
    entry = v2.entries[fallback[0]]
    assert "reused_from" not in entry and "rewritten_from" not in entry
    assert (dest / "d" / "v2" / fallback[0]).read_bytes() != damaged
    clean = tmp_path / "clean"
    build(Storage(), source.uri, str(clean), "d", "v2", full=True)
    full = read(Storage(), str(clean / "d" / "v2"))
    assert v2.rows == full.rows


# -- 8. the command line ---------------------------------------------------------------------------------------
def test_cli_skips_an_unchanged_source_unless_full_or_force(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    source, dest = base_source(tmp_path, Storage(), None, per_class=10), tmp_path / "out"
    args = ["--source", source.uri, "--destination", str(dest), "--dataset", "d", "--shard-size-mb", str(SHARD_MB)]
    status, out, err = run_main(capsys, *args, "--version", "v1")
    assert status == 0, err
    assert "build: full (no previous version)" in out
    v1 = layout.read_manifest(Storage(), str(dest / "d" / "v1"))

    status, out, err = run_main(capsys, *args, "--version", "v2")
    assert status == 0, err
    assert "unchanged since version v1" in out and "--force" in out
    assert sorted(p.name for p in (dest / "d").iterdir()) == ["latest.json", "v1"]

    status, out, err = run_main(capsys, *args, "--version", "v2", "--full")
    assert status == 0, err
    assert "published d version v2" in out and "build: full (full rebuild asked for)" in out
    v2 = layout.read_manifest(Storage(), str(dest / "d" / "v2"))
    assert v2["build"]["mode"] == "full" and v2["build"]["base_version"] is None
    assert v2["build"]["files_inspected"] == 30 and v2["build"]["inspections_reused"] == 0
    assert v2["build"]["shards_reused"] == v2["build"]["shards_rewritten"] == 0
    assert v2["build"]["source_bytes_read"] == 2 * sum(map(len, source.files().values()))
    assert [s["sha256"] for i in v2["splits"].values() for s in i["shards"]] == \
        [s["sha256"] for i in v1["splits"].values() for s in i["shards"]]  # the same source, the same bytes
    assert json.loads((dest / "d" / "latest.json").read_text()) == {"version": "v2"}

    status, out, err = run_main(capsys, *args, "--version", "v3")
    assert status == 0 and "unchanged since version v2" in out, out + err
    assert not (dest / "d" / "v3").exists()

    status, out, err = run_main(capsys, *args, "--version", "v3", "--force")
    assert status == 0, err
    shards = sum(len(i["shards"]) for i in v2["splits"].values())
    assert f"build: incremental on v2; shards reused {shards}, rewritten 0, written 0; files inspected 0 " \
           f"(reused 30); 0.0 MB read from the source" in out
    v3 = layout.read_manifest(Storage(), str(dest / "d" / "v3"))
    assert v3["build"]["source_bytes_read"] == 0
    assert [s["sha256"] for i in v3["splits"].values() for s in i["shards"]] == \
        [s["sha256"] for i in v2["splits"].values() for s in i["shards"]]
