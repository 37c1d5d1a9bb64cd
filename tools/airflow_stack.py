"""A stack of Airflow components on this machine, without Docker: a PostgreSQL server of its own
(Debian's package), the Airflow environment (over ``tools.airflow_env``), and the components as
processes stopped by PID (process group), driven through the REST API. Used by the stack tests
(``tests/stack_support.py``) and by ``make bench`` (the DAG on a real scheduler)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tools import seaweedfs
from tools.airflow_env import AIRFLOW, environment

PG_BIN = Path("/usr/lib/postgresql/15/bin")


def ensure_debian_package(package: str, present: Path) -> None:
    """Install a Debian package (apt-get) unless ``present`` exists already."""
    if present.exists():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", package], check=True,
                   env=env, capture_output=True, timeout=900)


def _ensure_postgres() -> None:
    ensure_debian_package("postgresql-15", PG_BIN / "postgres")


@contextmanager
def postgres_server() -> Iterator[str]:
    """A PostgreSQL server of its own on 127.0.0.1 (Debian's package); yields a SQLAlchemy URL."""
    _ensure_postgres()
    base = Path(tempfile.mkdtemp(prefix="image-tfrecords-pg-"))
    user = {"user": "postgres", "group": "postgres"} if os.geteuid() == 0 else {}
    if user:
        shutil.chown(base, "postgres", "postgres")
    data, port = base / "data", seaweedfs.free_ports(1)[0]
    subprocess.run([str(PG_BIN / "initdb"), "-D", str(data), "-U", "airflow", "-A", "trust", "-E", "UTF8",
                    "--no-sync"], check=True, capture_output=True, timeout=120, **user)
    with open(base / "postgres.log", "wb") as log:
        server = subprocess.Popen([str(PG_BIN / "postgres"), "-D", str(data), "-p", str(port), "-k", str(base),
                                   "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "max_connections=200"],
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True, **user)
    try:
        wait_for(lambda: subprocess.run([str(PG_BIN / "pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                                     capture_output=True).returncode == 0, 60, "PostgreSQL")
        subprocess.run([str(PG_BIN / "createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "airflow", "airflow"],
                       check=True, capture_output=True, timeout=60)
        yield f"postgresql+psycopg2://airflow@127.0.0.1:{port}/airflow"
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        shutil.rmtree(base, ignore_errors=True)


def wait_for(predicate, timeout: float, what: str, interval: float = 0.5) -> Any:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until it returns something true (OSError counts as not yet); AssertionError on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            result = predicate()
        except OSError:
            result = None
        if result:
            return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def airflow_env(home: Path, postgres: str, api_port: int, s3_server: seaweedfs.S3Server, executor: str,
                parallelism: int = 4, pool: str | None = None) -> dict[str, str]:
    """The environment every Airflow component of a stack test runs with (this process's, without
    its AIRFLOW* and AWS_* variables): the project's DAG and plugins, the PostgreSQL database,
    the execution API on the api-server, all-admins auth, ``aws_default`` on the S3 server, and
    ``pool`` (if given) for the shard writers."""
    return {
        **environment(home, s3_server, database=postgres, executor=executor, parallelism=parallelism,
                      all_admins=True, pool=pool),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{api_port}/execution/",
        "AIRFLOW__API_AUTH__JWT_SECRET": "stack-test",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False", "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",  # as docker-compose.yaml sets it (a task's end seen sooner)
    }


class Stack:
    """Airflow components as processes of their own, stopped by PID (process group)."""

    COMPONENTS = (["scheduler"], ["dag-processor"], ["triggerer"])

    def __init__(self, env: dict[str, str], api_port: int, logs: Path) -> None:
        self.env, self.api, self.logs = env, f"http://127.0.0.1:{api_port}", logs
        self.processes: list[subprocess.Popen[bytes]] = []
        self.token = ""

    def spawn(self, name: str, command: list[str], env: dict[str, str] | None = None,
              cwd: Path | None = None) -> subprocess.Popen[bytes]:
        """Start ``airflow COMMAND...`` in a session of its own, its output in ``LOGS/NAME.log``."""
        with open(self.logs / f"{name}.log", "wb") as log:
            process = subprocess.Popen([AIRFLOW, *command], env=self.env if env is None else env, cwd=cwd,
                                       stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def start(self) -> None:
        for command in (*self.COMPONENTS, ["api-server", "--host", "127.0.0.1", "--port", self.api.rsplit(":", 1)[1]]):
            self.spawn(command[0], command)
        wait_for(lambda: urllib.request.urlopen(f"{self.api}/api/v2/monitor/health", timeout=5).status == 200, 180,
              "the api-server")
        with urllib.request.urlopen(f"{self.api}/auth/token", timeout=10) as response:  # all-admins mode
            self.token = json.loads(response.read())["access_token"]

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(f"{self.api}/api/v2{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Authorization": f"Bearer {self.token}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read() or b"null")

    def assert_running(self) -> bool:
        """Fail at once, naming it, when a component has exited; else False (for ``_wait`` predicates)."""
        for process in self.processes:
            if process.poll() is not None:
                name = " ".join(process.args[1:3])
                raise AssertionError(f"`airflow {name}` exited with {process.returncode}: "
                                     + json.dumps(self.tails(), indent=1)[-6000:])
        return False

    def wait_run(self, run_id: str, timeout: float = 300, watch: bool = False) -> dict:
        """Wait for a run to finish and assert it succeeded; ``watch``: fail as soon as a component exits."""
        quoted = urllib.request.quote(run_id, safe="")

        def finished() -> dict | None:
            if watch:
                self.assert_running()
            run = self.call("GET", f"/dags/image_tfrecords/dagRuns/{quoted}")
            return run if run["state"] in ("success", "failed") else None

        run = wait_for(finished, timeout, f"run {run_id}", interval=2)
        assert run["state"] == "success", self.diagnose(run_id)
        return run

    def task_instances(self, run_id: str) -> list[dict]:
        quoted = urllib.request.quote(run_id, safe="")
        return self.call("GET", f"/dags/image_tfrecords/dagRuns/{quoted}/taskInstances?limit=1000")["task_instances"]

    def tails(self, size: int = 1500) -> dict[str, str]:
        """The last ``size`` characters of each component's log."""
        return {p.name: p.read_text(errors="replace")[-size:] for p in sorted(self.logs.glob("*.log"))}

    def diagnose(self, run_id: str) -> str:
        states = [(t["task_id"], t["map_index"], t["state"]) for t in self.task_instances(run_id)]
        return json.dumps({"task_states": states, "logs": self.tails()}, indent=1)[-8000:]


def xcom_sizes(database: str) -> list[tuple[str, int, int]]:
    """(task_id, map_index, bytes) of every XCom in the stack's PostgreSQL database."""
    import psycopg2

    with psycopg2.connect(database.replace("postgresql+psycopg2://", "postgresql://")) as db, db.cursor() as cursor:
        cursor.execute("SELECT task_id, map_index, length(value::text) FROM xcom")
        return [(task, index, size or 0) for task, index, size in cursor.fetchall()]
