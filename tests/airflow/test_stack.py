"""The full stack, without Docker: PostgreSQL, SeaweedFS, and Airflow's scheduler, dag-processor,
triggerer and api-server with the LocalExecutor, driven through the REST API and the CLI."""

from __future__ import annotations

import csv
import io
import itertools
import json
import os
import re
import shutil
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from image_tfrecords.storage import Storage
from tests import stack_support
from tests.stack_support import AIRFLOW, POOL, Stack, _wait, airflow_env, migrate
from tests.tf_reader import read_version
from tools import seaweedfs

postgres = stack_support.postgres  # the fixture (PostgreSQL of this module's own)


def _images(sample_dir: Path, target: Path, names: list[Path], mtime: datetime) -> None:
    for path in names:
        dest = target / path.relative_to(sample_dir)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
        os.utime(dest, (mtime.timestamp(), mtime.timestamp()))


def _splits(storage: Storage, version_uri: str) -> dict[str, str]:
    rows = csv.DictReader(io.StringIO(storage.read_text(f"{version_uri}/labels.csv")))
    return {row["filename"]: row["split"] for row in rows}


NIGHT_CONF = {"shard_size_mb": 0.02}  # the backfilled nights' params


def test_full_stack_manual_backfill_parallel_and_skip(postgres: str, s3_server: seaweedfs.S3Server, bucket: str,
                                                      s3_storage: Storage, sample_dir: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    source = tmp_path / "incoming"
    images = sorted(p for p in sample_dir.rglob("*") if p.is_file())
    days = [datetime(2026, 11, d, 1, 0, tzinfo=UTC) for d in (10, 11, 12)]
    for i, day in enumerate(days):  # a third of the images arrives before each night's run
        _images(sample_dir, source, images[i::3], day)
    api_port = seaweedfs.free_ports(1)[0]
    home = tmp_path / "airflow"
    (home / "logs").mkdir(parents=True)
    env = {
        **airflow_env(home, postgres, api_port, s3_server, "LocalExecutor", pool=POOL),
        "IMAGE_TFRECORDS_SOURCE": str(source), "IMAGE_TFRECORDS_DESTINATION": f"s3://{bucket}/datasets",
        "IMAGE_TFRECORDS_DATASET": "nightly", "IMAGE_TFRECORDS_RETRY_DELAY_SECONDS": "5",
    }
    migrate(env, pool_slots=4)  # the project's setup, as in docker compose
    stack = Stack(env, api_port, home / "logs")
    try:
        stack.start()
        _wait(lambda: stack.call("GET", "/dags/image_tfrecords"), 180, "the DAG to be parsed", interval=2)
        stack.call("PATCH", "/dags/image_tfrecords", {"is_paused": False})

        # 0. Unpaused, the scheduler starts the latest nightly run (catchup is off): the whole source.
        def scheduled_run() -> dict | None:
            runs = stack.call("GET", "/dags/image_tfrecords/dagRuns?run_type=scheduled&limit=10")["dag_runs"]
            return runs[0] if runs else None

        nightly = stack.wait_run(_wait(scheduled_run, 180, "the scheduled run", interval=2)["dag_run_id"])
        nightly_version = datetime.fromisoformat(nightly["logical_date"]).strftime("%Y%m%dT%H%M%SZ")
        root = f"s3://{bucket}/datasets/nightly"
        assert read_version(s3_storage, f"{root}/{nightly_version}")[0]["num_records"] == len(images)

        # 1. A manual run from the REST API, with a conf: small shards, so several write in parallel.
        now = datetime.now(UTC).replace(microsecond=0)
        run = stack.call("POST", "/dags/image_tfrecords/dagRuns", {
            "logical_date": now.isoformat(), "conf": {"dataset": "manual", "shard_size_mb": 0.02}})
        stack.wait_run(run["dag_run_id"])
        manual_uri = f"s3://{bucket}/datasets/manual/{now.strftime('%Y%m%dT%H%M%SZ')}"
        manifest, splits = read_version(s3_storage, manual_uri)
        assert manifest["num_records"] == len(images) == sum(len(r) for r in splits.values())
        writers = [t for t in stack.task_instances(run["dag_run_id"]) if t["task_id"] == "write_shards"]
        assert len(writers) == sum(len(s["shards"]) for s in manifest["splits"].values()) > 2
        assert {t["pool"] for t in writers} == {"image_tfrecords"}
        spans = sorted((datetime.fromisoformat(t["start_date"]), datetime.fromisoformat(t["end_date"]))
                       for t in writers)
        overlaps = sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
        assert overlaps > 0, f"shard tasks ran one after another: {spans}"
        assert {t["rendered_map_index"] for t in writers} == {
            s["file"] for split in manifest["splits"].values() for s in split["shards"]}
        inspectors = [t for t in stack.task_instances(run["dag_run_id"]) if t["task_id"] == "inspect_images"]
        assert [t["rendered_map_index"] for t in inspectors] == [f"chunk 1/1 ({len(images)} files, 0 MB)"]
        # The library's progress and summary lines reach the task logs.
        run_logs = home / "logs" / "dag_id=image_tfrecords" / f"run_id={run['dag_run_id']}"

        def task_log(task_id: str) -> str:
            return "".join(p.read_text() for p in sorted(run_logs.glob(f"task_id={task_id}/**/*.log")))

        assert f"inspect chunk 1/1: {len(images)} images to do" in task_log("inspect_images")
        assert re.search(rf"inspect chunk 1/1: {len(images)} images in [0-9.]+ s", task_log("inspect_images"))
        assert re.search(r"write \S+-of-\d+\.tfrecord: \d+ records in [0-9.]+ s", task_log("write_shards"))
        assert re.search(r"split: done in [0-9.]+ s \(num_records=", task_log("plan"))  # split's line, in plan's
        gate_log = task_log("gate")  # validate, card and gate share a task: each stage's summary is in its log
        assert all(re.search(rf"{stage}: done in [0-9.]+ s", gate_log) for stage in ("validate", "card", "gate"))

        # 2. A backfill over three past nights: each run sees the source as of its logical date.
        subprocess.run([AIRFLOW, "backfill", "create", "--dag-id", "image_tfrecords", "--from-date",
                        "2026-11-10T00:00:00+00:00", "--to-date", "2026-11-12T03:00:00+00:00",
                        "--max-active-runs", "1", "--dag-run-conf", json.dumps(NIGHT_CONF)], env=env, check=True,
                       capture_output=True, timeout=300)
        versions = [d.strftime("%Y%m%dT020000Z") for d in days]

        def backfill_done() -> list[dict] | None:
            runs = stack.call("GET", "/dags/image_tfrecords/dagRuns?run_type=backfill&limit=100")["dag_runs"]
            done = [r for r in runs if r["state"] in ("success", "failed")]
            return runs if len(runs) == 3 and len(done) == 3 else None

        backfill = _wait(backfill_done, 600, "the backfill runs", interval=3)
        for backfill_run in backfill:
            assert backfill_run["state"] == "success", stack.diagnose(backfill_run["dag_run_id"])
        counts = [read_version(s3_storage, f"{root}/{v}")[0]["num_records"] for v in versions]
        assert counts == [len(images[0::3]), len(images[0::3]) + len(images[1::3]), len(images)]
        # Backfilled versions are older than the nightly one: latest.json never moves back.
        assert json.loads(s3_storage.read_bytes(f"{root}/latest.json")) == {"version": nightly_version}
        first, last = _splits(s3_storage, f"{root}/{versions[0]}"), _splits(s3_storage, f"{root}/{versions[-1]}")
        assert all(last[name] == split for name, split in first.items()), "earlier images keep their split"
        # One night after another, each builds incrementally on the night before it (issue 12).
        # (Small shards, so that the nights keep several and no night compacts.)
        for i, (before, version) in enumerate(itertools.pairwise(versions), start=1):
            build = read_version(s3_storage, f"{root}/{version}")[0]["build"]
            assert build["mode"] == "incremental" and build["base_version"] == before, build
            assert build["files_inspected"] == len(images[i::3]), build  # only that night's new images
            assert build["inspections_reused"] == sum(len(images[j::3]) for j in range(i)), build
            assert build["shards_reused"] > 0 and build["source_bytes_read"] > 0, build

        # 3. The next night, nothing new: the run skips the work and publishes nothing. (One backfill
        # at a time per DAG: wait until the scheduler has marked the first one completed.)
        _wait(lambda: all(b["completed_at"] for b in stack.call("GET", "/backfills?dag_id=image_tfrecords")[
            "backfills"]), 120, "the first backfill to be marked completed", interval=2)
        subprocess.run([AIRFLOW, "backfill", "create", "--dag-id", "image_tfrecords", "--from-date",
                        "2026-11-13T00:00:00+00:00", "--to-date", "2026-11-13T03:00:00+00:00",
                        "--dag-run-conf", json.dumps(NIGHT_CONF)], env=env, check=True,
                       capture_output=True, timeout=300)

        def quiet_night() -> dict | None:
            runs = stack.call("GET", "/dags/image_tfrecords/dagRuns?run_type=backfill&limit=100")["dag_runs"]
            night = [r for r in runs if r["logical_date"].startswith("2026-11-13")]
            return night[0] if night and night[0]["state"] in ("success", "failed") else None

        night = _wait(quiet_night, 300, "the unchanged night's run", interval=3)
        assert night["state"] == "success", stack.diagnose(night["dag_run_id"])
        states = {t["task_id"]: t["state"] for t in stack.task_instances(night["dag_run_id"])}
        assert states["discover"] == "skipped"  # it found nothing new: it and everything after it are skipped
        assert {states[t] for t in ("inspect_images", "plan", "write_shards", "gate", "publish")} == {"skipped"}
        assert states["clean_stale_staging"] == "success"  # beside the build, whatever it does
        assert "nothing new to build" in "".join(
            p.read_text() for p in (home / "logs" / "dag_id=image_tfrecords" / f"run_id={night['dag_run_id']}")
            .glob("task_id=discover/**/*.log"))
        assert not s3_storage.exists(f"{root}/20261113T020000Z/_SUCCESS")
        assert json.loads(s3_storage.read_bytes(f"{root}/latest.json")) == {"version": nightly_version}
    finally:
        stack.stop()
    print(f"stack test wall time {time.monotonic() - started:.0f} s; overlapping shard task pairs {overlaps}")
