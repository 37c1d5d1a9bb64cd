"""One storage interface for local folders and ``s3://bucket/prefix`` URIs.

Every write is atomic: local files go to a temporary name and are renamed; S3 objects are
single PUTs that carry a SHA-256 the server verifies (a mismatch is rejected, never stored).
S3 clients come from a factory so callers decide where credentials come from: the Airflow
connection inside Airflow, boto3's standard environment on the command line.

Every S3 call has a deadline, whatever client config it was made with: botocore's timeouts apply to
each socket read, so an endpoint that trickles a byte every few seconds would hold a call forever.
A call (a listing page, a PUT, a body read) runs in a daemon thread and is abandoned past
``IMAGE_TFRECORDS_S3_DEADLINE_SECONDS`` (default 300) plus the time its bytes take at
``IMAGE_TFRECORDS_S3_MIN_RATE_MBPS`` (default 1 MB/s; a body read counts the bytes received so far and
only the time spent waiting on the store); the caller gets StoreUnreachable naming the endpoint and
bucket, as for every other network failure. ``IMAGE_TFRECORDS_S3_TIMEOUT_SECONDS`` (default 60) is the
read timeout of the command line's client (connect: the lesser of it and 10 s; 5 attempts at most).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, BinaryIO

from . import localfs
from .errors import StorageError, StoreUnreachable

ClientFactory = Callable[[], Any]
DEADLINE_ENV, MIN_RATE_ENV, TIMEOUT_ENV = ("IMAGE_TFRECORDS_S3_DEADLINE_SECONDS", "IMAGE_TFRECORDS_S3_MIN_RATE_MBPS",
                                           "IMAGE_TFRECORDS_S3_TIMEOUT_SECONDS")
_BODY_CHUNK = 1 << 20
_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")




@dataclass(frozen=True)
class FileInfo:
    """A file or object found by a listing; ``key`` is relative to the listed URI.

    With ``iter_files(..., everything=True)`` a listing also yields what is not a regular file
    (``kind``: symlink, fifo, device, socket, other, or folder_marker for an empty S3 ``key/``) and
    entries that cannot be candidates at all (``problem``: a reject reason, with ``detail``).
    """

    key: str
    size: int
    modified: datetime
    kind: str = "file"
    problem: str = ""
    detail: str = ""


def is_s3(uri: str) -> bool:
    return uri.startswith("s3://")


def join(uri: str, *parts: str) -> str:
    """Join URI parts with ``/`` (for S3 and local paths alike)."""
    out = uri.rstrip("/")
    for part in parts:
        out = f"{out}/{part.strip('/')}" if part else out
    return out


def split_s3(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    bucket, _, key = uri[len("s3://") :].partition("/")
    if not bucket:
        raise StorageError(f"no bucket in {uri!r}")
    return bucket, key


def sha256_file(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class HashingWriter:
    """A binary file wrapper that hashes (SHA-256) and counts what is written through it."""

    def __init__(self, file: BinaryIO) -> None:
        self._file = file
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def write(self, data: bytes) -> int:
        self.sha256.update(data)
        self.num_bytes += len(data)
        return self._file.write(data)

    def flush(self) -> None:
        self._file.flush()


class HashingReader:
    """A binary stream wrapper that hashes (SHA-256) and counts what is read through it."""

    def __init__(self, stream: BinaryIO) -> None:
        self._stream = stream
        self.sha256 = hashlib.sha256()
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.sha256.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self) -> None:
        """Read (and hash) whatever is left."""
        while self.read(1 << 20):
            pass


def default_s3_client() -> Any:
    """A boto3 S3 client from the standard environment (``AWS_*`` variables, config files).

    With ``AWS_ENDPOINT_URL`` set (MinIO, SeaweedFS) path-style addressing is used, which every
    S3-compatible server supports; ``AWS_S3_ADDRESSING_STYLE`` overrides it.
    """
    import boto3
    from botocore.config import Config

    style = os.environ.get("AWS_S3_ADDRESSING_STYLE") or (
        "path" if os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3") else "auto"
    )
    timeout = float(os.environ.get(TIMEOUT_ENV, "60"))
    config = Config(
        s3={"addressing_style": style},
        retries={"mode": "standard", "max_attempts": 5},
        connect_timeout=min(10.0, timeout),
        read_timeout=timeout,
    )
    # A session of its own: the default one caches the credentials it first found in the environment.
    return boto3.session.Session().client("s3", config=config, region_name=os.environ.get("AWS_REGION", "us-east-1"))


def _error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError ("" for anything else, even with ``response=None``)."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code", "")) if isinstance(error, dict) else ""


def _is_missing(exc: Exception) -> bool:
    """True for the S3 errors that mean the object (key) does not exist."""
    return _error_code(exc) in ("NoSuchKey", "404", "NotFound")




class _DeadlinePassed(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"no complete answer within the {seconds:.0f} s deadline")


def deadline_seconds(num_bytes: int = 0) -> float:
    """How long one S3 call moving ``num_bytes`` may take."""
    base = float(os.environ.get(DEADLINE_ENV, "300"))
    rate = float(os.environ.get(MIN_RATE_ENV, "1")) * 1e6
    return base + max(0, num_bytes) / max(rate, 1.0)


def _within(seconds: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or _DeadlinePassed after ``seconds`` (the call is left to a daemon thread,
    which never holds up the exit of the process)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc

    worker = threading.Thread(target=run, name="s3-call", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise _DeadlinePassed(seconds)
    if "error" in box:
        raise box["error"]
    return box.get("value")


_NETWORK_ERRORS: tuple[type[BaseException], ...] = (ConnectionError, TimeoutError)


def _network_errors() -> tuple[type[BaseException], ...]:
    """Every exception type that means the endpoint failed us on the wire (not an S3 answer)."""
    from http.client import HTTPException

    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError, IncompleteReadError, ResponseStreamingError
    from urllib3.exceptions import HTTPError as Urllib3Error

    return (*_NETWORK_ERRORS, BotoConnectionError, HTTPClientError, IncompleteReadError, ResponseStreamingError,
            Urllib3Error, HTTPException, _DeadlinePassed)


def _translate(exc: BaseException, uri: str, client: Any, wire: bool = False) -> Exception | None:
    """A one-line error naming endpoint and bucket (never a secret) for known failures, else None.

    StorageError: retrying cannot fix it (credentials, missing bucket). StoreUnreachable: it can.
    ``wire``: ``exc`` came from reading a response body, so any OSError there is the network's.
    """
    from botocore.exceptions import NoCredentialsError
    from botocore.parsers import ResponseParserError

    endpoint = getattr(getattr(client, "meta", None), "endpoint_url", "?")
    bucket = split_s3(uri)[0] if is_s3(uri) else "?"
    if isinstance(exc, _network_errors()) or (wire and isinstance(exc, OSError)):
        why = str(exc) if isinstance(exc, _DeadlinePassed) else type(exc).__name__
        return StoreUnreachable(f"cannot reach the S3 endpoint {endpoint} (bucket {bucket!r}): {why}")
    if isinstance(exc, ResponseParserError):
        return StoreUnreachable(f"the S3 endpoint {endpoint} (bucket {bucket!r}) answered something that is not "
                                "an S3 response")
    if isinstance(exc, NoCredentialsError):
        return StorageError(f"no AWS credentials found for bucket {bucket!r} at {endpoint}")
    code = _error_code(exc)
    response = getattr(exc, "response", None)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) if isinstance(response, dict) else 0
    if code in ("InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout") or (
            isinstance(status, int) and status >= 500):
        return StoreUnreachable(f"the S3 endpoint {endpoint} (bucket {bucket!r}) failed: {code or status}")
    if code == "NoSuchBucket":
        return StorageError(f"bucket {bucket!r} does not exist at {endpoint}")
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "InvalidToken"):
        return StorageError(f"access denied to bucket {bucket!r} at {endpoint} ({code}): check the credentials")
    return None


class Storage:
    """Read, list and write files under local paths or ``s3://`` URIs."""

    def __init__(self, s3_client_factory: ClientFactory | None = None) -> None:
        self._factory = s3_client_factory or default_s3_client
        self._client: Any = None

    def __getstate__(self) -> dict[str, Any]:  # clients do not pickle; each process makes its own
        return {"_factory": self._factory, "_client": None}

    @property
    def s3(self) -> Any:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def _s3_call(self, uri: str, method: str, **kwargs: Any) -> Any:
        """One client call under its deadline; errors translated (see ``_translate``); a streaming
        ``Body`` in the result is wrapped so that reading it has a deadline too."""
        from botocore.exceptions import BotoCoreError, ClientError
        from botocore.parsers import ResponseParserError

        client = self.s3
        try:
            result = _within(deadline_seconds(_body_size(kwargs.get("Body"))), getattr(client, method), **kwargs)
        except (ClientError, BotoCoreError, ResponseParserError, *_network_errors()) as exc:
            raise (_translate(exc, uri, client) or exc) from exc
        if isinstance(result, dict) and hasattr(result.get("Body"), "read"):
            result["Body"] = DeadlineBody(result["Body"], uri, client)
        return result

    # -- listing -------------------------------------------------------------------------
    def iter_files(self, uri: str, everything: bool = False) -> Iterator[FileInfo]:
        """Every file below ``uri`` (recursively), keys relative to it, in sorted order.

        Local symlinks are never followed (see ``localfs``). By default only regular files are
        yielded; ``everything`` also yields the other entries a source listing must account for.
        """
        if is_s3(uri):
            bucket, prefix = split_s3(uri)
            prefix = prefix.rstrip("/") + "/" if prefix.strip("/") else ""
            paginator = self.s3.get_paginator("list_objects_v2")
            try:
                pages = iter(paginator.paginate(Bucket=bucket, Prefix=prefix))
                while (page := _within(deadline_seconds(), next, pages, None)) is not None:
                    for obj in page.get("Contents", []):
                        key = obj["Key"][len(prefix) :]
                        if not key.endswith("/"):
                            yield FileInfo(key, obj["Size"], obj["LastModified"])
                        elif everything:  # an empty "folder/" object is a console's folder marker
                            yield FileInfo(key, obj["Size"], obj["LastModified"],
                                           "folder_marker" if not obj["Size"] else "file")
            except Exception as exc:
                raise (_translate(exc, uri, self.s3) or exc) from exc
            return
        if not os.path.isdir(uri):
            raise StorageError(f"{uri} is not a folder")
        try:
            for entry in localfs.walk(uri):
                if everything or (entry.kind == "file" and not entry.problem):
                    yield FileInfo(entry.key, entry.size, entry.modified, entry.kind, entry.problem, entry.detail)
        except PermissionError:
            raise StorageError(f"cannot read the folder {uri}: permission denied") from None

    # -- reading -------------------------------------------------------------------------
    @contextlib.contextmanager
    def open_source(self, source: str, key: str) -> Iterator[tuple[BinaryIO, int]]:
        """A source file's stream and size. Local files are opened confined to ``source``: no symlink
        is followed, and only a regular file is opened (``localfs.NotARegularFile`` otherwise)."""
        if is_s3(source):
            with self.open_read(join(source, key)) as body:
                yield body, -1  # the listing knows the size
            return
        file, size = localfs.open_file(source, key)
        with file:
            yield file, size

    def exists(self, uri: str) -> bool:
        if not is_s3(uri):
            return os.path.isfile(uri)
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            self._s3_call(uri, "head_object", Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if _is_missing(exc):
                return False
            raise

    def read_bytes(self, uri: str) -> bytes:
        """The file's bytes; FileNotFoundError if it does not exist (local or S3 alike)."""
        with self.open_read(uri) as f:
            return f.read()

    def read_text(self, uri: str) -> str:
        return self.read_bytes(uri).decode("utf-8")

    @contextlib.contextmanager
    def open_read(self, uri: str) -> Iterator[BinaryIO]:
        """A binary stream of the file (S3: the response body, not spooled to disk); FileNotFoundError
        if it does not exist."""
        if not is_s3(uri):
            with open(uri, "rb") as f:
                yield f
            return
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            body = self._s3_call(uri, "get_object", Bucket=bucket, Key=key)["Body"]
        except ClientError as exc:
            if _is_missing(exc):
                raise FileNotFoundError(uri) from exc
            raise
        try:
            yield body
        finally:
            body.close()

    def download(self, uri: str, path: str) -> None:
        """Copy ``uri`` to the local file ``path`` (streamed)."""
        if not is_s3(uri):
            shutil.copyfile(uri, path)
            return
        bucket, key = split_s3(uri)
        body = self._s3_call(uri, "get_object", Bucket=bucket, Key=key)["Body"]
        with open(path, "wb") as f:
            while chunk := body.read(_BODY_CHUNK):
                f.write(chunk)

    # -- writing -------------------------------------------------------------------------
    def write_bytes(self, uri: str, data: bytes) -> None:
        """Write ``data`` to ``uri`` atomically; S3 verifies its SHA-256 on arrival."""
        if is_s3(uri):
            bucket, key = split_s3(uri)
            checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
            self._s3_call(uri, "put_object", Bucket=bucket, Key=key, Body=data, ChecksumSHA256=checksum)
            return
        self._atomic_local(uri, lambda f: f.write(data))

    def upload(self, path: str, uri: str, sha256: str | None = None) -> None:
        """Store the local file ``path`` at ``uri`` atomically, verified by its SHA-256."""
        sha256 = sha256 or sha256_file(path)
        if is_s3(uri):
            bucket, key = split_s3(uri)
            checksum = base64.b64encode(bytes.fromhex(sha256)).decode()
            with open(path, "rb") as body:
                self._s3_call(uri, "put_object", Bucket=bucket, Key=key, Body=body, ChecksumSHA256=checksum)
            return
        with open(path, "rb") as f:
            os.fsync(f.fileno())
        os.chmod(path, 0o644)  # temporary files are 0600; stored files are for every reader
        if not _link_local(path, uri):
            self._atomic_local(uri, lambda f: _copy_into(path, f))

    def copy(self, src: str, dst: str, sha256: str | None = None) -> None:
        """Copy one file within the same kind of storage: server-side on S3, a hard link on one local disk.

        With ``sha256``, the copy is checked against it (S3 hashes it server-side; a hard link is the same
        file; a local byte copy is hashed on the way) and StorageError is raised on a mismatch.
        """
        if is_s3(src) != is_s3(dst):
            raise StorageError("copy between local and S3 storage is not supported")
        held: str | None = sha256
        if is_s3(src):
            sbucket, skey = split_s3(src)
            dbucket, dkey = split_s3(dst)
            result = self._s3_call(dst, "copy_object", Bucket=dbucket, Key=dkey,
                                   CopySource={"Bucket": sbucket, "Key": skey}, ChecksumAlgorithm="SHA256")
            checksum = result.get("CopyObjectResult", {}).get("ChecksumSHA256")
            if sha256 is not None:
                held = base64.b64decode(checksum).hex() if checksum else self.sha256_of(dst)
        elif not _link_local(src, dst):
            digest = hashlib.sha256()
            self._atomic_local(dst, lambda f: _copy_into(src, f, digest))
            held = digest.hexdigest()
        if sha256 is not None and held != sha256:
            raise StorageError(f"copy of {src} to {dst} has sha256 {held}, expected {sha256}")

    def sha256_of(self, uri: str) -> str | None:
        """The SHA-256 the store holds for an S3 object, or that a local file hashes to."""
        if not is_s3(uri):
            return sha256_file(uri) if os.path.isfile(uri) else None
        bucket, key = split_s3(uri)
        head = self._s3_call(uri, "head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        checksum = head.get("ChecksumSHA256")
        return base64.b64decode(checksum).hex() if checksum and "-" not in checksum else None

    def delete_tree(self, uri: str) -> None:
        """Delete everything below ``uri``."""
        if not is_s3(uri):
            shutil.rmtree(uri, ignore_errors=True)
            return
        bucket, _ = split_s3(uri)
        batch: list[dict[str, str]] = []
        for info in self.iter_files(uri):
            batch.append({"Key": split_s3(join(uri, info.key))[1]})
            if len(batch) == 1000:
                self._s3_call(uri, "delete_objects", Bucket=bucket, Delete={"Objects": batch})
                batch = []
        if batch:
            self._s3_call(uri, "delete_objects", Bucket=bucket, Delete={"Objects": batch})

    def read_with_tag(self, uri: str) -> tuple[bytes | None, str | None]:
        """Content and a version tag (ETag or mtime) for compare-and-swap; (None, None) if absent."""
        if not is_s3(uri):
            try:
                with open(uri, "rb") as f:  # mtime alone can miss a write in the same clock tick
                    data = f.read()
                    return data, f"{os.fstat(f.fileno()).st_mtime_ns}-{hashlib.sha256(data).hexdigest()[:16]}"
            except FileNotFoundError:
                return None, None
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            obj = self._s3_call(uri, "get_object", Bucket=bucket, Key=key)
        except ClientError as exc:
            if _is_missing(exc):
                return None, None
            raise
        return obj["Body"].read(), obj["ETag"]

    def write_if_unchanged(self, uri: str, data: bytes, tag: str | None) -> bool:
        """Write only if ``uri`` still has version ``tag`` (None: only if absent); False if it moved."""
        if is_s3(uri):
            from botocore.exceptions import ClientError

            bucket, key = split_s3(uri)
            condition = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
            checksum = base64.b64encode(hashlib.sha256(data).digest()).decode()
            try:
                self._s3_call(uri, "put_object", Bucket=bucket, Key=key, Body=data, ChecksumSHA256=checksum,
                              **condition)
            except ClientError as exc:
                if _error_code(exc) in _CONFLICT_CODES:
                    return False
                raise
            return True
        import fcntl

        directory = os.path.dirname(uri) or "."
        os.makedirs(directory, exist_ok=True)
        lock = os.open(directory, os.O_RDONLY)  # lock the folder: no stray lock file to publish
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            _, current = self.read_with_tag(uri)
            if current != tag:
                return False
            self._atomic_local(uri, lambda f: f.write(data))
            return True
        finally:
            os.close(lock)

    def delete(self, uri: str) -> None:
        """Delete one file or object; nothing happens if it does not exist."""
        if not is_s3(uri):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(uri)
            return
        bucket, key = split_s3(uri)
        self._s3_call(uri, "delete_object", Bucket=bucket, Key=key)

    @staticmethod
    def _atomic_local(path: str, fill: Callable[[BinaryIO], object]) -> None:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix="-" + os.path.basename(path))
        try:
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; published files are for every reader
            with os.fdopen(fd, "wb") as f:
                fill(f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def _body_size(body: Any) -> int:
    """Bytes an upload sends (0 when unknown)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    try:
        return os.fstat(body.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return 0


class DeadlineBody:
    """An S3 response body whose reading has a deadline that grows with the bytes received: the time
    spent waiting on the store (not on the caller) may be the base plus their time at the minimum rate.
    A body that stalls or trickles ends soon after the base; one arriving at the minimum rate always has time.

    Reads are served from a buffer refilled at least 1 MB at a time in a daemon thread, so callers
    that read record by record do not start a thread per read. Failures become StoreUnreachable. Past
    the deadline the socket is shut down, so that the abandoned read ends and ``close`` never waits.
    """

    def __init__(self, body: Any, uri: str, client: Any) -> None:
        self._body, self._uri, self._client = body, uri, client
        self._waited, self._received = 0.0, 0
        self._buffer, self._pos, self._eof, self._abandoned = b"", 0, False, False

    def _fill(self, want: int) -> bytes:
        """One read of ``want`` bytes, 1 to 64 MB (fewer at the end), under the deadline."""
        want = min(max(want, _BODY_CHUNK), 64 * _BODY_CHUNK)
        seconds = deadline_seconds(self._received + want)
        started = time.monotonic()
        try:
            if self._abandoned or seconds <= self._waited:
                raise _DeadlinePassed(seconds)
            try:
                chunk = _within(seconds - self._waited, self._body.read, want) or b""
            except _DeadlinePassed:
                self._abandoned = True
                _interrupt(self._body)
                raise _DeadlinePassed(seconds) from None
        except Exception as exc:
            raise (_translate(exc, self._uri, self._client, wire=True) or exc) from exc
        self._waited += time.monotonic() - started
        self._received += len(chunk)
        return chunk

    def read(self, size: int | None = -1) -> bytes:
        size = -1 if size is None else size
        if 0 <= size <= len(self._buffer) - self._pos:  # the common case: served from the buffer
            self._pos += size
            return self._buffer[self._pos - size:self._pos]
        parts, have = [self._buffer[self._pos:]], len(self._buffer) - self._pos
        self._buffer, self._pos = b"", 0
        while not self._eof and (size < 0 or have < size):
            chunk = self._fill(size - have if size >= 0 else _BODY_CHUNK)
            self._eof = not chunk
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        if 0 <= size < len(data):
            self._buffer, data = data[size:], data[:size]
        return data

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        if self._abandoned:  # a daemon thread may still hold the stream's lock: never wait for it
            threading.Thread(target=self._body.close, name="s3-close", daemon=True).start()
        else:
            self._body.close()


def _interrupt(body: Any) -> None:
    """Wake a thread blocked reading ``body`` by shutting its socket down (best effort)."""
    raw = getattr(body, "_raw_stream", body)  # botocore's StreamingBody wraps a urllib3 response
    with contextlib.suppress(Exception):
        raw.shutdown()  # urllib3 >= 2.3
        return
    with contextlib.suppress(Exception):
        raw.connection.sock.shutdown(socket.SHUT_RDWR)


def _copy_into(src: str, f: BinaryIO, digest: Any = None) -> None:
    with open(src, "rb") as s:
        while chunk := s.read(1 << 20):
            f.write(chunk)
            if digest is not None:
                digest.update(chunk)


def _link_local(src: str, dst: str) -> bool:
    """Make ``dst`` a hard link to ``src``, atomically; False if the file system cannot (another disk)."""
    directory = os.path.dirname(dst) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{uuid.uuid4().hex}-{os.path.basename(dst)}")
    try:
        os.link(src, tmp)
    except OSError:
        return False
    try:
        os.replace(tmp, dst)
    except BaseException:
        os.unlink(tmp)
        raise
    return True
