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

from image_tfrecords import storage as storage_module
from image_tfrecords.storage import Storage, StorageError, StoreUnreachable, deadlines
from image_tfrecords.storage.deadlines import translate as _translate

ROOT = Path(__file__).resolve().parents[2]


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


LISTING = (b'<?xml version="1.0" encoding="UTF-8"?><ListBucketResult><Name>photos</Name><Prefix>src/</Prefix>'
           b"<KeyCount>1</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated><Contents><Key>src/cat/a.jpg"
           b"</Key><LastModified>2024-01-01T00:00:00.000Z</LastModified><ETag>&quot;x&quot;</ETag><Size>100000</Size>"
           b"</Contents></ListBucketResult>")


def _trickle_bodies(conn: socket.socket, stop: threading.Event) -> None:
    """A store that lists fine, answers HEAD with 404, and sends every object's body a byte at a time."""
    with conn.makefile("rb") as requests:
        while not stop.is_set():
            line = requests.readline()
            headers = iter(requests.readline, b"\r\n")
            length = sum(int(h.split(b":")[1]) for h in headers if h.lower().startswith(b"content-length:"))
            requests.read(length)
            if not line:
                return
            if line.startswith(b"HEAD "):
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            elif b"list-type=2" in line:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/xml\r\nContent-Length: "
                             + str(len(LISTING)).encode() + b"\r\n\r\n" + LISTING)
            else:
                conn.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nETag: "x"\r\n'
                             b"Content-Length: 100000\r\n\r\n\xff\xd8")
                while not stop.wait(0.5):
                    try:
                        conn.sendall(b"\0")
                    except OSError:
                        return


HANDLERS = {"never_answers": _silent, "trickles": _trickle, "hangs_up": _hang_up, "not_s3": _garbage,
            "trickles_bodies": _trickle_bodies}


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
    result = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", "s3://photos/src",
                             "--destination", str(tmp_path / "out"), "--dataset", "d", "--no-progress"],
                            cwd=ROOT, env=_env(bad_endpoint.endpoint), capture_output=True, text=True, timeout=120)
    elapsed = time.monotonic() - started
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and len(lines) == 1, result.stderr[-3000:]
    assert lines[0].startswith("error: ") and bad_endpoint.endpoint in lines[0] and "'photos'" in lines[0]
    assert elapsed < 45, f"took {elapsed:.0f} s with a 3 s deadline"  # generous: 2 cores, busy CI


def test_a_trickling_listing_ends_at_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
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


def _read_records(storage: Storage, uri: str) -> None:
    with storage.open_read(uri) as body:
        while body.read(12):
            pass


