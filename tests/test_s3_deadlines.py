"""S3 endpoints that misbehave on the wire: every call ends within its deadline, with one line naming endpoint
and bucket. Servers are plain TCP servers on 127.0.0.1 that this test starts and stops."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from include.image_tfrecords import storage as storage_module
from include.image_tfrecords.storage import Storage, StoreUnreachable, _translate

ROOT = Path(__file__).resolve().parent.parent


def _silent(conn: socket.socket, stop: threading.Event) -> None:
    stop.wait()  # accepts, reads nothing, answers nothing


def _trickle(conn: socket.socket, stop: threading.Event) -> None:
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: 100000\r\n\r\n<")
    while not stop.wait(0.5):  # one byte every half second: each socket read succeeds, the answer never ends
        try:
            conn.sendall(b" ")
        except OSError:
            return


def _hang_up(conn: socket.socket, stop: threading.Event) -> None:
    conn.close()


def _garbage(conn: socket.socket, stop: threading.Event) -> None:
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\nContent-Type: application/xml\r\n\r\nhello world")
    stop.wait()


class Misbehaving:
    """A TCP server on 127.0.0.1 that handles each connection with ``handler`` in a thread of its own."""

    def __init__(self, handler: Callable[[socket.socket, threading.Event], None]) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.handler = handler
        self.connections: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.connections.append(conn)
            threading.Thread(target=self.handler, args=(conn, self.stop), daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for conn in self.connections:
            conn.close()
        self.sock.close()


HANDLERS = {"never_answers": _silent, "trickles": _trickle, "hangs_up": _hang_up, "not_s3": _garbage}


@pytest.fixture(params=sorted(HANDLERS))
def bad_endpoint(request: pytest.FixtureRequest) -> Iterator[Misbehaving]:
    server = Misbehaving(HANDLERS[request.param])
    try:
        yield server
    finally:
        server.close()


def _env(endpoint: str) -> dict[str, str]:
    return {**os.environ, "AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
            "AWS_REGION": "us-east-1", storage_module.DEADLINE_ENV: "3", storage_module.TIMEOUT_ENV: "1"}


def test_the_cli_fails_within_the_deadline_with_one_line(bad_endpoint: Misbehaving, tmp_path: Path) -> None:
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "include.image_tfrecords", "build", "--source", "s3://photos/src",
                             "--destination", str(tmp_path / "out"), "--dataset", "d", "--no-progress"],
                            cwd=ROOT, env=_env(bad_endpoint.endpoint), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and bad_endpoint.endpoint in lines[0] and "'photos'" in lines[0]
    assert elapsed < 45, f"took {elapsed:.0f} s with a 3 s deadline"  # generous: 2 cores, busy CI


def test_storage_calls_and_body_reads_have_a_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    server = Misbehaving(_trickle)
    try:
        for key, value in _env(server.endpoint).items():
            monkeypatch.setenv(key, value)
        storage = Storage()
        started = time.monotonic()
        with pytest.raises(StoreUnreachable, match="within the 3 s deadline"):
            list(storage.iter_files("s3://photos/src"))
        assert time.monotonic() - started < 20
    finally:
        server.close()


def test_translate_never_crashes_on_odd_exceptions() -> None:
    from botocore.exceptions import ReadTimeoutError

    class NoResponse(Exception):
        response = None

    assert _translate(NoResponse("x"), "s3://b/k", None) is None
    translated = _translate(ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), "s3://b/k", None)
    assert isinstance(translated, StoreUnreachable) and "'b'" in str(translated)


def test_a_real_store_reads_through_the_deadline_wrapper(s3_storage: Storage, bucket: str) -> None:
    data = os.urandom(5 << 20)
    uri = f"s3://{bucket}/big.bin"
    s3_storage.write_bytes(uri, data)
    assert s3_storage.read_bytes(uri) == data
    threads = []
    original = storage_module._within

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        threads.append(1)
        return original(*args, **kwargs)

    storage_module._within = counting
    try:
        with s3_storage.open_read(uri) as body:
            pieces = []
            while piece := body.read(12):  # record-sized reads are served from a 1 MB buffer
                pieces.append(piece)
                if len(pieces) > 2000:
                    pieces.append(body.read())
                    break
    finally:
        storage_module._within = original
    assert b"".join(pieces) == data
    assert len(threads) <= 8, f"{len(threads)} threads for one 5 MB body"
