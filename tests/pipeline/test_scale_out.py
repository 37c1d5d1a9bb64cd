"""Scale-out (issue 13): the work split into chunks and spread over processes gives the same bytes.

Inspection cut into any number of chunks, run in any order, by threads or by a task's process pool,
stages the same tables as one pass; shards written with their records made on a process pool are
the bytes a single process writes; long stages log progress lines a task log can show.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import cli, stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import BuildError
from image_tfrecords.images.sample import make_sample
from image_tfrecords.parallel import TASK_PROCESSES_ENV, process_pool
from image_tfrecords.progress import ProgressLog
from image_tfrecords.stages.inspect import CHUNKS, chunk_limits
from image_tfrecords.staging import staged
from image_tfrecords.storage import Storage

TABLES = (stages.INSPECT_REJECTS, stages.INSPECTED)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """72 sample images in 3 classes, plus a truncated JPEG, a text file named .png and a duplicate."""
    folder = tmp_path_factory.mktemp("scale-src")
    make_sample(str(folder), per_class=24, seed=7)
    cls = sorted(p for p in folder.iterdir() if p.is_dir())
    first = sorted(cls[0].iterdir())[0]
    (cls[1] / "truncated.jpg").write_bytes(first.read_bytes()[: first.stat().st_size // 3])
    (cls[2] / "not-an-image.png").write_bytes(b"hello, this is text\n" * 10)
    shutil.copyfile(first, cls[1] / f"duplicate-of-first{first.suffix}")
    return folder


def config(source: Path, dest: Path, **kwargs: Any) -> BuildConfig:
    return BuildConfig(source=str(source), destination=str(dest), dataset="d", version="v1", **kwargs)


def tables(cfg: BuildConfig) -> dict[str, bytes]:
    return {name: Path(staged(cfg, name)).read_bytes() for name in TABLES}


def one_pass(source: Path, dest: Path) -> dict[str, bytes]:
    """The staged tables of an inspection in one chunk, on one thread."""
    cfg = config(source, dest)
    storage = Storage()
    stages.discover_stage(cfg, storage)
    assert stages.plan_inspection(cfg, storage)["chunks"] == 1
    stages.inspect_chunks(cfg, storage, [0], workers=1)
    stages.gather_inspection(cfg, storage)
    return tables(cfg)


def test_chunks_in_any_order_give_the_tables_of_one_pass(source: Path, tmp_path: Path) -> None:
    expected = one_pass(source, tmp_path / "one")
    assert expected[stages.INSPECT_REJECTS].count(b"\n") == 3  # header, truncated, not-an-image
    cfg = config(source, tmp_path / "many", chunk_files=7)
    storage = Storage()
    stages.discover_stage(cfg, storage)
    planned = stages.plan_inspection(cfg, storage)
    assert planned["chunks"] == 11 and planned["files_to_read"] == 75  # 75 files, 7 a chunk
    for chunk in reversed(range(planned["chunks"])):  # the DAG's mapped tasks finish in any order
        result = stages.inspect_chunk(cfg, storage, chunk)
        assert result["files_read"] == (5 if chunk == 10 else 7)
    assert stages.chunk_label(cfg, storage, 10).startswith("chunk 11/11 (5 files, ")
    gathered = stages.gather_inspection(cfg, storage)
    assert (gathered["inspected"], gathered["rejected"], gathered["files_read"]) == (73, 2, 75)
    assert tables(cfg) == expected


def test_chunks_by_bytes_and_the_map_length_bound(source: Path, tmp_path: Path) -> None:
    cfg = config(source, tmp_path / "bytes", chunk_files=1000, chunk_mb=0.01)  # ~10 kB a chunk
    storage = Storage()
    stages.discover_stage(cfg, storage)
    planned = stages.plan_inspection(cfg, storage)
    plan = staged(cfg, CHUNKS)
    sizes = json.loads(Path(plan).read_text())["chunks"]
    assert planned["chunks"] == len(sizes) > 5
    assert all(c["bytes"] <= 10_000 or c["files"] == 1 for c in sizes)  # a big file is a chunk alone
    assert sum(c["files"] for c in sizes) == 75
    # However small the limits, at most max_chunks chunks are cut.
    assert stages.plan_inspection(config(source, tmp_path / "bytes", chunk_files=1, chunk_mb=1e-6), storage,
                                  max_chunks=8)["chunks"] <= 8
    assert chunk_limits(config(source, tmp_path, chunk_files=1), 10_000, 10**9, max_chunks=1024) == \
        (20, 1_000_000_000)  # 10k files: 20 a chunk (512 chunks at most by files); 1 GB: the default chunk_mb


def test_a_chunk_not_inspected_stops_the_build(source: Path, tmp_path: Path) -> None:
    cfg = config(source, tmp_path / "gap", chunk_files=30)
    storage = Storage()
    stages.discover_stage(cfg, storage)
    assert stages.plan_inspection(cfg, storage)["chunks"] == 3
    stages.inspect_chunk(cfg, storage, 0)
    stages.inspect_chunk(cfg, storage, 2)
    with pytest.raises(BuildError, match=r"inspection chunk\(s\) 2 of 3 were not inspected"):
        stages.gather_inspection(cfg, storage)


def test_a_task_inspects_on_its_process_pool(source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    expected = one_pass(source, tmp_path / "one")
    monkeypatch.setenv(TASK_PROCESSES_ENV, "2")  # 75 files >= 64: a pool of 2 forked processes
    cfg = config(source, tmp_path / "pool")
    storage = Storage()
    stages.discover_stage(cfg, storage)
    stages.plan_inspection(cfg, storage)
    with caplog.at_level(logging.INFO, logger="image_tfrecords"):
        assert stages.inspect_chunk(cfg, storage, 0)["files_read"] == 75
    stages.gather_inspection(cfg, storage)
    assert tables(cfg) == expected
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("inspect chunk")]
    assert lines[0] == "inspect chunk 1/1: 75 images to do"
    assert lines[-1].startswith("inspect chunk 1/1: 75 images in ") and lines[-1].endswith("/s)")


def shard_bytes(dest: Path) -> dict[str, str]:
    """Each published file's SHA-256; the card's with ``dest`` (which its "Load this version" names) as ``DEST``."""
    version = dest / "d" / "v1"

    def content(p: Path) -> bytes:
        data = p.read_bytes()
        return data.replace(str(dest).encode(), b"DEST") if p.name in ("card.md", "card.html") else data
    return {p.name: hashlib.sha256(content(p)).hexdigest() for p in sorted(version.iterdir()) if p.is_file()}


@pytest.mark.parametrize("shard_size_mb", [100.0, 0.05])  # one shard per split (fewer than workers); many
def test_output_bytes_do_not_depend_on_the_workers(source: Path, tmp_path: Path, shard_size_mb: float) -> None:
    outputs = []
    for workers in (1, 2):
        dest = tmp_path / f"w{workers}"
        cfg = config(source, dest, shard_size_mb=shard_size_mb, chunk_files=10 * workers)
        cli.build(cfg, workers=workers, progress=False)
        outputs.append(shard_bytes(dest))
    assert outputs[0] == outputs[1]
    shards = sum(name.endswith(".tfrecord") for name in outputs[0])
    assert shards == 3 if shard_size_mb == 100 else shards >= 2 * 3  # fewer than 2 x workers; more


def test_a_write_task_makes_records_on_its_process_pool(source: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    cfg = config(source, tmp_path / "task", splits={"train": 1.0})  # one shard of every record
    storage = Storage()
    for step in (stages.discover_stage, stages.inspect_stage, stages.split_stage, stages.plan_stage):
        step(cfg, storage)
    monkeypatch.setenv(TASK_PROCESSES_ENV, "2")
    with caplog.at_level(logging.INFO, logger="image_tfrecords"):
        (receipt,) = stages.write_task(cfg, storage, 0)
    records = Path(staged(cfg, stages.LABELS)).read_text().count("\n") - 1
    assert receipt["num_records"] == records > 64  # enough for a pool
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("write ")]
    assert lines[0] == f"write train-00000-of-00001.tfrecord: {records} records to do"
    assert any(line.startswith(f"write train-00000-of-00001.tfrecord: {records} records in ") for line in lines)
    # The same records, in the same order, as a one-process build of the same images makes.
    written = Path(staged(cfg, "shards", "train-00000-of-00001.tfrecord")).read_bytes()
    one = config(source, tmp_path / "one", splits={"train": 1.0})
    cli.build(one, workers=1, progress=False)
    assert written == (tmp_path / "one" / "d" / "v1" / "train-00000-of-00001.tfrecord").read_bytes()


def test_a_bad_record_found_on_the_pool_fails_the_check(source: Path, tmp_path: Path) -> None:
    cfg = config(source, tmp_path / "bad", splits={"train": 1.0})
    storage = Storage()
    for step in (stages.discover_stage, stages.inspect_stage, stages.split_stage, stages.plan_stage):
        step(cfg, storage)
    shard = "train-00000-of-00001.tfrecord"
    stages.write_shard(cfg, storage, shard)
    members = Path(staged(cfg, "members", shard + ".csv"))
    text = members.read_text().splitlines(keepends=True)
    name = text[40].split(",", 1)[0]
    members.write_text("".join(text[:40] + text[41:]))  # the plan no longer holds record 39's image
    with process_pool(2) as pool, pytest.raises(BuildError, match=f"{name!r} is not planned for this shard"):
        stages.validate_shard(cfg, storage, shard, processes=pool, workers=2)


def test_progress_lines_are_spaced_and_say_done_total_rate_eta(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    with caplog.at_level(logging.INFO, logger="image_tfrecords"), \
            ProgressLog("inspect chunk 2/5", 1000, interval=15, clock=lambda: now[0]) as done:
        for _ in range(100):
            now[0] += 1.0  # 10 images a second
            done(10)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "inspect chunk 2/5: 1000 images to do"
    assert lines[1] == "inspect chunk 2/5: 150/1000 images (15%), 10.0/s, ETA 1m25s"
    assert len(lines) == 1 + 6 + 1  # at 15, 30, ... 90 s: six lines, then the summary
    assert lines[-1] == "inspect chunk 2/5: 1000 images in 100.0 s (10.0/s)"


def test_task_processes_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    from image_tfrecords.parallel import task_processes

    monkeypatch.setenv(TASK_PROCESSES_ENV, "3")
    assert task_processes() == 3
    monkeypatch.delenv(TASK_PROCESSES_ENV)
    assert task_processes() == max(1, min(8, os.cpu_count() or 1))
    monkeypatch.setenv(TASK_PROCESSES_ENV, "many")
    with pytest.raises(ValueError, match="IMAGE_TFRECORDS_TASK_PROCESSES must be a whole number"):
        task_processes()
