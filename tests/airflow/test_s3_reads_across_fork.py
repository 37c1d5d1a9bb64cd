"""DAG tasks read S3 through the S3 client of the ``aws_default`` connection (``airflow_glue.s3_client``) in
the task's process and in the process pool it forks (``parallel.task_pool``), as inspect and write do.

Objects are uploaded as users upload them (boto3's ``upload_file``, its default CRC32 checksum), so every GET
is checked by botocore against the checksum S3 stored. Issue 48: a client made before the fork carried its
pooled connections into the workers, two processes read answers off one socket, and tasks failed with
``FlexibleChecksumError`` (or took mixed bytes) where the command line never did.
"""

from __future__ import annotations

import hashlib
import os
import random
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from image_tfrecords import airflow_glue
from image_tfrecords.parallel import batched_map, ordered_map, task_pool
from image_tfrecords.storage import Storage
from tools.seaweedfs import S3Server

OBJECTS = 400  # enough reads in two workers and the parent at once to hit a shared connection every time


@pytest.fixture
def connection(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The ``aws_default`` connection pointed at the test server (inside Airflow, S3 settings come only from it)."""
    monkeypatch.setenv("AIRFLOW_CONN_AWS_DEFAULT", s3_server.airflow_connection())
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("IMAGE_TFRECORDS_TASK_PROCESSES", "2")
    airflow_glue._cache.clear()
    yield
    airflow_glue._cache.clear()


@pytest.fixture
def uploaded(s3_server: S3Server, bucket: str) -> dict[str, str]:
    """OBJECTS objects of 20-200 kB uploaded with boto3's ``upload_file`` (default checksums); key -> SHA-256."""
    client, rng, digests = s3_server.client(), random.Random(48), {}
    with tempfile.TemporaryDirectory() as folder:
        for number in range(OBJECTS):
            data = rng.randbytes(rng.randint(20_000, 200_000))
            path = Path(folder) / "object"
            path.write_bytes(data)
            key = f"images/class_{number % 3}/{number:04d}.bin"
            client.upload_file(str(path), bucket, key)
            digests[key] = hashlib.sha256(data).hexdigest()
    return digests


def _digest(job: tuple[Storage, str, str]) -> tuple[str, str, int]:
    """In a pool worker: the object's SHA-256 as read, or the error (its type and message), and the reader's pid."""
    storage, source, key = job
    try:
        with storage.open_source(source, key) as (body, _):
            return key, hashlib.sha256(body.read()).hexdigest(), os.getpid()
    except Exception as exc:  # reported, so that the test names every object that failed
        return key, f"{type(exc).__name__}: {exc}", os.getpid()


def _digest_in_worker(job: tuple[Storage, str, str]) -> tuple[str, str, int]:
    """``_digest`` in a pool worker that cannot look the connection up (in a task, asking Airflow would go over
    the socket the task's process shares with its supervisor): it must use what the parent resolved."""
    os.environ.pop("AIRFLOW_CONN_AWS_DEFAULT", None)
    return _digest(job)


def test_task_pool_workers_read_s3_objects_intact(connection: None, uploaded: dict[str, str], bucket: str) -> None:
    storage = airflow_glue.airflow_storage()
    source = f"s3://{bucket}/images"
    keys = sorted(key.removeprefix("images/") for key in uploaded)
    results = []
    for task in range(3):  # three tasks' pools, as a run's inspect and write tasks make them
        # The task's process uses its client before it forks (inspect reads chunks.json, write the plan; reads
        # on threads leave several connections in its pool) ...
        assert len(list(ordered_map(lambda key: _digest((storage, source, key)), keys[:16], 8))) == 16
        with task_pool(len(keys)) as pool:
            assert pool is not None, "a task with this many images forks a pool"
            jobs = ((storage, source, key) for key in keys[task::3])
            for done, result in enumerate(batched_map(_digest_in_worker, jobs, pool, workers=2, batch=4), 1):
                results.append(result)
                # ... and goes on using it while the workers read (inspect streams its rows, write its members)
                if done % 20 == 0:
                    key = keys[-done]
                    assert _digest((storage, source, key))[1] == uploaded[f"images/{key}"], key
    wrong = {key: got for key, got, _ in results if got != uploaded[f"images/{key}"]}
    assert not wrong, f"{len(wrong)} of {OBJECTS} objects read wrong in the pools: {dict(list(wrong.items())[:5])}"
    assert len(results) == OBJECTS and len({pid for *_, pid in results} - {os.getpid()}) == 6, "every worker read"
