"""The DAG end to end under `airflow dags test`, from and into a real SeaweedFS S3 server."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from image_tfrecords import compiled
from image_tfrecords.images.sample import make_sample
from image_tfrecords.storage import Storage
from tests.support import assert_matches_source
from tests.tf_reader import read_version
from tools.seaweedfs import S3Server

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


def dags_test(airflow_env: dict[str, str], server: S3Server, logical_date: str,
              conf: dict) -> subprocess.CompletedProcess[str]:
    env = {**airflow_env, "AIRFLOW_CONN_AWS_DEFAULT": server.airflow_connection()}
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(key, None)  # inside Airflow, S3 settings come only from the connection
    return subprocess.run([AIRFLOW, "dags", "test", "image_tfrecords", logical_date, "-c", json.dumps(conf)],
                          env=env, capture_output=True, text=True, timeout=900)


def asset_events(airflow_env: dict[str, str]) -> list[dict]:
    """The extra of every image_tfrecords Asset event in the Airflow database, oldest first."""
    code = ("import json; from sqlalchemy import select; from airflow.utils.session import create_session; "
            "from airflow.models.asset import AssetEvent, AssetModel\n"
            "with create_session() as s:\n"
            "    rows = s.execute(select(AssetEvent.extra).join(AssetModel, AssetModel.id == AssetEvent.asset_id)"
            ".where(AssetModel.name == 'image_tfrecords').order_by(AssetEvent.id)).scalars().all()\n"
            "    print('RESULT' + json.dumps(list(rows)))")
    result = subprocess.run([sys.executable, "-c", code], env=airflow_env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.split("RESULT", 1)[1])


def shard_digests(manifest: dict) -> dict[str, list[tuple[str, str]]]:
    return {s: [(x["file"], x["sha256"]) for x in i["shards"]] for s, i in manifest["splits"].items()}


@pytest.fixture
def s3_source(sample_dir: Path, bucket: str, s3_storage: Storage) -> str:
    for path in sample_dir.rglob("*"):
        if path.is_file():
            s3_storage.write_bytes(f"s3://{bucket}/incoming/{path.relative_to(sample_dir).as_posix()}",
                                   path.read_bytes())
    return f"s3://{bucket}/incoming"


def test_dag_publishes_to_s3_reruns_identically_and_builds_incrementally(
        airflow_env: dict[str, str], s3_server: S3Server, s3_source: str, bucket: str, s3_storage: Storage,
        sample_dir: Path, tmp_path: Path) -> None:
    conf = {"source": s3_source, "destination": f"s3://{bucket}/datasets", "dataset": "shapes",
            "shard_size_mb": 0.05, "salt": "e2e"}
    first = dags_test(airflow_env, s3_server, "2026-11-01T02:00:00+00:00", conf)
    assert first.returncode == 0, first.stdout[-5000:] + first.stderr[-5000:]
    assert "rendered_map_index='train-00000-of-" in first.stdout + first.stderr
    assert compiled.line() in first.stdout + first.stderr  # each task's log names the compiled parts it ran

    root = f"s3://{bucket}/datasets/shapes"
    manifest, splits = read_version(s3_storage, f"{root}/20261101T020000Z")
    assert_matches_source(manifest, splits, sample_dir)
    assert s3_storage.exists(f"{root}/20261101T020000Z/_SUCCESS")
    assert json.loads(s3_storage.read_bytes(f"{root}/latest.json")) == {"version": "20261101T020000Z"}
    assert not list(s3_storage.iter_files(f"{root}/_staging"))
    card = s3_storage.read_text(f"{root}/20261101T020000Z/card.md")  # the dataset card is published too
    assert "# Dataset card: shapes 20261101T020000Z" in card and "This is the first version" in card
    for png in re.findall(r"\]\((card/[^)]+\.png)\)", card):
        assert s3_storage.read_bytes(f"{root}/20261101T020000Z/{png}")[:8] == b"\x89PNG\r\n\x1a\n"
    assert b"data:image/png;base64," in s3_storage.read_bytes(f"{root}/20261101T020000Z/card.html")

    unchanged = dags_test(airflow_env, s3_server, "2026-11-02T02:00:00+00:00", conf)  # same source, same params
    output = unchanged.stdout + unchanged.stderr
    assert unchanged.returncode == 0, output[-5000:]
    assert "unchanged since version 20261101T020000Z: nothing new to build" in output
    assert "[DAG TEST] starting task_id=inspect_images" not in output  # skipped, like everything after it
    assert not s3_storage.exists(f"{root}/20261102T020000Z/_SUCCESS")
    assert not list(s3_storage.iter_files(f"{root}/_staging"))
    assert json.loads(s3_storage.read_bytes(f"{root}/latest.json")) == {"version": "20261101T020000Z"}

    second = dags_test(airflow_env, s3_server, "2026-11-02T02:00:00+00:00", {**conf, "force": True})
    assert second.returncode == 0, second.stdout[-5000:] + second.stderr[-5000:]
    manifest2, _ = read_version(s3_storage, f"{root}/20261102T020000Z")
    assert shard_digests(manifest2) == shard_digests(manifest)
    assert "| images added | 0 |" in s3_storage.read_text(f"{root}/20261102T020000Z/card.md")
    assert json.loads(s3_storage.read_bytes(f"{root}/latest.json")) == {"version": "20261102T020000Z"}

    events = [e for e in asset_events(airflow_env) if e["uri"].startswith(root)]
    assert [e["version"] for e in events][-2:] == ["20261101T020000Z", "20261102T020000Z"]
    assert events[-1] == {"uri": f"{root}/20261102T020000Z", "version": "20261102T020000Z", "num_records": 60,
                          "num_rejected": 0, "splits": manifest2["splits"] and
                          {k: v["num_records"] for k, v in manifest2["splits"].items()},
                          "latest": "20261102T020000Z"}

    consumer = subprocess.run(
        [AIRFLOW, "dags", "test", "image_tfrecords_consumer", "2026-11-02T03:00:00+00:00"], capture_output=True,
        text=True, timeout=600, env={**airflow_env, "AIRFLOW_CONN_AWS_DEFAULT": s3_server.airflow_connection(),
                                     "IMAGE_TFRECORDS_DESTINATION": f"s3://{bucket}/datasets",
                                     "IMAGE_TFRECORDS_DATASET": "shapes"})
    assert consumer.returncode == 0, consumer.stdout[-3000:] + consumer.stderr[-3000:]
    assert f"new dataset version 20261102T020000Z at {root}/20261102T020000Z: 60 records, 3 classes" in \
        consumer.stdout + consumer.stderr

    before = {f.key: s3_storage.sha256_of(f"{root}/{f.key}") for f in s3_storage.iter_files(root)}
    rerun = dags_test(airflow_env, s3_server, "2026-11-01T02:00:00+00:00", conf)  # an older date, again
    assert rerun.returncode == 0, rerun.stdout[-5000:] + rerun.stderr[-5000:]
    after = {f.key: s3_storage.sha256_of(f"{root}/{f.key}") for f in s3_storage.iter_files(root)}
    assert after == before, "a rerun must write the same bytes and nothing more"
    assert json.loads(s3_storage.read_bytes(f"{root}/latest.json")) == {"version": "20261102T020000Z"}

    # Two incremental nights: the source gains, loses and changes images; each night reuses what it can.
    mirror = tmp_path / "mirror"  # the source as it is now, to check the records against
    shutil.copytree(sample_dir, mirror)
    extra = tmp_path / "extra"
    make_sample(str(extra), per_class=5, seed=7)
    night2 = {"circles/new-a.jpg": (extra / "circles" / "circle_000.jpg").read_bytes(),
              "squares/new-b.png": (extra / "squares" / "square_004.png").read_bytes()}
    gone = sorted(p.relative_to(mirror).as_posix() for p in (mirror / "triangles").iterdir())[0]
    night3 = {sorted(p.relative_to(mirror).as_posix() for p in (mirror / "circles").iterdir())[1]:
              (extra / "circles" / "circle_001.jpg").read_bytes()}  # same name, new content
    previous = manifest2
    for date, add, remove in (("2026-11-03T02:00:00+00:00", night2, [gone]), ("2026-11-04T02:00:00+00:00", night3, [])):
        for name, data in add.items():
            s3_storage.write_bytes(f"{s3_source}/{name}", data)
            (mirror / name).write_bytes(data)
        for name in remove:
            s3_storage.delete(f"{s3_source}/{name}")
            (mirror / name).unlink()
        night = dags_test(airflow_env, s3_server, date, conf)
        assert night.returncode == 0, night.stdout[-5000:] + night.stderr[-5000:]
        # discover inspected the night's few files itself: inspect_images was mapped over nothing
        assert "[DAG TEST] starting task_id=inspect_images" not in night.stdout + night.stderr
        version = date[:10].replace("-", "") + "T020000Z"
        manifest_n, splits_n = read_version(s3_storage, f"{root}/{version}")
        assert_matches_source(manifest_n, splits_n, mirror)
        build = manifest_n["build"]
        assert build["mode"] == "incremental" and build["base_version"] == previous["version"], build
        assert build["files_inspected"] == len(add), build  # only the new and changed files were read
        assert build["shards_reused"] > 0, build
        reused = [s for i in manifest_n["splits"].values() for s in i["shards"] if "reused_from" in s]
        before = {(s["file"], s["sha256"]) for i in previous["splits"].values() for s in i["shards"]}
        assert all((s["reused_from"]["file"], s["sha256"]) in before for s in reused)
        assert manifest_n["classes"] == manifest["classes"]
        previous = manifest_n


def test_dag_gzip_into_local_folder(airflow_env: dict[str, str], s3_server: S3Server, sample_dir: Path,
                                    tmp_path: Path) -> None:
    conf = {"source": str(sample_dir), "destination": str(tmp_path), "dataset": "shapes", "compression": "gzip",
            "version": "manual-1"}
    result = dags_test(airflow_env, s3_server, "2026-11-05T00:00:00+00:00", conf)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    manifest, splits = read_version(Storage(), str(tmp_path / "shapes" / "manual-1"))
    assert manifest["compression"] == "gzip"
    assert_matches_source(manifest, splits, sample_dir)


def test_the_dag_needs_only_its_dags_folder(airflow_env: dict[str, str], s3_server: S3Server, sample_dir: Path,
                                          tmp_path: Path) -> None:
    """Pointed at dags/ alone (no plugins folder, as most people first do), the DAG publishes: no task
    imports anything from plugins/."""
    env = {key: value for key, value in airflow_env.items() if key != "AIRFLOW__CORE__PLUGINS_FOLDER"}
    env["AIRFLOW__CORE__PLUGINS_FOLDER"] = str(tmp_path / "no-plugins")
    conf = {"source": str(sample_dir), "destination": str(tmp_path / "out"), "dataset": "d", "version": "v1"}
    result = dags_test(env, s3_server, "2026-11-07T00:00:00+00:00", conf)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    assert "up_for_retry" not in result.stdout + result.stderr
    manifest, splits = read_version(Storage(), str(tmp_path / "out" / "d" / "v1"))
    assert_matches_source(manifest, splits, sample_dir)


def test_bad_params_fail_fast_without_retries(airflow_env: dict[str, str], s3_server: S3Server,
                                              sample_dir: Path, tmp_path: Path) -> None:
    conf = {"source": str(sample_dir), "destination": str(tmp_path), "dataset": "d",
            "splits": {"train": 0.7, "test": 0.2}}
    result = dags_test(airflow_env, s3_server, "2026-11-06T00:00:00+00:00", conf)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "split fractions must sum to 1" in output
    assert "image_tfrecords FAILED: run " in output and "task discover" in output  # the failure notice
    assert "up_for_retry" not in output
    assert not any(tmp_path.rglob("_SUCCESS"))


def test_secret_never_in_task_logs_or_published_files(airflow_env: dict[str, str], s3_server: S3Server,
                                                      s3_source: str, bucket: str, s3_storage: Storage) -> None:
    conf = {"source": s3_source, "destination": f"s3://{bucket}/out", "dataset": "d", "version": "v"}
    result = dags_test(airflow_env, s3_server, "2026-11-07T00:00:00+00:00", conf)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    logs = Path(airflow_env["AIRFLOW_HOME"]) / "logs"
    texts = [p.read_text(errors="replace") for p in logs.rglob("*") if p.is_file()]
    texts += [s3_storage.read_text(f"s3://{bucket}/out/d/v/{name}")
              for name in ("manifest.json", "labels.csv", "rejects.csv")]
    texts.append(result.stdout + result.stderr)
    assert len(texts) > 3
    assert not [text[:200] for text in texts if s3_server.secret_key in text]


def test_dag_runs_of_one_version_exclude_each_other_and_stale_staging_is_cleaned(
        airflow_env: dict[str, str], s3_server: S3Server, s3_source: str, bucket: str, s3_storage: Storage) -> None:
    from image_tfrecords.published import locking

    root = f"s3://{bucket}/datasets/shapes"
    conf = {"source": s3_source, "destination": f"s3://{bucket}/datasets", "dataset": "shapes", "version": "v7"}
    locking.hold(s3_storage, f"{root}/_staging/v7", "airflow:image_tfrecords:another-run", 600)
    blocked = dags_test(airflow_env, s3_server, "2026-11-03T02:00:00+00:00", conf)
    output = blocked.stdout + blocked.stderr
    assert blocked.returncode != 0
    assert "version v7 is being built by another run" in output and "another-run" in output
    assert "[DAG TEST] starting task_id=inspect_images" not in output  # failed at once, nothing else ran
    assert not s3_storage.exists(f"{root}/v7/_SUCCESS")

    # An abandoned build of another version (no lock) is removed by the teardown; staging can only be aged
    # on a local destination, so on S3 the grace period is set to 0 for this run.
    s3_storage.write_bytes(f"{root}/_staging/v0-abandoned/discovered.csv", b"filename,label,num_bytes\n")
    locking.release(s3_storage, f"{root}/_staging/v7", "airflow:image_tfrecords:another-run")
    done = dags_test({**airflow_env, "IMAGE_TFRECORDS_STAGING_GRACE_HOURS": "0"}, s3_server,
                     "2026-11-03T02:00:00+00:00", conf)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    assert "[DAG TEST] starting task_id=clean_stale_staging" in output
    assert s3_storage.exists(f"{root}/v7/_SUCCESS")
    assert not list(s3_storage.iter_files(f"{root}/_staging")), "own staging published, abandoned one cleaned"
