"""The "TFRecord datasets" page in a real browser: a dataset published by a real DAG run into
SeaweedFS, a real `airflow api-server` with the plugin, and headless Chromium driven by chromedriver
over the W3C WebDriver protocol (a small urllib client: no extra dependency).

UPDATE_SCREENSHOTS=1 also writes docs/images/datasets-page.png and docs/images/dataset-card.png.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from email.message import Message
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from image_tfrecords.storage import Storage
from tests.airflow.test_dag_e2e import dags_test
from tests.airflow.test_plugin import publish, subset
from tools import seaweedfs
from tools.seaweedfs import S3Server

ROOT = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).with_name("airflow"))
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1440,960"]
USER, PASSWORD = "reader", "reader-password-for-the-test"
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C WebDriver element reference key


def _ensure_chromium() -> None:
    """Debian's chromium and chromedriver (CI starts from a fresh machine); a font so text renders."""
    if CHROMIUM.exists() and CHROMEDRIVER.exists():
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env, capture_output=True, timeout=600)
    subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium", "chromium-driver",
                    "fonts-dejavu-core"], check=True, env=env, capture_output=True, timeout=900)


def _wait(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """``predicate()``'s first truthy value; past ``timeout`` an error naming what it last saw."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            result = last = predicate()
        except (OSError, WebDriverError) as exc:
            result, last = None, exc
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last saw {last!r:.500}")
        time.sleep(interval)


def _stop(process: subprocess.Popen[bytes], timeout: float = 20) -> None:
    """Stop a process this test started, and its process group (Chromium's helpers), by PID."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:  # the group's other members exit after its leader
            os.killpg(process.pid, 0)
            time.sleep(0.1)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class WebDriverError(RuntimeError):
    pass


class Browser:
    """Headless Chromium through chromedriver's W3C WebDriver endpoint (127.0.0.1 only)."""

    def __init__(self, logs: Path) -> None:
        self.port = seaweedfs.free_ports(1)[0]
        self.url = f"http://127.0.0.1:{self.port}"
        self.profile = Path(tempfile.mkdtemp(prefix="chromium-profile-"))
        with open(logs / "chromedriver.log", "wb") as log:
            self.driver = subprocess.Popen([str(CHROMEDRIVER), f"--port={self.port}", "--allowed-ips=127.0.0.1"],
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                           env={**os.environ, "HOME": str(self.profile)})  # nothing in ~/.config
        self.session = ""

    def call(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read())["value"]
        except urllib.error.HTTPError as exc:
            raise WebDriverError(exc.read().decode(errors="replace")[:2000]) from exc

    def start(self) -> None:
        _wait(lambda: self.call("GET", "/status")["ready"], 30, "chromedriver")
        options = {"binary": str(CHROMIUM), "args": [*CHROMIUM_FLAGS, f"--user-data-dir={self.profile}"]}
        capabilities = {"browserName": "chrome", "goog:chromeOptions": options, "pageLoadStrategy": "normal"}
        self.session = self.call("POST", "/session", {"capabilities": {"alwaysMatch": capabilities}})["sessionId"]

    def stop(self) -> None:
        try:
            if self.session:
                self.do("DELETE", "")  # chromedriver closes Chromium
        finally:
            _stop(self.driver)  # and anything of its process group left behind
            self._stop_crash_handlers()
            shutil.rmtree(self.profile, ignore_errors=True)

    def _stop_crash_handlers(self, timeout: float = 10) -> None:
        """Chromium's crashpad handlers leave its process group; they name this profile (their HOME) in
        their command line. They exit after Chromium does; any still running after ``timeout`` is killed."""
        def ours() -> list[int]:
            found = []
            for proc in Path("/proc").glob("[0-9]*"):
                with contextlib.suppress(OSError):
                    if str(self.profile).encode() in (proc / "cmdline").read_bytes():
                        found.append(int(proc.name))
            return found

        deadline = time.monotonic() + timeout
        while (left := ours()) and time.monotonic() < deadline:
            time.sleep(0.1)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def do(self, method: str, path: str, body: Any = None) -> Any:
        return self.call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        self.do("POST", "/url", {"url": url})

    def js(self, script: str, *args: Any) -> Any:
        return self.do("POST", "/execute/sync", {"script": script, "args": list(args)})

    def frame(self, element: dict | None) -> None:
        self.do("POST", "/frame", {"id": element})

    def click(self, element: dict) -> None:
        self.do("POST", f"/element/{element[ELEMENT]}/click", {})

    def type(self, element: dict, text: str) -> None:
        """Key presses into ``element``, as a person types them."""
        self.do("POST", f"/element/{element[ELEMENT]}/value", {"text": text})

    def screenshot(self, path: Path) -> bytes:
        data = base64.b64decode(self.do("GET", "/screenshot"))
        path.write_bytes(data)
        return data


@pytest.fixture
def published(airflow_env: dict[str, str], s3_server: S3Server, bucket: str, sample_dir: Path,
              tmp_path: Path) -> dict[str, str]:
    """An older version built by the command line from part of the images, then the version of a real
    DAG run (as the nightly run of 2026-11-20 would publish it) from all of them."""
    destination = f"s3://{bucket}/datasets"
    older = publish(s3_server, subset(sample_dir, tmp_path / "older", 12), destination, "shapes", "20261119T020000Z")
    conf = {"source": str(sample_dir), "destination": destination, "dataset": "shapes", "salt": "browser"}
    result = dags_test(airflow_env, s3_server, "2026-11-20T02:00:00+00:00", conf)
    assert result.returncode == 0, result.stdout[-5000:] + result.stderr[-5000:]
    return {"destination": destination, "dataset": "shapes", "version": "20261120T020000Z", "older": older}


@pytest.fixture
def api_server(airflow_env: dict[str, str], s3_server: S3Server, published: dict[str, str],
               tmp_path: Path) -> Iterator[str]:
    """`airflow api-server` on a free 127.0.0.1 port, with one simple-auth-manager user (role viewer)."""
    port = seaweedfs.free_ports(1)[0]
    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({USER: PASSWORD}))
    env = {**{k: v for k, v in airflow_env.items() if not k.startswith("AWS_")},
           "AIRFLOW_CONN_AWS_DEFAULT": s3_server.airflow_connection(),
           "IMAGE_TFRECORDS_DESTINATION": published["destination"],
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{USER}:viewer",
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
           "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
           "AIRFLOW__API_AUTH__JWT_SECRET": "browser-test", "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}"}
    with open(tmp_path / "api-server.log", "wb") as log:
        server = subprocess.Popen([AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                  stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait(lambda: urllib.request.urlopen(f"{url}/api/v2/monitor/health", timeout=5).status == 200, 180,
              "the api-server")
        yield url
    finally:
        _stop(server)


def _token(url: str) -> str:
    request = urllib.request.Request(f"{url}/auth/token", method="POST", headers={"Content-Type": "application/json"},
                                     data=json.dumps({"username": USER, "password": PASSWORD}).encode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())["access_token"]


def _fetch(url: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _answer(url: str, headers: dict[str, str]) -> tuple[int, Message]:
    """The status and headers of one request, a redirect not followed."""
    try:
        with urllib.request.build_opener(_NoRedirect).open(urllib.request.Request(url, headers=headers),
                                                           timeout=60) as response:
            return response.status, response.headers
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers


def _sign_in_redirect(api_server: str, page: str, headers: dict[str, str]) -> None:
    """A browser's page load of ``page`` without a usable token is sent to Airflow's sign-in, naming ``page``
    as where to come back; the sign-in entry hands it to the auth manager's login page, still naming it."""
    status, answer = _answer(page, {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8", **headers})
    assert status == 307 and answer["Location"].startswith("/api/v2/auth/login?"), (status, dict(answer))
    assert parse_qs(urlsplit(answer["Location"]).query) == {"next": [page]}
    status, answer = _answer(api_server + answer["Location"], {})
    assert status == 307 and urlsplit(answer["Location"]).path == "/auth/login", (status, dict(answer))
    assert parse_qs(urlsplit(answer["Location"]).query) == {"next": [page]}


def _sign_in(browser: Browser, username: str, password: str) -> None:
    """On Airflow's sign-in page: type the user name and password, press the button."""
    field = "return document.querySelector('input[name=\"{}\"]')"
    user = _wait(lambda: browser.js(field.format("username")), 60, "the sign-in form")
    browser.type(user, username)
    browser.type(browser.js(field.format("password")), password)
    browser.click(browser.js("return document.querySelector('form button[type=\"submit\"]')"))


def _save(browser: Browser, tmp_path: Path, name: str) -> None:
    data = browser.screenshot(tmp_path / name)
    if os.environ.get("UPDATE_SCREENSHOTS") == "1":
        (ROOT / "docs" / "images").mkdir(parents=True, exist_ok=True)
        (ROOT / "docs" / "images" / name).write_bytes(data)


def _wait_for_path(browser: Browser, wanted: Callable[[str], bool], timeout: float, what: str) -> None:
    """Wait until the top window's path is ``wanted``; the error names the path last seen."""
    seen: list[str] = []

    def arrived() -> bool:
        seen.append(browser.js("return location.pathname"))
        return wanted(seen[-1])

    try:
        _wait(arrived, timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the address was {seen[-1] if seen else 'never read'!r}") from None


def _evidence(browser: Browser, tmp_path: Path) -> None:
    """On failure: a screenshot and the DOM of what the browser showed, next to the server logs."""
    try:
        browser.frame(None)
        browser.screenshot(tmp_path / "failure.png")
        (tmp_path / "failure.html").write_text(browser.js("return document.documentElement.outerHTML"))
        print(f"browser evidence in {tmp_path}")
    except (OSError, WebDriverError):
        pass


FIND_ENTRY = """
return [...document.querySelectorAll('a[aria-label]')].find(e => e.getAttribute('aria-label') === arguments[0]
    && e.textContent.trim() === arguments[0]) || null;
"""
CARD_STATE = """
const imgs = [...document.images];
return {h1: (document.querySelector('h1') || {}).textContent || '', loaded: document.readyState === 'complete',
        tables: [...document.querySelectorAll('table')].map(t => t.textContent),
        images: imgs.length,
        broken: imgs.filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.alt || i.src.slice(0, 40))};
"""


def check_card(browser: Browser, dataset: str, classes: list[str]) -> None:
    card = _wait(lambda: (lambda s: s if s["h1"] and s["images"] and s["loaded"] else None)(browser.js(CARD_STATE)),
                 30, "the card")
    assert dataset in card["h1"], card["h1"]
    assert any(all(name in table for name in classes) for table in card["tables"]), card["tables"]
    assert card["broken"] == [], card


def test_datasets_page_in_the_airflow_ui(api_server: str, published: dict[str, str], s3_server: S3Server,
                                         tmp_path: Path) -> None:
    dataset, version = published["dataset"], published["version"]
    storage = Storage(s3_server.client)
    manifest = json.loads(storage.read_bytes(f"{published['destination']}/{dataset}/{version}/manifest.json"))
    card_url = f"{api_server}/image-tfrecords/datasets/0/{dataset}/{version}/card"

    # The app answers only a logged-in user; credentials never reach the page. A signed-out browser (no
    # token, or one the server cannot read) is sent to sign in; other clients get the 401.
    assert _fetch(f"{api_server}/image-tfrecords/")[0] == 401
    assert _fetch(card_url)[0] == 401
    _sign_in_redirect(api_server, f"{api_server}/image-tfrecords/", {})
    _sign_in_redirect(api_server, card_url, {"Cookie": "_token=not-a-token"})
    token = _token(api_server)
    status, body = _fetch(f"{api_server}/image-tfrecords/", token)
    assert status == 200 and f'data-version="{version}"'.encode() in body
    assert s3_server.secret_key.encode() not in body and s3_server.endpoint.encode() not in body

    _ensure_chromium()
    browser = Browser(tmp_path)
    try:
        browser.start()
        # Signed out, the page sends the browser to Airflow's sign-in page; signing in brings it back.
        browser.get(f"{api_server}/image-tfrecords/")
        _wait_for_path(browser, lambda path: path == "/auth/login", 60, "the sign-in page")
        _sign_in(browser, USER, PASSWORD)
        _wait_for_path(browser, lambda path: path == "/image-tfrecords/", 60, "the datasets page, signed in")
        _wait(lambda: browser.js(f"return document.querySelector('tr.version[data-version=\"{version}\"]')"),
              30, "the version row, signed in")
        browser.get(f"{api_server}/")

        # The UI's navigation has the entry; opening it shows the page inside the UI, in an iframe.
        entry = _wait(lambda: browser.js(FIND_ENTRY, "TFRecord datasets"), 60, "the 'TFRecord datasets' nav entry")
        browser.click(entry)
        # The UI mirrors the iframe's address into its own once the page loads (/plugin/<route>/<the
        # page's path>), so the route is a prefix. Generous waits: a cold machine can take many seconds.
        _wait_for_path(browser, lambda path: path.startswith("/plugin/tfrecord-datasets"), 60, "the route")
        frame = _wait(lambda: browser.js("return document.querySelector('iframe[title=\"TFRecord datasets\"]')"),
                      60, "the page's iframe")
        browser.frame(frame)
        row = _wait(lambda: browser.js(f"return document.querySelector('tr.version[data-version=\"{version}\"]')"),
                    30, "the version row")
        assert browser.js("return [...document.querySelectorAll('tr.version')].map(r => r.dataset.version)") == [
            version, published["older"]]  # newest first
        older_badge = f"return !!document.querySelector('tr.version[data-version=\"{published['older']}\"] .badge')"
        assert browser.js(older_badge) is False
        cells = browser.js("const r = arguments[0]; return {records: r.querySelector('.records').textContent, "
                           "latest: !!r.querySelector('.badge.latest'), splits: r.querySelector('.splits').textContent,"
                           " card: !!r.querySelector('a.card')}", row)
        assert cells["records"] == f"{manifest['num_records']:,}" == "60"
        assert cells["latest"] and cells["card"], cells
        for split, info in manifest["splits"].items():
            assert f"{split} {info['num_records']}" in cells["splits"]
        assert browser.js("return document.querySelector('h2.dataset').firstChild.textContent.trim()") == dataset
        browser.frame(None)
        _save(browser, tmp_path, "datasets-page.png")

        # The card link opens the card produced by the run, inside the UI: heading, class table, every image.
        browser.frame(frame)
        browser.click(browser.js("return document.querySelector('a.card')"))
        browser.frame(None)
        _wait_for_path(browser, lambda path: path.endswith(f"/{version}/card"), 60, "the card's route")
        browser.frame(browser.js("return document.querySelector('iframe[title=\"TFRecord datasets\"]')"))
        check_card(browser, dataset, manifest["classes"])
        browser.frame(None)
        deep_link = browser.js("return location.href")  # the UI's address now names the card: it can be bookmarked
        browser.get("about:blank")
        browser.get(deep_link)
        browser.frame(_wait(lambda: browser.js("return document.querySelector('iframe[title=\"TFRecord datasets\"]')"),
                            30, "the page's iframe"))
        check_card(browser, dataset, manifest["classes"])
        browser.frame(None)

        browser.get(card_url)  # and on its own, for the screenshot
        check_card(browser, dataset, manifest["classes"])
        _save(browser, tmp_path, "dataset-card.png")
    except BaseException:
        _evidence(browser, tmp_path)
        raise
    finally:
        browser.stop()
