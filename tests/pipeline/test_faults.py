"""Faults injected into the real processes: a store that goes down, a killed writer, racing runs,
wrong credentials. A version is published complete and valid, or not at all."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.storage import Storage, join
from tests.airflow.test_dag_e2e import AIRFLOW, dags_test
from tests.support import assert_matches_source, run_cli
from tests.tf_reader import read_version
from tools import seaweedfs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_server(tmp_path: Path) -> seaweedfs.S3Server:
    """A SeaweedFS of this test's own, which the test may stop and restart."""
    server = seaweedfs.start(str(tmp_path / "s3"))
    yield server
    seaweedfs.stop(server)


def _wait_for(predicate, timeout: float, what: str, interval: float = 0.05) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _exists(storage: Storage, uri: str) -> bool:
    try:
        return storage.exists(uri)
    except Exception:  # the server may be down or starting
        return False


def test_store_outage_during_shards_and_publish_is_retried(own_server: seaweedfs.S3Server, airflow_env: dict,
                                                            sample_dir: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    server = own_server
    server.create_bucket("data")
    for key, value in server.env().items():
        monkeypatch.setenv(key, value)
    storage = Storage()
    root = "s3://data/ds/shapes"
    previous = run_cli("build", "--source", str(sample_dir), "--destination", "s3://data/ds", "--dataset", "shapes",
                       "--version", "20261101T000000Z", env={**os.environ})
    assert previous.returncode == 0, previous.stderr

    staging = f"{root}/_staging/20261102T000000Z"
    log_path = tmp_path / "dags-test.log"
    env = {**airflow_env, "AIRFLOW_CONN_AWS_DEFAULT": server.airflow_connection(),
           "IMAGE_TFRECORDS_RETRY_DELAY_SECONDS": "8"}
    conf = {"source": str(sample_dir), "destination": "s3://data/ds", "dataset": "shapes", "shard_size_mb": 0.05,
            "force": True}
    with open(log_path, "w") as log:
        run = subprocess.Popen([AIRFLOW, "dags", "test", "image_tfrecords", "2026-11-02T00:00:00+00:00",
                                "-c", json.dumps(conf)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for phase, marker in (("shard writing", "plan.json"), ("publish", "manifest.json")):
            _wait_for(lambda m=marker: _exists(storage, f"{staging}/{m}"), 120, f"{phase} to start")
            retries_before = log_path.read_text().count("new_state=up_for_retry")
            seaweedfs.stop(server, hard=True)  # the store goes down, at once
            _wait_for(lambda n=retries_before: log_path.read_text().count("new_state=up_for_retry") > n, 120,
                      f"a task to fail and wait for retry during {phase}")
            server = seaweedfs.start(server.data_dir, ports=server.ports)  # back, same endpoint and data
            own_server.pid = server.pid  # so the fixture stops the running one
            tail = log_path.read_text()[-3000:]
            assert json.loads(storage.read_bytes(f"{root}/latest.json")) == {"version": "20261101T000000Z"}, tail
            assert not storage.exists(f"{root}/20261102T000000Z/_SUCCESS"), tail
        assert run.wait(timeout=300) == 0, log_path.read_text()[-5000:]
    finally:
        if run.poll() is None:
            run.kill()
    assert log_path.read_text().count("new_state=up_for_retry") >= 2
    assert json.loads(storage.read_bytes(f"{root}/latest.json")) == {"version": "20261102T000000Z"}
    manifest, splits = read_version(storage, f"{root}/20261102T000000Z")
    assert_matches_source(manifest, splits, sample_dir)


def test_killed_shard_writer_leaves_nothing_and_its_retry_is_identical(sample_dir: Path, bucket: str,
                                                                         s3_env: dict, s3_storage: Storage,
                                                                         tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(sample_dir, source)
    cfg = BuildConfig(source=str(source), destination=f"s3://{bucket}", dataset="d", version="v1",
                      shard_size_mb=0.05)
    for stage in (stages.discover_stage, stages.inspect_stage, stages.split_stage, stages.plan_stage):
        stage(cfg, s3_storage)
    shard = stages.task_shards(cfg, s3_storage, 0)[0]
    # A reference build of the same shard under another version: shard bytes do not depend on it.
    ref_cfg = BuildConfig(**{**cfg.to_dict(), "version": "ref"})
    for stage in (stages.discover_stage, stages.inspect_stage, stages.split_stage, stages.plan_stage):
        stage(ref_cfg, s3_storage)
    expected = stages.write_shard(ref_cfg, s3_storage, shard)

    members = _members(s3_storage, cfg, shard)
    blocked = members[len(members) // 2][1]  # reading it hangs: the writer stops in the middle of the shard
    work = tmp_path / "tmp"
    work.mkdir()
    code = ("import sys, time; from image_tfrecords import stages; "
            "from image_tfrecords.config import BuildConfig; "
            "from image_tfrecords.shards import writer; "
            "from image_tfrecords.storage import Storage; import json; "
            "read = writer.read_source; "
            "writer.read_source = lambda s, src, name, *a: time.sleep(3600) if name == sys.argv[3] "
            "else read(s, src, name, *a); "
            "stages.write_shard(BuildConfig(**json.loads(sys.argv[1])), Storage(), sys.argv[2])")
    writer = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg.to_dict()), shard, blocked], cwd=ROOT,
                              env={**os.environ, **s3_env, "TMPDIR": str(work)})
    try:
        _wait_for(lambda: any(p.stat().st_size > 0 for p in work.rglob(shard)), 60, "a partial shard on disk")
        os.kill(writer.pid, signal.SIGKILL)
        assert writer.wait(timeout=30) == -signal.SIGKILL
    finally:
        if writer.poll() is None:
            writer.kill()
    partial = [p.stat().st_size for p in work.rglob(shard)]
    assert partial and 0 < partial[0] < expected["num_bytes"], "killed mid-shard"
    assert not s3_storage.exists(join(cfg.staging_uri, "shards", shard)), "no partial object is ever visible"
    assert not s3_storage.exists(join(cfg.staging_uri, "receipts", shard + ".json"))
    assert not list(s3_storage.iter_files(cfg.version_uri))

    retried = stages.write_shard(cfg, s3_storage, shard)  # what the task's retry does
    assert (retried["sha256"], retried["num_bytes"]) == (expected["sha256"], expected["num_bytes"])
    assert s3_storage.sha256_of(join(cfg.staging_uri, "shards", shard)) == expected["sha256"]


def _members(storage: Storage, cfg: BuildConfig, shard: str) -> list[tuple[int, str]]:
    from image_tfrecords.storage.documents import read_rows

    with read_rows(storage, join(cfg.staging_uri, "members", shard + ".csv")) as rows:
        return [(i, row["filename"]) for i, row in enumerate(rows)]


@pytest.mark.parametrize("newer_first", [True, False])
def test_concurrent_backfill_runs_do_not_clobber(newer_first: bool, sample_dir: Path, bucket: str, s3_env: dict,
                                                 s3_storage: Storage) -> None:
    versions = ["20261101T020000Z", "20261102T020000Z"]
    order = list(reversed(versions)) if newer_first else versions
    env = {**os.environ, **s3_env}
    runs = []
    for version in order:
        runs.append(subprocess.Popen(
            [sys.executable, "-m", "image_tfrecords", "build", "--source", str(sample_dir), "--destination",
             f"s3://{bucket}/ds", "--dataset", "d", "--version", version, "--shard-size-mb", "0.05", "--workers", "1"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        time.sleep(0.3)
    for run in runs:
        _, err = run.communicate(timeout=300)
        assert run.returncode == 0, err
    manifests = [read_version(s3_storage, f"s3://{bucket}/ds/d/{v}")[0] for v in versions]
    assert [m["version"] for m in manifests] == versions
    assert manifests[0]["splits"] == manifests[1]["splits"]  # same input: same shards, nothing mixed up
    for version in versions:
        assert s3_storage.exists(f"s3://{bucket}/ds/d/{version}/_SUCCESS")
    assert json.loads(s3_storage.read_bytes(f"s3://{bucket}/ds/d/latest.json")) == {"version": versions[-1]}
    assert not list(s3_storage.iter_files(f"s3://{bucket}/ds/d/_staging"))


@pytest.mark.parametrize("fault", ["wrong_secret", "missing_bucket"])
def test_unfixable_store_errors_fail_the_dag_once_with_one_clear_line(fault: str, airflow_env: dict,
                                                                      s3_server: seaweedfs.S3Server, bucket: str,
                                                                      sample_dir: Path) -> None:
    server = s3_server
    wrong = "wrong-secret-do-not-log"
    if fault == "wrong_secret":
        server = seaweedfs.S3Server(s3_server.endpoint, s3_server.access_key, wrong)
    dest = f"s3://{bucket}/out" if fault == "wrong_secret" else "s3://no-such-bucket-anywhere/out"
    conf = {"source": str(sample_dir), "destination": dest, "dataset": "d"}
    result = dags_test(airflow_env, server, "2026-11-09T00:00:00+00:00", conf)
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "up_for_retry" not in output, "errors that retrying cannot fix are not retried"
    expected = (f"access denied to bucket {bucket!r} at {s3_server.endpoint}" if fault == "wrong_secret"
                else f"bucket 'no-such-bucket-anywhere' does not exist at {s3_server.endpoint}")
    assert expected in output
    logs = "".join(p.read_text(errors="replace") for p in (Path(airflow_env["AIRFLOW_HOME"]) / "logs").rglob("*")
                   if p.is_file())
    assert wrong not in output + logs and s3_server.secret_key not in output + logs


def test_unreachable_endpoint_is_one_line_naming_endpoint_and_bucket(sample_dir: Path) -> None:
    port = seaweedfs.free_ports(1)[0]  # nothing listens there
    env = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "unreachable-secret"}
    result = run_cli("build", "--source", str(sample_dir), "--destination", "s3://some-bucket/out", "--dataset", "d",
                     "--version", "v", env=env)
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0
    assert f"cannot reach the S3 endpoint http://127.0.0.1:{port} (bucket 'some-bucket')" in result.stderr
    assert "unreachable-secret" not in result.stderr
