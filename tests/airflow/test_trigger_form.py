"""`make ui` as a new user first meets it, in Debian's headless Chromium driven over WebDriver: the DAGs are
listed without import errors and the datasets page answers (``tools/ui.py``'s own check); sign in on
Airflow's login page, open the DAG `image_tfrecords`, press Trigger and, in the form, its Trigger button with
every default untouched (the "Unpause" box ticked, as it comes). The run succeeds and publishes, and no run
of the DAG fails, the scheduled one that unpausing starts included (its snapshot sees only files modified
before 02:00 UTC: tools/ui.py dates the sample images back).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from image_tfrecords.published import layout
from image_tfrecords.storage import Storage
from tests.airflow.test_browser import Browser, _ensure_chromium, _evidence, _sign_in, _stop, _wait, _wait_for_path
from tools import seaweedfs
from tools.ui import BUCKET, _get, _token, check

ROOT = Path(__file__).resolve().parents[2]
DAG = "image_tfrecords"
DESTINATION = f"s3://{BUCKET}/image-tfrecords/images"  # make ui's defaults: its bucket, the dataset `images`
S3_KEYS = ("tfrecords", "tfrecords-secret")  # the keys of the SeaweedFS make ui starts (seaweedfs.start's)
BANNER = re.compile(r"Airflow UI: (\S+)  \(user admin, password (\S+?);.*?\nDatasets page: \S+\s+S3 endpoint: (\S+)",
                    re.S)
FIND_BUTTON = """
const [text, inDialog] = arguments;
return [...document.querySelectorAll('button')].find(b => b.textContent.trim() === text && b.offsetParent !== null
    && !!b.closest('[role="dialog"]') === inDialog) || null;
