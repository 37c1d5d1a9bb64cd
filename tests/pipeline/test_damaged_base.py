"""A published version holds exactly its manifest's files, and a damaged base never blocks a build (issue 21).

Real parts only: local folders and the SeaweedFS server of ``conftest``; TensorFlow reads what a user's
glob of the version folder finds. Each case was seen failing on the code before issue 21.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import cli, stages
from image_tfrecords.published import layout
from image_tfrecords.stages.publish import manifest_files
from image_tfrecords.staging import PLAN, staged
from image_tfrecords.storage import Storage, join
from image_tfrecords.storage.documents import read_json
from tests.pipeline.test_incremental import (
    SHARD_MB,
    Images,
    add,
    base_source,
    build,
    check_version,
    config,
    read,
    run_main,
    signal_handlers_kept,
    where,  # noqa: F401 - the (storage, destination, bucket) fixture: local and S3
)
from tests.support import one_line, read_csv

ROOT = Path(__file__).resolve().parents[2]
SHARD = re.compile(r".+-\d{5}-of-\d{5}\.tfrecord(\.gz)?")
LAYOUT_FILES = {"manifest.json", "labels.csv", "rejects.csv", "inspected.csv", "near_duplicates.csv",
                "card.md", "card.html", "_SUCCESS"}


def files_of(storage: Storage, version_uri: str) -> list[str]:
    return sorted(info.key for info in storage.iter_files(version_uri, everything=True))


def assert_exactly_the_manifest(storage: Storage, version_uri: str) -> dict[str, Any]:
    """The version folder holds the manifest's shards and their indexes, the layout's files, and nothing
    else; a reader that globs ``*.tfrecord`` reads exactly the manifest's records."""
    import tensorflow as tf

    manifest = layout.read_manifest(storage, version_uri)
    shards = {s["file"] for info in manifest["splits"].values() for s in info["shards"]}
    expected = shards | {layout.index_file(f) for f in shards}
    found = files_of(storage, version_uri)
    others = [f for f in found if f not in expected]
    assert set(found) >= expected
    assert layout.LABEL_MAP in found  # every version has TF-slim's label file
    layout_files = LAYOUT_FILES | set(manifest_files(manifest))
    assert [f for f in others if f not in layout_files and not f.startswith("card/")] == []
    globbed = [f for f in found if SHARD.fullmatch(f)]
    assert sorted(globbed) == sorted(shards)
    with tempfile.TemporaryDirectory() as tmp:  # what `tf.io.gfile.glob(VERSION/*.tfrecord)` reads
        for name in globbed:
            storage.download(join(version_uri, name), os.path.join(tmp, name))
        paths = tf.io.gfile.glob(os.path.join(tmp, "*.tfrecord"))
        assert sum(1 for _ in tf.data.TFRecordDataset(paths)) == manifest["num_records"]
    return manifest


def latest(storage: Storage, dataset_uri: str) -> str | None:
    return layout.read_latest(storage, dataset_uri)


# -- 1. a build killed while it publishes, rerun after the source changed -----------------------------------
KILLER = textwrap.dedent("""
    import json, os, signal, sys
    from image_tfrecords import stages
    from image_tfrecords.config import BuildConfig
    from image_tfrecords.storage.documents import read_json
    from image_tfrecords.published.manifest import Manifest
    from image_tfrecords.staging import CARD_INDEX, MANIFEST, staged
    from image_tfrecords.storage import Storage
    from image_tfrecords.stages.publish import manifest_files

    cfg = BuildConfig(**json.loads(sys.argv[1]))
    manifest = read_json(Storage(), staged(cfg, MANIFEST))
    shards = sum(len(split["shards"]) for split in manifest["splits"].values())
    # each shard and its index, the card's files, labels.csv, rejects.csv, inspected.csv and near_duplicates.csv
    copies = 2 * shards + len(read_json(Storage(), staged(cfg, CARD_INDEX))) + 4
    tfds = len(manifest_files(Manifest.parse(manifest)))  # TFDS's metadata and labels.txt
    steps = {"first copy": 1, "half the copies": copies // 2, "every copy": copies, "TFDS metadata": copies + 1,
             "manifest": copies + tfds + 1, "_SUCCESS": copies + tfds + 2, "latest.json": copies + tfds + 3,
             "staging removed": copies + tfds + 4, "never": -1}
    kill_at = steps[sys.argv[2]]
    calls = 0

    def counted(method):
        def call(self, *args, **kwargs):
            global calls
            result = method(self, *args, **kwargs)
            calls += 1
            print(calls, method.__name__, *args[:2], flush=True)
            if calls == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            return result
        return call

    for name in ("copy", "write_bytes", "write_if_unchanged", "delete", "delete_tree"):
        setattr(Storage, name, counted(getattr(Storage, name)))
    stages.publish_stage(cfg, Storage(), threads=1)
    print("done", calls, flush=True)
""")
# where publish is killed, and what its last write then was
KILL_POINTS = {"first copy": "copy", "half the copies": "copy", "every copy": "copy",
               "TFDS metadata": "write_bytes", "manifest": "/manifest.json", "_SUCCESS": "/_SUCCESS",
               "latest.json": "write_if_unchanged", "staging removed": "delete_tree"}


