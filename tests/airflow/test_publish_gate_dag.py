"""The DAG's publish gate under `airflow dags test`, answered by a person through Airflow's REST API.

Version v1 of a source is published with the command line; 14 of its 20 circles then vanish, so the DAG's
build of v2 trips the gate (circles' share: 33% -> 13%). With the `approval` param, the `approval` task
(the standard provider's human-in-the-loop operator) waits in `awaiting_input`; `dags test` keeps the run
alive until a response is recorded from outside. The test answers it as the UI's Required Actions page does:
a PATCH of the task's `hitlDetails` on an `airflow api-server` sharing the run's database. Approve publishes
v2 (its manifest says who approved); Reject discards the build (nothing published, no staging left).
Without `approval`, the gate task fails the run with the report in its log, and releases the version's lock, so
that a new run with `accept_gate` publishes the kept build.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

import pytest

from image_tfrecords.published.locking import read_lock
from image_tfrecords.storage import Storage
from tests.support import run_cli
from tools import seaweedfs
from tools.airflow_stack import Stack, wait_for

AIRFLOW = str(Path(sys.executable).with_name("airflow"))


class ApiServer(Stack):
    """Only Airflow's api-server (the UI's and the REST API's backend), on the tests' SQLite database."""

    COMPONENTS = ()


@pytest.fixture(scope="module")
def api(airflow_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ApiServer]:
    port = seaweedfs.free_ports(1)[0]
    env = {**airflow_env, "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
           "AIRFLOW__API_AUTH__JWT_SECRET": "publish-gate-test"}
    server = ApiServer(env, port, tmp_path_factory.mktemp("api-server"))
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def published_v1(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A destination holding dataset d, version v1, of the sample (20 images in each of 3 classes)."""
    dest = tmp_path_factory.mktemp("gate") / "out"
    result = run_cli("build", "--source", str(sample_dir), "--destination", str(dest), "--dataset", "d",
                     "--version", "v1", "--workers", "2", "--no-progress")
    assert result.returncode == 0, result.stderr
    return dest