"""


def _airflow_processes(home: Path) -> list[str]:
    """Processes whose environment names ``home`` as AIRFLOW_HOME (what the run started)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if f"AIRFLOW_HOME={home}".encode() in (proc / "environ").read_bytes().split(b"\0"):
                found.append((proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


DIALOG_TEXT = "const d = document.querySelector('[role=\"dialog\"][aria-modal=\"true\"]'); return d ? d.innerText : ''"


@pytest.fixture
def make_ui(tmp_path: Path) -> Iterator[dict[str, str]]:
    """tools/ui.py (what `make ui` runs) in a work folder of its own; its URL, admin password and S3 endpoint.
    Stopped as Ctrl-C stops it (SIGTERM: it stops airflow standalone and SeaweedFS), nothing left running."""
    env = {k: v for k, v in os.environ.items() if k != seaweedfs.ENDPOINT_ENV}
    log_path, work = tmp_path / "make-ui.log", tmp_path / "ui"
    with open(log_path, "wb") as log:
        process = subprocess.Popen([sys.executable, "-u", str(ROOT / "tools" / "ui.py"), "--work", str(work)],
                                   cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def banner() -> re.Match[str] | None:
            if process.poll() is not None:
                raise AssertionError(f"make ui exited with {process.returncode}: {log_path.read_text()[-3000:]}")
            return BANNER.search(log_path.read_text(errors="replace"))

        found = _wait(banner, 300, "make ui's banner", interval=1)
        yield {"url": found[1], "password": found[2], "endpoint": found[3], "work": str(work)}
    finally:
        _stop(process, timeout=120)  # one SIGTERM: ui.py's handler stops what it started (a second would cut it short)
        _wait(lambda: not _airflow_processes(work / "airflow"), 30, "make ui's Airflow processes to exit")


@contextlib.contextmanager
def _chromium(tmp_path: Path) -> Iterator[Browser]:
    """Debian's headless Chromium, started; on failure a screenshot and the DOM in ``tmp_path``; stopped."""
    _ensure_chromium()
    browser = Browser(tmp_path)
    try:
        browser.start()
        yield browser
    except BaseException:
        _evidence(browser, tmp_path)
        raise
    finally:
        browser.stop()


def _runs(url: str, token: str) -> list[dict]:
    return json.loads(_get(f"{url}/api/v2/dags/{DAG}/dagRuns?limit=100", token)[1])["dag_runs"]


def test_trigger_form_with_its_defaults_runs_and_publishes(make_ui: dict[str, str], tmp_path: Path) -> None:
    started = time.monotonic()
    url = make_ui["url"]
    check(url, Path(make_ui["work"]) / "airflow")  # the DAGs listed, no import error, the datasets page answers
    with _chromium(tmp_path) as browser:
        browser.get(f"{url}/")
        _wait_for_path(browser, lambda path: path == "/auth/login", 60, "the sign-in page")
        _sign_in(browser, "admin", make_ui["password"])
        _wait_for_path(browser, lambda path: not path.startswith("/auth"), 60, "the UI, signed in")

        # The Dags list, then the DAG (the dag-processor may still be parsing it: generous wait).
        browser.click(_wait(lambda: browser.js("return document.querySelector('a[aria-label=\"Dags\"]')"), 60,
                            "the Dags entry"))
        link = _wait(lambda: browser.js(f"return document.querySelector('a[href$=\"/dags/{DAG}\"]')"), 180,
                     "the DAG in the Dags list", interval=1)
        browser.click(link)
        _wait_for_path(browser, lambda path: path.startswith(f"/dags/{DAG}"), 60, "the DAG's page")
        browser.click(_wait(lambda: browser.js(FIND_BUTTON, "Trigger", False), 60, "the DAG's Trigger button"))

        # The form, once its params are loaded (their sections shown), can be submitted as it is.
        _wait(lambda: all(s in browser.js(DIALOG_TEXT) for s in ("Splits", "Bad input")), 60, "the form's params")
        assert f"Unpause {DAG} on trigger" in browser.js(DIALOG_TEXT)  # ticked, as it comes
        submit = browser.js(FIND_BUTTON, "Trigger", True)
        time.sleep(1)  # the form checks its sections right after rendering them
        assert browser.js("return arguments[0].disabled", submit) is False, "the form's Trigger button is disabled"
        browser.click(submit)
        _wait(lambda: not browser.js(DIALOG_TEXT), 30, "the form to close")
    print(f"signed in and triggered after {time.monotonic() - started:.0f} s")

    token = _token(url, make_ui["password"])
    manual = _wait(lambda: [r for r in _runs(url, token) if r["run_type"] == "manual"], 30, "the triggered run")
    assert len(manual) == 1, manual

    def finished() -> list[dict] | None:
        runs = _runs(url, token)
        if failed := [r for r in runs if r["state"] == "failed"]:
            raise AssertionError(f"failed runs: {failed}; see {make_ui['work']}/airflow/logs")
        done = {r["run_type"] for r in runs if r["state"] == "success"}
        return runs if {"manual", "scheduled"} <= done and all(r["state"] == "success" for r in runs) else None

    runs = _wait(finished, 420, "the triggered run and the scheduled run unpausing started", interval=2)
    print(f"runs finished after {time.monotonic() - started:.0f} s: "
          f"{[(r['run_type'], r['logical_date'], r['state']) for r in runs]}")
    body = _get(f"{url}/api/v2/dags/{DAG}", token)[1]
    assert json.loads(body)["is_paused"] is False

    # The triggered run published its version: its manifest is in make ui's destination. (Had the scheduled run
    # published the same images before the triggered one looked at them, the triggered run would have found them
    # unchanged and published nothing: then the scheduled run's version is the one to read.)
    storage = Storage(seaweedfs.S3Server(make_ui["endpoint"], *S3_KEYS).client)
    versions = {r["run_type"]: layout.version_name(datetime.fromisoformat(r["logical_date"])) for r in runs}
    published = [v for _, v in sorted(versions.items()) if storage.exists(f"{DESTINATION}/{v}/manifest.json")]
    assert versions["manual"] in published or published == [versions["scheduled"]], (versions, published)
    version = versions["manual"] if versions["manual"] in published else versions["scheduled"]
    manifest = json.loads(storage.read_bytes(f"{DESTINATION}/{version}/manifest.json"))
    assert manifest["num_records"] == 60 and sorted(manifest["classes"]) == ["circles", "squares", "triangles"]
