"""Shared fixtures: a real SeaweedFS S3 server, a migrated Airflow home, sample images.

Set IMAGE_TFRECORDS_S3_ENDPOINT (and AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY) to run the S3
tests against an existing server such as MinIO from docker compose instead of SeaweedFS.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from image_tfrecords.images.sample import make_sample
from image_tfrecords.storage import Storage
from tools import seaweedfs

ROOT = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
# The modules that take a minute or more, slowest first (`--durations` of a full run). `make test`
# deals whole modules to two processes in collection order, so these start first and the short
# ones fill in around them, instead of one long module starting last on one process.
SLOW_MODULES = ("test_stack", "test_dag_e2e", "test_readers_from_pip", "test_faults", "test_bench_smoke",
                "test_stack_celery", "test_incremental", "test_browser", "test_trigger_form", "test_publish_gate_dag",
                "test_demo")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The slow modules first (see SLOW_MODULES); the order within a module, and of the rest, is kept."""
    rank = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[seaweedfs.S3Server]:
    server = seaweedfs.existing()
    if server is not None:
        yield server
        return
    server = seaweedfs.start(str(tmp_path_factory.mktemp("seaweedfs")))
    try:
        yield server
    finally:
        seaweedfs.stop(server)


@pytest.fixture
def bucket(s3_server: seaweedfs.S3Server) -> str:
    """A new, empty bucket for one test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name


@pytest.fixture
def s3_env(s3_server: seaweedfs.S3Server, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """boto3's standard environment pointed at the test server."""
    env = s3_server.env()
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


@pytest.fixture
def s3_storage(s3_env: dict[str, str]) -> Storage:
    return Storage()


@pytest.fixture(scope="session")
def sample_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """60 generated images in three class folders (read-only: copy before changing)."""
    path = tmp_path_factory.mktemp("sample")
    make_sample(str(path), per_class=20)
    return path


@pytest.fixture(scope="session")
def airflow_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for `airflow` commands on a freshly migrated SQLite AIRFLOW_HOME."""
    home = tmp_path_factory.mktemp("airflow_home")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "false",
        "PYTHONPATH": str(ROOT),
    }
    subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=300)
    return env
