"""The environment Airflow runs with against this repository, and its database migration.

What tools/demo.py (``airflow dags test``), tools/ui.py (``airflow standalone``) and tools/airflow_stack.py
(scheduler, dag-processor, triggerer and api-server on PostgreSQL) share: AIRFLOW_HOME, the project's
dags/ and plugins/, no example DAGs, the project importable and ``aws_default`` on an S3 server. What
differs between them (database, executor, auth, pool, which inherited variables to drop) are arguments.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from tools.seaweedfs import S3Server

ROOT = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
POOL = "image_tfrecords"  # the shard writers' pool (docker compose's airflow-init creates it too)
POOL_ENV = "IMAGE_TFRECORDS_POOL"  # where the DAG reads its pool's name
CLEAN = ("AIRFLOW", "AWS_")  # what another Airflow's or S3's settings in the caller's environment start with


def environment(home: Path, s3: S3Server | str | None = None, *, database: str | None = None,
                executor: str | None = None, parallelism: int | None = None, all_admins: bool = False,
                unit_test_mode: bool | None = None, pool: str | None = None,
                inherit: Mapping[str, str] | None = None, drop: tuple[str, ...] = CLEAN) -> dict[str, str]:
    """Environment variables for ``airflow`` commands with AIRFLOW_HOME ``home`` and this project's DAGs.

    ``inherit`` (default: this process's environment) less its variables starting with one of ``drop``;
    ``s3``: ``aws_default`` on that server (or that connection, a URI or JSON); ``database``: a SQLAlchemy
    URL (default: SQLite in ``home``); ``executor``, ``parallelism``: [core] settings (default: Airflow's);
    ``all_admins``: the simple auth manager lets everyone in as admin; ``unit_test_mode``: [core]
    unit_test_mode; ``pool``: the pool the DAG's shard writers use (``migrate`` can create it).
    """
    env = {k: v for k, v in (os.environ if inherit is None else inherit).items() if not k.startswith(drop)}
    env.update({
        "AIRFLOW_HOME": str(home), "PYTHONPATH": str(ROOT),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"), "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
    })
    settings = {
        "AIRFLOW_CONN_AWS_DEFAULT": s3.airflow_connection() if isinstance(s3, S3Server) else s3,
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": database, "AIRFLOW__CORE__EXECUTOR": executor,
        "AIRFLOW__CORE__PARALLELISM": None if parallelism is None else str(parallelism),
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True" if all_admins else None,
        "AIRFLOW__CORE__UNIT_TEST_MODE": None if unit_test_mode is None else str(unit_test_mode).lower(),
        POOL_ENV: pool,
    }
    env.update({k: v for k, v in settings.items() if v is not None})
    return env


def migrate(env: Mapping[str, str], *, pool_slots: int = 0, timeout: float | None = 600, quiet: bool = True) -> None:
    """``airflow db migrate`` with ``env``, then with ``pool_slots`` the pool ``env`` names (IMAGE_TFRECORDS_POOL)
    with that many slots; CalledProcessError if a command fails. ``quiet``: output captured, else stdout
    discarded and stderr shown."""
    stdout, stderr = (subprocess.PIPE, subprocess.PIPE) if quiet else (subprocess.DEVNULL, None)
    commands = [["db", "migrate"]]
    if pool_slots:
        commands.append(["pools", "set", env[POOL_ENV], str(pool_slots), f"{env[POOL_ENV]} shard writing"])
    for command in commands:
        subprocess.run([AIRFLOW, *command], env=env, check=True, timeout=timeout, stdout=stdout, stderr=stderr)
