"""What the stack tests (tests/airflow/test_stack.py, tests/airflow/test_stack_celery.py) share: a PostgreSQL server of
their own (a fixture over ``tools.airflow_stack``, which ``make bench`` uses too), bounded waiting, the
Airflow environment and its migration (``tools.airflow_env``), and the Airflow components as processes
stopped by PID, driven through the REST API."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tools.airflow_env import AIRFLOW, POOL, ROOT, migrate  # noqa: F401 - re-exported for the stack tests
from tools.airflow_stack import (  # noqa: F401 - re-exported for the stack tests
    PG_BIN,
    Stack,
    airflow_env,
    ensure_debian_package,
    postgres_server,
    wait_for,
)

_wait = wait_for


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A PostgreSQL server of its own on 127.0.0.1 (Debian's package); yields a SQLAlchemy URL."""
    with postgres_server() as url:
        yield url
