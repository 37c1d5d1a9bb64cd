"""The version lock: one owner at a time, leases that expire, dead local holders taken over; local and S3."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from image_tfrecords.published import locking
from image_tfrecords.storage import Storage, join


def _staging(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Storage, str]:
    if kind == "local":
        return Storage(), str(tmp_path / "d" / "_staging" / "v1")
    request.getfixturevalue("s3_env")
    return Storage(), f"s3://{request.getfixturevalue('bucket')}/out/d/_staging/v1"


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_one_owner_at_a_time(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    storage, staging = _staging(kind, tmp_path, request)
    first = locking.hold(storage, staging, "run-a", 600)
    assert first["owner"] == "run-a" and locking.read_lock(storage, staging)["owner"] == "run-a"
    with pytest.raises(locking.LockHeld, match="run-a"):
        locking.hold(storage, staging, "run-b", 600)
    assert locking.hold(storage, staging, "run-a", 600)["expires"] == first["expires"]  # fresh: not rewritten
    locking.release(storage, staging, "run-b")  # not the owner: nothing happens
    assert locking.read_lock(storage, staging)["owner"] == "run-a"
    locking.release(storage, staging, "run-a")
    assert locking.read_lock(storage, staging) is None
    assert locking.hold(storage, staging, "run-b", 600)["owner"] == "run-b"


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_an_expired_lease_is_taken_over(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    storage, staging = _staging(kind, tmp_path, request)
    locking.hold(storage, staging, "run-a", 0.5)
    with pytest.raises(locking.LockHeld):
        locking.hold(storage, staging, "run-b", 600)
    time.sleep(0.6)
    assert locking.hold(storage, staging, "run-b", 600)["owner"] == "run-b"


def test_a_dead_local_process_lock_is_taken_over_but_not_a_dag_runs(tmp_path: Path) -> None:
    storage, staging = Storage(), str(tmp_path / "_staging" / "v1")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    record = locking.hold(storage, staging, "cli:other", 600, pid_bound=True)
    Path(locking.lock_uri(staging)).write_text(json.dumps({**record, "pid": dead_pid}))
    assert locking.hold(storage, staging, "cli:me", 600)["owner"] == "cli:me"
    Path(locking.lock_uri(staging)).write_text(json.dumps({**record, "owner": "airflow:run", "pid": dead_pid,
                                                           "pid_bound": False}))
    with pytest.raises(locking.LockHeld, match="airflow:run"):  # a DAG run's tasks come and go: the lease rules
        locking.hold(storage, staging, "cli:me", 600)


def test_a_damaged_lock_is_replaced(tmp_path: Path) -> None:
    storage, staging = Storage(), str(tmp_path / "_staging" / "v1")
    Path(staging).mkdir(parents=True)
    Path(join(staging, locking.LOCK_FILE)).write_text("{not json")
    assert locking.hold(storage, staging, "run-a", 600)["owner"] == "run-a"


def test_lease_keeper_renews_and_releases(tmp_path: Path) -> None:
    storage, staging = Storage(), str(tmp_path / "_staging" / "v1")
    with locking.LeaseKeeper(storage, staging, lease_seconds=0.6) as keeper:
        first = locking.read_lock(storage, staging)["expires"]
        time.sleep(1.0)
        assert locking.read_lock(storage, staging)["expires"] > first  # renewed: the lease outlived 0.6 s
        with pytest.raises(locking.LockHeld):
            locking.hold(storage, staging, "other", 600)
        assert keeper.lost is None
    assert locking.read_lock(storage, staging) is None
