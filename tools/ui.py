"""`make ui`: the Airflow UI with this DAG and the datasets page, without Docker.

Starts a local S3 server (SeaweedFS, or the one ``IMAGE_TFRECORDS_S3_ENDPOINT`` names) and
``airflow standalone`` (scheduler, DAG processor, triggerer and api-server on SQLite) with
``dags_folder`` at dags/, ``plugins_folder`` at plugins/ and the ``aws_default`` connection pointed at
that server; the trigger form's defaults read sample images from .ui/sample and publish to
``s3://datasets/image-tfrecords``. The sample images are dated a week back (``write_sample``), so that the
scheduled run that unpausing the DAG starts sees them too. Prints the URL and how to log in, then runs until Ctrl-C (or
SIGTERM), when it stops everything it started (by process group) and keeps .ui/ for next time.

The api-server listens on 127.0.0.1 only; Airflow's log servers (scheduler, triggerer) bind every
interface and cannot be told otherwise in Airflow 3.3, so they get free ports of their own.

``--check`` starts it all, checks that the api-server answers, lists the DAG and serves the datasets
page, and stops: what ``tests/airflow/test_ui.py`` runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from image_tfrecords.images.sample import make_sample  # noqa: E402 - the project root is importable only now
from tools import airflow_env, seaweedfs  # noqa: E402
from tools.airflow_env import AIRFLOW  # noqa: E402

BUCKET = "datasets"
START_SECONDS = 240.0
SAMPLE_AGE_SECONDS = 7 * 24 * 3600.0


def _step(message: str) -> None:
    print(f"==> {message}", flush=True)


def write_sample(sample: Path) -> None:
    """The sample images (20 per class), modified a week ago. The trigger form's "Unpause" box is ticked, and
    unpausing makes the scheduler start the latest nightly run (02:00 UTC today or yesterday); a scheduled run
    sees only the files modified before its logical date, so with files written a minute ago that run would
    find no image and fail."""
    make_sample(str(sample), per_class=20)
    then = time.time() - SAMPLE_AGE_SECONDS
    for path in sample.rglob("*"):
        os.utime(path, (then, then))


def environment(work: Path, server: seaweedfs.S3Server, ports: list[int]) -> dict[str, str]:
    """What ``airflow standalone`` runs with: this project's DAGs and plugins, the S3 connection, and free
    ports for the log servers (so that it runs beside another Airflow on this machine)."""
    port, worker_logs, trigger_logs = ports
    return {
        **airflow_env.environment(work / "airflow", server),  # SQLite; standalone migrates it
        "AIRFLOW__API__PORT": str(port), "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(worker_logs),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(trigger_logs),
        "IMAGE_TFRECORDS_SOURCE": str(work / "sample"),
        "IMAGE_TFRECORDS_DESTINATION": f"s3://{BUCKET}/image-tfrecords",
        "PATH": os.pathsep.join([str(Path(AIRFLOW).parent), os.environ.get("PATH", "")]),  # standalone runs "airflow"
    }


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def _password(home: Path) -> str | None:
    """The admin password ``airflow standalone`` generated (simple auth manager)."""
    path = home / "simple_auth_manager_passwords.json.generated"
    try:
        return json.loads(path.read_text()).get("admin")
    except (OSError, ValueError):
        return None


def _token(api: str, password: str) -> str:
    request = urllib.request.Request(f"{api}/auth/token", method="POST",
                                     data=json.dumps({"username": "admin", "password": password}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:  # a busy api-server takes its time
        return json.loads(response.read())["access_token"]


def _get(url: str, token: str) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, response.read()


def check(api: str, home: Path) -> None:
    """The DAG is listed (parsed without import errors) and the datasets page answers; AssertionError if not."""
    password = _password(home)
    assert password, f"no generated admin password in {home}"
    token = _token(api, password)
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        _, body = _get(f"{api}/api/v2/dags?dag_id_pattern=image_tfrecords", token)
        if {d["dag_id"] for d in json.loads(body)["dags"]} >= {"image_tfrecords", "image_tfrecords_consumer"}:
            break
        time.sleep(2)
    else:
        raise AssertionError("the api-server does not list the image_tfrecords DAGs")
    _, body = _get(f"{api}/api/v2/importErrors", token)
    assert json.loads(body)["total_entries"] == 0, body[:2000]
    status, page = _get(f"{api}/image-tfrecords/", token)
    assert status == 200 and b"TFRecord datasets" in page, page[:500]


def _stop_group(process: subprocess.Popen[bytes], grace: float = 30.0) -> None:
    """SIGTERM the process group ``process`` leads, wait until every member has exited (the scheduler and
    the triggerer outlive ``airflow standalone`` by a few seconds), SIGKILL whatever is left after ``grace``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        process.poll()
        try:
            os.killpg(process.pid, 0)  # anyone left in the group?
        except ProcessLookupError:
            return
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="start, check the DAG and the page, stop")
    parser.add_argument("--work", default=str(ROOT / ".ui"), help="its folder (default: .ui)")
    args = parser.parse_args(argv)
    work = Path(args.work)
    sample = work / "sample"
    if not sample.exists():
        _step(f"writing sample images to {sample}")
        write_sample(sample)
    server, started_server = seaweedfs.existing(), False
    if server is None:
        _step("starting SeaweedFS (S3) on 127.0.0.1")
        server, started_server = seaweedfs.start(str(work / "s3")), True
    airflow = None
    try:
        server.create_bucket(BUCKET)
        ports = seaweedfs.free_ports(3)
        port, env = ports[0], environment(work, server, ports)
        api = f"http://127.0.0.1:{port}"
        _step(f"starting airflow standalone (AIRFLOW_HOME {work / 'airflow'}); its log: {work / 'standalone.log'}")
        with open(work / "standalone.log", "ab") as log:  # the child keeps its own descriptor
            airflow = subprocess.Popen([AIRFLOW, "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        deadline = time.monotonic() + START_SECONDS
        while not _answers(f"{api}/api/v2/monitor/health"):
            if airflow.poll() is not None or time.monotonic() > deadline:
                print(f"airflow standalone did not start; see {work / 'standalone.log'}", file=sys.stderr)
                return 1
            time.sleep(1)
        home = Path(env["AIRFLOW_HOME"])
        if args.check:
            check(api, home)
            _step("the DAGs are listed and the datasets page answers")
            return 0
        print(f"\nAirflow UI: {api}  (user admin, password {_password(home)};"
              f" also in {home / 'simple_auth_manager_passwords.json.generated'})")
        print(f"Datasets page: {api}/image-tfrecords/   S3 endpoint: {server.endpoint}")
        print("Trigger image_tfrecords from the UI; Ctrl-C stops everything.\n", flush=True)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with contextlib.suppress(KeyboardInterrupt):
            airflow.wait()
        return 0
    finally:
        if airflow is not None:
            _step("stopping airflow standalone")
            _stop_group(airflow)
        if started_server:
            seaweedfs.stop(server)


if __name__ == "__main__":
    sys.exit(main())
