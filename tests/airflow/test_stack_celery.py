"""The full stack on the CeleryExecutor, without Docker: Debian's redis-server as the broker,
PostgreSQL (metadata database and Celery result backend), SeaweedFS, Airflow's scheduler,
dag-processor, triggerer and api-server, and two Celery workers.

The workers stand for two machines: each has its own working directory, TMPDIR, AIRFLOW_HOME and
task-log folder, and records its own hostname on the task instances it runs (``[core]
hostname_callable``). The source and destination are in S3, so a run whose mapped tasks are spread
over both workers shows that no stage hands anything over through a local disk."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from image_tfrecords.storage import Storage
from tests import stack_support
from tests.stack_support import POOL, Stack, _wait, airflow_env, ensure_debian_package, migrate
from tests.tf_reader import read_version
from tools import seaweedfs

postgres = stack_support.postgres  # the fixture (PostgreSQL of this module's own)

REDIS_SERVER = Path("/usr/bin/redis-server")
WORKERS = ("worker-a", "worker-b")
# The hostname a worker's task instances record: that worker's STACK_WORKER_NAME.
HOSTNAME_MODULE = '''import os


def hostname() -> str:
    return os.environ["STACK_WORKER_NAME"]
'''


def _redis_ping(port: int) -> bool:
    import redis

    try:
        return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=2).ping())
    except redis.RedisError:  # not listening yet
        return False


@pytest.fixture(scope="module")
def redis_broker() -> Iterator[str]:
    """Debian's redis-server of its own on 127.0.0.1 (no persistence); yields a broker URL."""
    ensure_debian_package("redis-server", REDIS_SERVER)
    base = Path(tempfile.mkdtemp(prefix="image-tfrecords-redis-"))
    port = seaweedfs.free_ports(1)[0]
    with open(base / "redis.log", "wb") as log:
        server = subprocess.Popen([str(REDIS_SERVER), "--bind", "127.0.0.1", "--port", str(port), "--dir", str(base),
                                   "--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "yes"],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def ready() -> bool:
            assert server.poll() is None, f"redis-server exited: {(base / 'redis.log').read_text(errors='replace')}"
            return _redis_ping(port)

        _wait(ready, 30, f"redis-server on port {port}")
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(base, ignore_errors=True)


def _upload(s3_server: seaweedfs.S3Server, bucket: str, sample_dir: Path, prefix: str) -> list[str]:
    """The sample images under s3://BUCKET/PREFIX/, one folder per class as on disk; their keys."""
    client, keys = s3_server.client(), []
    for path in sorted(p for p in sample_dir.rglob("*") if p.is_file()):
        key = f"{prefix}/{path.relative_to(sample_dir).as_posix()}"
        client.upload_file(str(path), bucket, key)
        keys.append(key)
    return keys


def _start_worker(stack: Stack, env: dict[str, str], base: Path, name: str) -> Path:
    """An `airflow celery worker` with a directory of its own as its cwd, TMPDIR, AIRFLOW_HOME and
    task-log folder, recording ``name`` as the hostname of the task instances it runs."""
    folder = base / name
    for sub in ("tmp", "home", "logs", "py"):
        (folder / sub).mkdir(parents=True)
    (folder / "py" / "stack_worker_hostname.py").write_text(HOSTNAME_MODULE)
    worker_env = {
        **env,
        "STACK_WORKER_NAME": name, "TMPDIR": str(folder / "tmp"),
        "PYTHONPATH": f"{env['PYTHONPATH']}{os.pathsep}{folder / 'py'}",
        "AIRFLOW_HOME": str(folder / "home"), "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(folder / "logs"),
        "AIRFLOW__CORE__HOSTNAME_CALLABLE": "stack_worker_hostname.hostname",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2", "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
    }
    # No log server: both workers are on this machine (one port), and their logs are read from disk.
    stack.spawn(name, ["celery", "worker", "--concurrency", "2", "--celery-hostname", f"{name}@%h",
                       "--skip-serve-logs", "--without-mingle", "--without-gossip"], env=worker_env, cwd=folder)
    return folder


def _task_log_tails(folders: list[Path], size: int = 1500, most: int = 6) -> dict[str, str]:
    """The tails of the newest task logs the workers wrote (a failed attempt's is among them)."""
    logs = sorted(((p, folder) for folder in folders for p in (folder / "logs").rglob("*.log")),
                  key=lambda pair: pair[0].stat().st_mtime)
    return {str(p.relative_to(folder.parent)): p.read_text(errors="replace")[-size:] for p, folder in logs[-most:]}


def test_celery_stack_spreads_mapped_tasks_over_two_workers(
    postgres: str, redis_broker: str, s3_server: seaweedfs.S3Server, bucket: str, s3_storage: Storage,
    sample_dir: Path, tmp_path: Path,
) -> None:
    started = time.monotonic()
    keys = _upload(s3_server, bucket, sample_dir, "incoming")
    api_port = seaweedfs.free_ports(1)[0]
    home = tmp_path / "airflow"
    (home / "logs").mkdir(parents=True)
    env = {
        # Parallelism above the workers' 2 x 2 slots: queued tasks wait in redis for whichever
        # worker is free, rather than in the scheduler. (The pool's 4 slots cap the mapped tasks.)
        **airflow_env(home, postgres, api_port, s3_server, "CeleryExecutor", parallelism=8, pool=POOL),
        "AIRFLOW__CELERY__BROKER_URL": redis_broker,
        "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + postgres.replace("postgresql+psycopg2://", "postgresql://"),
        "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",  # the scheduler sends and syncs in-process: no extra pool
        # No nightly run on unpausing (catchup is off, so there would be one): only the run below.
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
        "IMAGE_TFRECORDS_RETRY_DELAY_SECONDS": "5",
    }
    migrate(env, pool_slots=4, timeout=300)  # the project's setup, as in docker compose
    stack = Stack(env, api_port, home / "logs")
    folders: list[Path] = []
    try:
        folders = [_start_worker(stack, env, tmp_path / "workers", name) for name in WORKERS]
        stack.start()
        # Both workers consume before there is anything to take. Then the task instances of a
        # mapped task, queued together (up to the pool's 4 slots), go to both: a worker holds at
        # most concurrency x prefetch multiplier = 2 unfinished ones (Airflow acknowledges its
        # Celery tasks late, when they finish), and redis hands each message to the idle worker
        # that has waited longest (BRPOP serves blocked clients in turn).
        for name in WORKERS:
            log = home / "logs" / f"{name}.log"
            _wait(lambda log=log, name=name: stack.assert_running()
                  or (f"{name}@" in (text := log.read_text(errors="replace")) and " ready." in text),
                  120, f"celery worker {name} to be ready (its log: {log})")
        _wait(lambda: stack.assert_running() or stack.call("GET", "/dags/image_tfrecords"), 120,
              "the DAG to be parsed", interval=2)

        now = datetime.now(UTC).replace(microsecond=0)
        conf = {"source": f"s3://{bucket}/incoming", "destination": f"s3://{bucket}/datasets", "dataset": "celery",
                "shard_size_mb": 0.02, "chunk_files": 10}
        run = stack.call("POST", "/dags/image_tfrecords/dagRuns", {"logical_date": now.isoformat(), "conf": conf})
        stack.wait_run(run["dag_run_id"], timeout=150, watch=True)  # asserts success, with task states and log tails

        instances = stack.task_instances(run["dag_run_id"])
        by_task: dict[str, list[dict]] = {}
        for ti in instances:
            by_task.setdefault(ti["task_id"], []).append(ti)
        hosts = {task: sorted({ti["hostname"] for ti in tis}) for task, tis in by_task.items()}
        # Every task ran, on one of the Celery workers (none in the scheduler), but the gate's branches not
        # taken (the gate is off: no approval asked, nothing discarded).
        gated = {"approval", "discard_rejected"}
        assert {(ti["task_id"] in gated, ti["state"]) for ti in instances} == {(False, "success"), (True, "skipped")}, \
            [(t["task_id"], t["state"]) for t in instances]
        assert {ti["hostname"] for ti in instances if ti["task_id"] not in gated} <= set(WORKERS), hosts
        inspectors, writers = by_task["inspect_images"], by_task["write_shards"]
        chunks = -(-len(keys) // conf["chunk_files"])  # chunk_files per inspection task
        assert sorted(t["rendered_map_index"].split(" files")[0] for t in inspectors) == sorted(
            f"chunk {i}/{chunks} ({conf['chunk_files']}" for i in range(1, chunks + 1)), inspectors
        # The mapped tasks ran on both workers; split and validate then gathered what both staged.
        for task, tis in (("inspect_images", inspectors), ("write_shards", writers)):
            assert hosts[task] == list(WORKERS), f"{task} did not run on both workers: " + json.dumps(
                [(ti["rendered_map_index"], ti["hostname"]) for ti in tis])

        version_uri = f"s3://{bucket}/datasets/celery/{now.strftime('%Y%m%dT%H%M%SZ')}"
        manifest, splits = read_version(s3_storage, version_uri)
        assert manifest["num_records"] == len(keys) == sum(len(records) for records in splits.values())
        assert len(writers) == sum(len(s["shards"]) for s in manifest["splits"].values()) > 2
        assert sorted(r["image/filename"].decode() for records in splits.values() for r in records) == sorted(
            key.split("/", 1)[1] for key in keys)
    except BaseException:
        print(json.dumps({"component_logs": stack.tails(), "task_logs": _task_log_tails(folders)}, indent=1))
        raise
    finally:
        stack.stop()
    spread = {task: {name: [ti["hostname"] for ti in by_task[task]].count(name) for name in WORKERS}
              for task in ("inspect_images", "write_shards")}
    print(f"celery stack test wall time {time.monotonic() - started:.0f} s; mapped tasks per worker: "
          f"{json.dumps(spread)}; hosts per task: {json.dumps(hosts)}")