@pytest.fixture
def shifted(sample_dir: Path, published_v1: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(source, destination): v1 published from the sample; the source has lost 14 of its 20 circles."""
    src, dest = tmp_path / "src", tmp_path / "out"
    shutil.copytree(sample_dir, src)
    shutil.copytree(published_v1, dest)
    for path in sorted((src / "circles").iterdir())[:14]:
        path.unlink()
    return src, dest


def start_dags_test(airflow_env: dict[str, str], logical_date: str, conf: dict, log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([AIRFLOW, "dags", "test", "image_tfrecords", logical_date, "-c", json.dumps(conf)],
                                env=airflow_env, stdout=out, stderr=subprocess.STDOUT)


def finish(process: subprocess.Popen, log: Path, timeout: float = 600) -> tuple[int, str]:
    try:
        process.wait(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return process.returncode, log.read_text(errors="replace")


def awaiting(api: ApiServer, process: subprocess.Popen, log: Path) -> dict:
    """The approval waiting for an answer (its HITL detail), once the run has reached it."""
    def pending() -> dict | None:
        if process.poll() is not None:
            raise AssertionError("`airflow dags test` ended before asking: " + log.read_text(errors="replace")[-6000:])
        details = api.call("GET", "/dags/image_tfrecords/dagRuns/~/hitlDetails?limit=100")["hitl_details"]
        waiting = [d for d in details if not d["response_received"]
                   and d["task_instance"]["state"] == "awaiting_input"]
        return waiting[0] if waiting else None

    return wait_for(pending, 480, "the approval task to ask", interval=2)


def answer(api: ApiServer, detail: dict, option: str) -> dict:
    """Answer ``option`` as the UI's Required Actions page does (PATCH of the task's hitlDetails)."""
    ti = detail["task_instance"]
    run = urllib.parse.quote(ti["dag_run_id"], safe="")
    return api.call("PATCH", f"/dags/image_tfrecords/dagRuns/{run}/taskInstances/{ti['task_id']}/"
                             f"{ti['map_index']}/hitlDetails", {"chosen_options": [option]})


def manifest(dest: Path, version: str) -> dict:
    return json.loads((dest / "d" / version / "manifest.json").read_text())


def latest(dest: Path) -> str:
    return json.loads((dest / "d" / "latest.json").read_text())["version"]


def conf(src: Path, dest: Path, **extra: object) -> dict:
    return {"source": str(src), "destination": str(dest), "dataset": "d", "version": "v2", "gate": True, **extra}


def test_an_approved_build_is_published(airflow_env: dict[str, str], api: ApiServer, shifted: tuple[Path, Path],
                                        tmp_path: Path) -> None:
    src, dest = shifted
    log = tmp_path / "dags-test.log"
    process = start_dags_test(airflow_env, "2026-11-10T00:00:00+00:00", conf(src, dest, approval=True), log)
    try:
        detail = awaiting(api, process, log)
        assert detail["task_instance"]["task_id"] == "approval"
        assert detail["options"] == ["Approve", "Reject"] and detail["defaults"] == ["Reject"]
        assert detail["params"] == {}  # the DAG's params are not a form to fill in here
        assert detail["subject"] == "Publish d version v2? Its publish gate tripped"
        assert "publish gate: tripped 3 of 6 checks against v1 (class share: circles" in detail["body"]
        assert "33.3% -> 13.0%" in detail["body"]
        assert not (dest / "d" / "v2").exists()  # nothing is published while it waits
        who = answer(api, detail, "Approve")["responded_by"]["name"]
    finally:
        code, output = finish(process, log)
    assert code == 0, output[-8000:]
    assert "[DAG TEST] starting task_id=discard_rejected" not in output
    gate = manifest(dest, "v2")["build"]["gate"]
    assert (gate["verdict"], gate["approved_by"]) == ("approved", who) and who
    assert "class share: circles" in gate["tripped"]
    assert f"published because {who} approved it in the Airflow UI" in (dest / "d" / "v2" / "card.md").read_text()
    assert latest(dest) == "v2" and not (dest / "d" / "_staging").exists()


def test_a_rejected_build_is_discarded(airflow_env: dict[str, str], api: ApiServer, shifted: tuple[Path, Path],
                                       tmp_path: Path) -> None:
    src, dest = shifted
    log = tmp_path / "dags-test.log"
    process = start_dags_test(airflow_env, "2026-11-11T00:00:00+00:00", conf(src, dest, approval=True), log)
    try:
        detail = awaiting(api, process, log)
        assert (dest / "d" / "_staging" / "v2" / "gate.json").exists()
        answer(api, detail, "Reject")
    finally:
        code, output = finish(process, log)
    assert code == 0, output[-8000:]  # a rejection is an answer, not a failure
    assert "[DAG TEST] starting task_id=discard_rejected" in output
    assert "[DAG TEST] starting task_id=publish " not in output
    assert not (dest / "d" / "v2").exists() and latest(dest) == "v1"
    assert not (dest / "d" / "_staging").exists(), "the rejected build's staging is discarded"


def test_without_approval_a_tripped_gate_fails_the_run_until_a_run_accepts_it(
        airflow_env: dict[str, str], shifted: tuple[Path, Path], tmp_path: Path) -> None:
    src, dest = shifted
    log = tmp_path / "dags-test.log"
    code, output = finish(start_dags_test(airflow_env, "2026-11-12T00:00:00+00:00", conf(src, dest), log), log)
    assert code != 0
    assert "publish gate: tripped 3 of 6 checks against v1" in output and "set the approval param" in output
    assert "33.3% -> 13.0%" in output  # the report, in the task's log
    assert "up_for_retry" not in output  # retrying cannot untrip it
    assert "[DAG TEST] starting task_id=approval" not in output
    assert not (dest / "d" / "v2").exists() and latest(dest) == "v1"
    staging = dest / "d" / "_staging" / "v2"
    assert (staging / "gate.json").exists() and read_lock(Storage(), str(staging)) is None  # kept, and free

    log = tmp_path / "accepted.log"  # a new run of the version with accept_gate publishes the kept build
    code, output = finish(start_dags_test(airflow_env, "2026-11-13T00:00:00+00:00",
                                          conf(src, dest, accept_gate=True), log), log)
    assert code == 0, output[-8000:]
    assert "-- accepted (accept_gate): it is published anyway" in output
    assert manifest(dest, "v2")["build"]["gate"]["verdict"] == "accepted" and latest(dest) == "v2"
    assert manifest(dest, "v2")["build"]["shards_written"] == 0  # the kept staging's shards were reused