OPERATIONS: dict[str, Callable[[Storage, Path], object]] = {
    "list": lambda storage, _: list(storage.iter_files("s3://photos/src")),
    "read_bytes": lambda storage, _: storage.read_bytes("s3://photos/src/a.jpg"),
    "read_records": lambda storage, _: _read_records(storage, "s3://photos/src/a.jpg"),
    "download": lambda storage, tmp: storage.download("s3://photos/src/a.jpg", str(tmp / "a.jpg")),
    "read_with_tag": lambda storage, _: storage.read_with_tag("s3://photos/lock.json"),
    "write_bytes": lambda storage, _: storage.write_bytes("s3://photos/out/x.bin", b"x" * 100_000),
    "write_if_unchanged": lambda storage, _: storage.write_if_unchanged("s3://photos/lock.json", b"{}", None),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_every_storage_call_ends_within_its_deadline(bad_endpoint: Misbehaving, operation: str, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if bad_endpoint.handler is _garbage and operation != "list":
        pytest.skip("a 200 with a body is a fine answer to a GET or PUT")
    if bad_endpoint.handler is _trickle_bodies and operation in ("list", "write_bytes", "write_if_unchanged"):
        pytest.skip("this server answers listings and writes properly")
    for key, value in _env(bad_endpoint.endpoint).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv(storage_module.DEADLINE_ENV, "2")
    before = {t for t in threading.enumerate() if t.name == "s3-call"}
    started = time.monotonic()
    with pytest.raises(StoreUnreachable) as caught:
        OPERATIONS[operation](Storage(), tmp_path)
    elapsed = time.monotonic() - started
    message = str(caught.value)
    assert bad_endpoint.endpoint in message and "'photos'" in message and "\n" not in message, message
    assert "Traceback" not in message and "secret" not in message.lower()
    assert elapsed < 20, f"{operation} took {elapsed:.0f} s with a 2 s deadline"
    if bad_endpoint.handler is _trickle_bodies:  # the abandoned body read was woken up (its socket shut down)
        for _ in range(50):
            if not {t for t in threading.enumerate() if t.name == "s3-call"} - before:
                break
            time.sleep(0.1)
        assert not {t for t in threading.enumerate() if t.name == "s3-call"} - before, "a body read was left hanging"


def test_translate_never_crashes_on_odd_exceptions() -> None:
    from botocore.exceptions import ReadTimeoutError

    class NoResponse(Exception):
        response = None

    assert _translate(NoResponse("x"), "s3://b/k", None) is None
    translated = _translate(ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), "s3://b/k", None)
    assert isinstance(translated, StoreUnreachable) and "'b'" in str(translated)


def test_translate_names_endpoint_and_bucket_for_every_kind_of_failure() -> None:
    import http.client
    from types import SimpleNamespace

    import urllib3.exceptions
    from botocore import exceptions as bx
    from botocore.parsers import ResponseParserError

    client = SimpleNamespace(meta=SimpleNamespace(endpoint_url="http://store:9000"))

    def error(code: str, status: int) -> bx.ClientError:
        return bx.ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "GetObject")

    unreachable = [bx.EndpointConnectionError(endpoint_url="http://store:9000"),
                   bx.ConnectTimeoutError(endpoint_url="x"), bx.ConnectionClosedError(endpoint_url="x"),
                   bx.IncompleteReadError(actual_bytes=1, expected_bytes=2), bx.ResponseStreamingError(error="reset"),
                   urllib3.exceptions.ProtocolError("reset"), urllib3.exceptions.ReadTimeoutError(None, "/", "slow"),
                   http.client.IncompleteRead(b""), TimeoutError(), ConnectionResetError(), ResponseParserError("x"),
                   error("InternalError", 500), error("503", 503), error("SlowDown", 503)]
    for exc in unreachable:
        translated = _translate(exc, "s3://photos/k", client)
        assert isinstance(translated, StoreUnreachable), exc
        assert "http://store:9000" in str(translated) and "'photos'" in str(translated)
        assert "s3://photos/k" in str(translated) and str(translated).endswith("a retry may help"), translated
    checksum = bx.FlexibleChecksumError(error_msg="Expected checksum 0jn2cw== did not match calculated checksum: "
                                                  "FiCf0A==")
    for failure in (checksum, error("Throttling", 400), error("x", 429)):
        translated = _translate(failure, "s3://photos/k", client)
        assert isinstance(translated, StoreUnreachable) and "s3://photos/k" in str(translated), failure
    assert "0jn2cw==" in str(_translate(checksum, "s3://photos/k", client))
    for failure in (bx.NoCredentialsError(), error("AccessDenied", 403), error("NoSuchBucket", 404),
                    error("InvalidObjectState", 403), error("MethodNotAllowed", 405),
                    bx.ParamValidationError(report="x")):
        translated = _translate(failure, "s3://photos/k", client)
        assert isinstance(translated, StorageError) and not translated.retryable, failure
        assert "s3://photos/k" in str(translated) and "retrying will not help" in str(translated), translated
    assert isinstance(_translate(OSError(5, "EIO"), "s3://photos/k", client, wire=True), StoreUnreachable)
    assert _translate(OSError(5, "EIO"), "s3://photos/k", client) is None  # e.g. reading the file to upload
    assert isinstance(_translate(bx.NoCredentialsError(), "s3://photos/k", client), StorageError)
    assert isinstance(_translate(error("AccessDenied", 403), "s3://photos/k", client), StorageError)
    assert _translate(error("NoSuchKey", 404), "s3://photos/k", client) is None  # callers map it to "missing"
    assert _translate(error("PreconditionFailed", 412), "s3://photos/k", client) is None
    no_response = error("x", 500)
    no_response.response = None  # type: ignore[assignment]
    assert _translate(no_response, "s3://photos/k", client) is None


def test_a_real_store_reads_through_the_deadline_wrapper(s3_storage: Storage, bucket: str) -> None:
    data = os.urandom(5 << 20)
    uri = f"s3://{bucket}/big.bin"
    s3_storage.write_bytes(uri, data)
    assert s3_storage.read_bytes(uri) == data
    threads = []
    original = deadlines.within

    def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
        threads.append(1)
        return original(*args, **kwargs)

    deadlines.within = counting
    try:
        with s3_storage.open_read(uri) as body:
            pieces = []
            while piece := body.read(12):  # record-sized reads are served from a 1 MB buffer
                pieces.append(piece)
                if len(pieces) > 2000:
                    pieces.append(body.read())
                    break
    finally:
        deadlines.within = original
    assert b"".join(pieces) == data
    assert len(threads) <= 8, f"{len(threads)} threads for one 5 MB body"
