"""The Airflow side's one way to reach S3: a boto3 client from the ``aws_default`` connection.

The DAG's tasks, the consumer DAG and the datasets page all use ``airflow_storage()``. Airflow puts
this folder on ``sys.path`` (``[core] plugins_folder``), so they import it as ``image_tfrecords_aws``;
import it inside functions, where Airflow has set that up. Not a plugin itself: it defines no
``AirflowPlugin``, and Airflow imports every ``.py`` here harmlessly.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from image_tfrecords.storage import Storage

AWS_CONN_ID = "aws_default"
CLIENT_TTL_SECONDS = 300.0
_cache: dict[str, tuple[float, Any]] = {}
_lock = threading.Lock()


def s3_client(conn_id: str = AWS_CONN_ID) -> Any:
    """A boto3 S3 client from the Airflow connection ``conn_id`` (endpoint, credentials, addressing).

    Reused for a few minutes within one process: creating it costs about half a second (boto3 loads
    its service model each time), which adds up when tasks share a process (``airflow dags test``).
    Each task of a real deployment runs in a process of its own, so it sees connection changes.
    """
    from airflow.providers.amazon.aws.hooks.s3 import S3Hook

    with _lock:
        created, client = _cache.get(conn_id, (0.0, None))
        if client is None or time.monotonic() - created > CLIENT_TTL_SECONDS:
            client = S3Hook(aws_conn_id=conn_id).get_conn()
            _cache[conn_id] = (time.monotonic(), client)
        return client


def airflow_storage() -> Storage:
    """A Storage for local paths and ``s3://`` URIs whose S3 client comes from ``aws_default``."""
    return Storage(s3_client)