class Stop(Exception):
    pass


# The near-duplicate search off where a test counts every file as a record: the test's flat shapes group
# across labels (docs/near-duplicates.md: a limit of the search's reliability gate).
NO_SEARCH = {"near_duplicate_bits": 0}


def stage_until_publish(storage: Storage, source: str, dest: str, version: str) -> None:
    """Run every stage but publish (the staging is left ready to publish)."""
    def stop() -> None:
        raise Stop

    with pytest.raises(Stop):
        stages.run_pipeline(config(source, dest, "d", version, **NO_SEARCH), storage, before_publish=stop)


def publish_killed_at(tmp_path: Path, source: str, dest: str, version: str, step: str) -> list[str]:
    """Publish the staged build in a process that SIGKILLs itself after the store write that ``step``
    names (see ``KILLER``); returns the writes it made, one line each."""
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    cfg = {"source": source, "destination": dest, "dataset": "d", "version": version, "shard_size_mb": SHARD_MB,
           **NO_SEARCH}
    proc = subprocess.run([sys.executable, str(script), json.dumps(cfg), step], capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = proc.stdout.splitlines()
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert KILL_POINTS[step] in lines[-1], (step, lines[-1])
    return lines


def test_a_killed_publish_rerun_on_a_changed_source_holds_exactly_its_manifest(
        where: tuple[Storage, str, str | None], tmp_path: Path) -> None:  # noqa: F811
    """Kill the publish of a version after each kind of write (the first shard copy, half the copies, all
    of them, TFDS's metadata and labels.txt, the manifest, ``_SUCCESS``, ``latest.json``, the staging's removal); before
    ``_SUCCESS``, change the source so that the shard count changes; build the version again: its folder
    holds the new manifest's files and nothing else (no shard of the first attempt's count, no temporary,
    no copy that landed late), and ``latest.json`` names it."""
    storage, dest, bucket = where
    source = base_source(tmp_path, storage, bucket, per_class=10)
    images = Images(tmp_path / "new")
    for number, step in enumerate(KILL_POINTS):
        version = f"v{number + 1}"
        add(source, images, "squares", f"before{number}", 2)  # something new to build
        stage_until_publish(storage, source.uri, dest, version)
        publish_killed_at(tmp_path, source.uri, dest, version, step)
        version_uri = join(dest, "d", version)
        if not bucket:  # what a copy in flight leaves locally: a temporary beside the shards
            Path(version_uri).mkdir(parents=True, exist_ok=True)
            (Path(version_uri) / ".tmp-0123-train-00001-of-00019.tfrecord").write_bytes(b"half")
        storage.write_bytes(join(version_uri, "train-00000-of-00019.tfrecord"), b"a copy that landed late")
        published = storage.exists(join(version_uri, "_SUCCESS"))
        assert published == (number >= list(KILL_POINTS).index("_SUCCESS")), step
        if not published:  # the source changes before the rerun: another shard count
            add(source, images, "circles", f"night{number}", 12)
        with signal_handlers_kept():
            result = build(storage, source.uri, dest, "d", version, **NO_SEARCH)
        assert result["version"] == version
        manifest = assert_exactly_the_manifest(storage, version_uri)
        assert manifest["num_records"] == len(source.files())
        assert latest(storage, join(dest, "d")) == version
        assert list(storage.iter_files(join(dest, "d", layout.STAGING))) == [] if bucket else \
            not Path(dest, "d", layout.STAGING).exists(), "staging left behind"


# -- 2. the newest published version lost its manifest --------------------------------------------------------
def test_a_version_without_its_manifest_is_passed_over(where: tuple[Storage, str, str | None],  # noqa: F811
                                                       tmp_path: Path) -> None:
    """v2 (published, then its manifest.json lost) is passed over: v3 builds incrementally on v1, keeps the
    class id v2 gave its new class, says so in the manifest, and latest.json moves to v3; --full too."""
    storage, dest, bucket = where
    source = base_source(tmp_path, storage, bucket, per_class=8)
    images = Images(tmp_path / "new")
    build(storage, source.uri, dest, "d", "v1")
    add(source, images, "zebras", "z", 4)  # a class v2 introduces: id 3
    build(storage, source.uri, dest, "d", "v2")
    storage.delete(join(dest, "d", "v2", "manifest.json"))
    add(source, images, "apes", "a", 3)  # sorts before zebras: must not take its id
    result = build(storage, source.uri, dest, "d", "v3")
    assert result["latest"] == "v3" == latest(storage, join(dest, "d"))
    v3 = read(storage, join(dest, "d", "v3"))
    check_version(storage, v3, source.files())
    assert v3.manifest["classes"] == ["circles", "squares", "triangles", "zebras", "apes"]
    assert v3.build["mode"] == "incremental" and v3.build["base_version"] == "v1"
    assert v3.build["damaged_versions"] == ["v2: its manifest.json is missing"]
    assert v3.manifest["previous_version"] == "v1"
    full = build(storage, source.uri, dest, "d", "v4", full=True)
    assert full["version"] == "v4"
    v4 = layout.read_manifest(storage, join(dest, "d", "v4"))
    assert v4["build"]["mode"] == "full" and v4["classes"] == v3.manifest["classes"]


def test_a_damaged_manifest_never_stops_a_full_build(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = base_source(tmp_path, Storage(), None, per_class=6)
    dest = tmp_path / "out"
    build(Storage(), source.uri, str(dest), "d", "v1")
    (dest / "d" / "v1" / "manifest.json").write_text("{not json")
    status, out, err = run_main(capsys, "--source", source.uri, "--destination", str(dest), "--dataset", "d",
                                "--version", "v2", "--shard-size-mb", str(SHARD_MB), "--full")
    assert status == 0, err
    assert "Traceback" not in err and "published d version v2" in out
    manifest = layout.read_manifest(Storage(), str(dest / "d" / "v2"))
    assert manifest["previous_version"] is None and manifest["build"]["damaged_versions"][0].startswith("v1: ")


# -- 3, 4. a base that lost its labels.csv, inspected.csv or a shard --------------------------------------
@pytest.mark.parametrize("lost", ["labels.csv", "inspected.csv", "a rewritten shard", "a reused shard's index",
                                  "an edited labels.csv", "a labels.csv of other columns", "an edited inspected.csv",
                                  "a ragged inspected.csv",
                                  "an inspected.csv listing a file twice"])
def test_a_base_missing_a_file_gives_a_full_or_fresh_build(lost: str, where: tuple[Storage, str, str | None],  # noqa: F811
                                                           tmp_path: Path) -> None:
    """Incremental builds on a base that lost a file fall back (to a full build, or to reading every file
    again) and say why in the manifest; a --full build never reads the base's labels.csv (its card has no
    diff then). Nothing fails, on either store."""
    storage, dest, bucket = where
    source = base_source(tmp_path, storage, bucket, per_class=10)
    build(storage, source.uri, dest, "d", "v1")
    v1 = join(dest, "d", "v1")
    labels = {row["filename"]: row for row in read(storage, v1).labels}
    victim = sorted(labels)[0]
    source.delete(victim)
    if lost == "labels.csv" or lost == "inspected.csv":
        storage.delete(join(v1, lost))
    elif lost == "an edited labels.csv":  # one record's place moved: splicing must not trust it
        text = storage.read_text(join(v1, "labels.csv")).splitlines(keepends=True)
        row = next(i for i, line in enumerate(text) if line.rstrip("\n").endswith(",1"))
        text[row] = text[row].rstrip("\n")[:-1] + "2\n"
        storage.write_bytes(join(v1, "labels.csv"), "".join(text).encode())
    elif lost == "a labels.csv of other columns":  # as another release wrote it (quality left out), and published
        text = storage.read_text(join(v1, "labels.csv")).splitlines(keepends=True)
        rows = list(csv.reader(io.StringIO("".join(text), newline="")))
        drop = rows[0].index("quality")
        out = io.StringIO()
        csv.writer(out, lineterminator="\n").writerows([row[:drop] + row[drop + 1:] for row in rows])
        storage.write_bytes(join(v1, "labels.csv"), out.getvalue().encode())
        manifest = json.loads(storage.read_bytes(join(v1, "manifest.json")))
        manifest["labels_sha256"] = hashlib.sha256(out.getvalue().encode()).hexdigest()
        storage.write_bytes(join(v1, "manifest.json"), json.dumps(manifest).encode())
    elif lost == "an edited inspected.csv":  # one image's size changed: not the table its manifest names
        lines = storage.read_text(join(v1, "inspected.csv")).splitlines(keepends=True)
        lines[1] = lines[1].replace(",", ",9", 1)  # (its num_bytes, a size no file has: a row taken over otherwise)
        storage.write_bytes(join(v1, "inspected.csv"), "".join(lines).encode())
    elif lost == "a ragged inspected.csv":  # a row with a field too many: not a table this package wrote
        text = storage.read_text(join(v1, "inspected.csv"))
        storage.write_bytes(join(v1, "inspected.csv"), (text + "x.jpg,1,2,extra" + ",x" * 20 + "\n").encode())
        unvouched(storage, v1)
    elif lost == "an inspected.csv listing a file twice":  # its last row again: which one would hold?
        lines = storage.read_text(join(v1, "inspected.csv")).splitlines(keepends=True)
        storage.write_bytes(join(v1, "inspected.csv"), "".join([*lines, lines[-1]]).encode())
        unvouched(storage, v1)
    elif lost == "a rewritten shard":
        storage.delete(join(v1, labels[victim]["shard"]))
    else:
        kept = next(row["shard"] for row in labels.values() if row["shard"] != labels[victim]["shard"])
        storage.delete(join(v1, layout.index_file(kept)))
    build(storage, source.uri, dest, "d", "v2")
    v2 = read(storage, join(dest, "d", "v2"))
    check_version(storage, v2, source.files())
    if lost == "inspected.csv":
        assert v2.build["mode"] == "incremental"
        assert v2.build["inspections_reused"] == 0 and v2.build["files_inspected"] == len(source.files())
        assert v2.build["inspections_not_reused_because"] == "version v1 is damaged: its inspected.csv is missing"
    elif lost == "an edited inspected.csv":
        assert v2.build["mode"] == "incremental"
        assert v2.build["inspections_reused"] == 0 and v2.build["files_inspected"] == len(source.files())
        assert v2.build["inspections_not_reused_because"].startswith("version v1 is damaged: ")
        assert v2.build["inspections_not_reused_because"].endswith("inspected.csv is not the one version v1 published")
    elif lost == "a ragged inspected.csv":
        assert v2.build["mode"] == "incremental"
        assert v2.build["inspections_reused"] == 0 and v2.build["files_inspected"] == len(source.files())
        assert v2.build["inspections_not_reused_because"].startswith("version v1 is damaged: ")
        assert "inspected.csv is not a table this package wrote" in v2.build["inspections_not_reused_because"]
    elif lost == "an inspected.csv listing a file twice":
        assert v2.build["mode"] == "incremental"
        assert v2.build["inspections_reused"] == 0 and v2.build["files_inspected"] == len(source.files())
        assert v2.build["inspections_not_reused_because"].startswith("version v1 is damaged: ")
        assert "inspected.csv lists " in v2.build["inspections_not_reused_because"]
        assert v2.build["inspections_not_reused_because"].endswith(" twice")
    elif lost == "an edited labels.csv":
        assert v2.build["full_because"] == "version v1 is damaged: its labels.csv is not the one it published"
    elif lost == "a labels.csv of other columns":  # (no record to compare with: its rows are not this build's)
        assert v2.build["mode"] == "full"
        assert v2.build["full_because"] == "version v1's labels.csv has other columns than this build's"
    else:
        assert v2.build["mode"] == "full"
        assert v2.build["full_because"].startswith("version v1 is damaged: ")
        assert "is missing" in v2.build["full_because"]


def unvouched(storage: Storage, version: str) -> None:
    """Leave ``inspected_sha256`` out of a version's manifest, as releases up to 0.7.4 did: its inspected.csv is
    then checked by reading every column (a ragged row, a file listed twice)."""
    manifest = json.loads(storage.read_bytes(join(version, "manifest.json")))
    del manifest["inspected_sha256"]
    storage.write_bytes(join(version, "manifest.json"), json.dumps(manifest).encode())


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_a_base_shard_gone_while_a_night_runs(compression: str, tmp_path: Path, bucket: str,
                                              s3_env: dict[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """On S3, a base shard the night rewrites, deleted after the plan: a spliced shard (uncompressed) is
    written from the source instead; a gzip shard (rewritten record by record) stops the build with one line
    naming the remedy that works (--full), not a traceback, and the remedy works."""
    storage = Storage()
    source = base_source(tmp_path, storage, bucket, per_class=10)
    dest = f"s3://{bucket}/out"
    build(storage, source.uri, dest, "d", "v1", compression=compression)
    labels = read_csv_uri(storage, join(dest, "d", "v1", "labels.csv"))
    victim = labels[0]
    source.delete(victim["filename"])
    cfg = config(source.uri, dest, "d", "v2", compression=compression)
    for stage in stages.PIPELINE[:4]:  # discover, inspect, split, plan
        stage.run(cfg, storage, **({"workers": 1} if stage.per_image else {}))
    rewrites = read_json(storage, staged(cfg, PLAN))["rewrite"]
    shard = next(new for new, origin in rewrites.items() if origin["file"] == victim["shard"])
    storage.delete(join(dest, "d", "v1", victim["shard"]))
    args = ["--source", source.uri, "--destination", dest, "--dataset", "d", "--version", "v2",
            "--shard-size-mb", str(SHARD_MB), "--compression", compression]
    if compression == "none":
        checked = stages.write_and_check(cfg, storage, shard)
        assert checked["fallback"].endswith(f"{victim['shard']} is missing")
        status, _, err = run_main(capsys, *args)  # planned again: the base lacks a shard, a full build
        assert status == 0, err
        manifest = layout.read_manifest(storage, join(dest, "d", "v2"))
        assert manifest["build"]["full_because"] == f"version v1 is damaged: {victim['shard']} is missing"
        return
    with pytest.raises(stages.BuildError) as raised:
        stages.write_and_check(cfg, storage, shard)
    assert "--full" in str(raised.value) and victim["shard"] in str(raised.value)
    status, _, err = run_main(capsys, *args, "--full")
    assert status == 0, err


def read_csv_uri(storage: Storage, uri: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(storage.read_text(uri), newline="")))


# -- 5. latest.json naming a version that is not there ----------------------------------------------------
def test_latest_naming_a_missing_version_is_repaired(where: tuple[Storage, str, str | None],  # noqa: F811
                                                     tmp_path: Path) -> None:
    storage, dest, bucket = where
    source = base_source(tmp_path, storage, bucket, per_class=5)
    dataset = join(dest, "d")
    build(storage, source.uri, dest, "d", "v1")
    storage.write_bytes(join(dataset, "latest.json"), b'{"version": "v9"}\n')  # v9 was deleted by hand
    assert build(storage, source.uri, dest, "d", "v2", force=True)["latest"] == "v2"
    assert latest(storage, dataset) == "v2"
    storage.write_bytes(join(dataset, "latest.json"), b'{"version": "v9"}\n')
    result = build(storage, source.uri, dest, "d", "v3")  # nothing changed: nothing built, latest repaired
    assert result["unchanged_since"] == "v2"
    assert latest(storage, dataset) == "v2"
    storage.write_bytes(join(dataset, "latest.json"), b'{"version": "v9"}\n')
    storage.delete(join(dataset, "v2", "_SUCCESS"))  # v2 is no longer published: latest names v1
    build(storage, source.uri, dest, "d", "v0", force=True)  # a backfill before v1
    assert latest(storage, dataset) == "v1"


# -- 6. S3 folder markers ----------------------------------------------------------------------------------
def test_folder_markers_at_every_depth_are_skipped(tmp_path: Path, bucket: str, s3_env: dict[str, str]) -> None:
    storage = Storage()
    source = base_source(tmp_path, storage, bucket, per_class=5)
    for marker in ("src/", "src/circles/", "src/circles/deeper/"):
        storage.write_bytes(f"s3://{bucket}/{marker}", b"")
    dest = f"s3://{bucket}/out"
    build(storage, source.uri, dest, "d", "v1")
    manifest = layout.read_manifest(storage, join(dest, "d", "v1"))
    assert manifest["num_rejected"] == 0, storage.read_text(join(dest, "d", "v1", "rejects.csv"))
    assert manifest["skipped_by_kind"].get("folder_marker") == 3
    assert manifest["num_records"] == len(source.files())


# -- the one message that sent users in circles -----------------------------------------------------------
def stored_png(path: Path, color: tuple[int, int, int]) -> None:
    """A PNG whose size depends only on its dimensions (stored, not compressed)."""
    from PIL import Image

    Image.new("RGB", (24, 16), color).save(path, compress_level=0)


def test_a_file_changed_under_an_unchanged_stamp_names_full_as_the_remedy(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """twin_b.png is a duplicate of twin_a.png (one of them rejected in v1); the kept one is deleted and the
    rejected one rewritten in place with the same size and modification time. v2 takes v1's inspection of
    it over (its stamp did not change), so no rerun reads it again: the error says --full, which works."""
    source = base_source(tmp_path, Storage(), None, per_class=6)
    folder = source.folder / "circles"
    for name in ("twin_a.png", "twin_b.png"):
        stored_png(folder / name, (200, 30, 30))
    dest = tmp_path / "out"
    args = ["--source", source.uri, "--destination", str(dest), "--dataset", "d", "--shard-size-mb", str(SHARD_MB)]
    status, _, err = run_main(capsys, *args, "--version", "v1")
    assert status == 0, err
    rejected = [row["filename"] for row in read_csv(dest / "d" / "v1" / "rejects.csv") if row["reason"] == "duplicate"]
    assert len(rejected) == 1 and rejected[0] in ("circles/twin_a.png", "circles/twin_b.png"), rejected
    changed = source.folder / rejected[0]
    kept = folder / ({"twin_a.png", "twin_b.png"} - {changed.name}).pop()
    before = changed.stat()
    kept.unlink()
    stored_png(changed, (30, 30, 200))  # other content, the same size...
    os.utime(changed, ns=(before.st_atime_ns, before.st_mtime_ns))  # ...and the same modification time
    assert changed.stat().st_size == before.st_size
    for _ in range(2):  # a rerun does not help, and the message does not say it would
        status, _, err = run_main(capsys, *args, "--version", "v2")
        line = one_line(err).split(" (staging kept at ")[0]
        assert status == 1 and changed.name in line and "--full" in line and "rerun" not in line, line
    status, _, err = run_main(capsys, *args, "--version", "v2", "--full")
    assert status == 0, err
    check_version(Storage(), read(Storage(), str(dest / "d" / "v2")), source.files())


def test_cli_summary_names_a_damaged_base(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = base_source(tmp_path, Storage(), None, per_class=6)
    dest = tmp_path / "out"
    args = ["--source", source.uri, "--destination", str(dest), "--dataset", "d", "--shard-size-mb", str(SHARD_MB)]
    assert run_main(capsys, *args, "--version", "v1")[0] == 0
    (dest / "d" / "v1" / "labels.csv").unlink()
    source.delete(sorted(source.files())[0])
    status, out, err = run_main(capsys, *args, "--version", "v2")
    assert status == 0, err
    assert "build: full (version v1 is damaged: labels.csv is missing)" in out
    assert cli.build_line(layout.read_manifest(Storage(), str(dest / "d" / "v2"))) in out
