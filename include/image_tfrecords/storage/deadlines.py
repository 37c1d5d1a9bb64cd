"""Deadlines for S3 calls and the translation of their failures into one line.

botocore's timeouts apply to each socket read, so an endpoint that trickles a byte every few seconds
would hold a call forever. A call (a listing page, a PUT, a body read) therefore runs in a daemon
thread and is abandoned past ``IMAGE_TFRECORDS_S3_DEADLINE_SECONDS`` (default 300) plus the time its
bytes take at ``IMAGE_TFRECORDS_S3_MIN_RATE_MBPS`` (default 1 MB/s; a body read counts the bytes
received so far and only the time spent waiting on the store); the caller gets StoreUnreachable naming
the endpoint and bucket, as for every other network failure.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from ..errors import StorageError, StoreUnreachable
from .base import is_s3, split_s3

DEADLINE_ENV, MIN_RATE_ENV, TIMEOUT_ENV = ("IMAGE_TFRECORDS_S3_DEADLINE_SECONDS", "IMAGE_TFRECORDS_S3_MIN_RATE_MBPS",
                                           "IMAGE_TFRECORDS_S3_TIMEOUT_SECONDS")
BODY_CHUNK = 1 << 20


class DeadlinePassed(Exception):
    def __init__(self, seconds: float) -> None:
        super().__init__(f"no complete answer within the {seconds:.0f} s deadline")


def deadline_seconds(num_bytes: int = 0) -> float:
    """How long one S3 call moving ``num_bytes`` may take."""
    base = float(os.environ.get(DEADLINE_ENV, "300"))
    rate = float(os.environ.get(MIN_RATE_ENV, "1")) * 1e6
    return base + max(0, num_bytes) / max(rate, 1.0)


def within(seconds: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, or DeadlinePassed after ``seconds`` (the call is left to a daemon thread,
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
        raise DeadlinePassed(seconds)
    if "error" in box:
        raise box["error"]
    return box.get("value")


def body_size(body: Any) -> int:
    """Bytes an upload sends (0 when unknown)."""
    if isinstance(body, bytes | bytearray | memoryview):
        return len(body)
    try:
        return os.fstat(body.fileno()).st_size
    except (AttributeError, OSError, ValueError):
        return 0


def error_code(exc: BaseException) -> str:
    """The S3 error code of a botocore ClientError ("" for anything else, even with ``response=None``)."""
    response = getattr(exc, "response", None)
    error = response.get("Error") if isinstance(response, dict) else None
    return str(error.get("Code", "")) if isinstance(error, dict) else ""


def is_missing(exc: Exception) -> bool:
    """True for the S3 errors that mean the object (key) does not exist."""
    return error_code(exc) in ("NoSuchKey", "404", "NotFound")


def network_errors() -> tuple[type[BaseException], ...]:
    """Every exception type that means the endpoint failed us on the wire (not an S3 answer)."""
    from http.client import HTTPException

    from botocore.exceptions import ConnectionError as BotoConnectionError
    from botocore.exceptions import HTTPClientError, IncompleteReadError, ResponseStreamingError
    from urllib3.exceptions import HTTPError as Urllib3Error

    return (ConnectionError, TimeoutError, BotoConnectionError, HTTPClientError, IncompleteReadError,
            ResponseStreamingError, Urllib3Error, HTTPException, DeadlinePassed)


RETRY_HELPS, RETRY_USELESS = "a retry may help", "retrying will not help"
# S3 answers the callers turn into outcomes of their own: missing, a lost condition, a range past the end
PASSED_ON = frozenset({"NoSuchKey", "404", "NotFound", "PreconditionFailed", "ConditionalRequestConflict", "412",
                       "409", "InvalidRange", "416"})
_BUSY = ("InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling", "ThrottlingException",
         "TooManyRequests", "TooManyRequestsException", "RequestLimitExceeded")


def translate(exc: BaseException, uri: str, client: Any, wire: bool = False) -> Exception | None:
    """A one-line error naming the object (``uri``), the endpoint and the bucket (never a secret), and whether
    a retry can help, for a failure of the store; None for what is not one (the callers' own cases: a missing
    key, a lost condition, a range past the end; an error that is not botocore's or the wire's).

    StorageError: retrying cannot fix it (credentials, missing bucket, a refused request). StoreUnreachable:
    it can (the network, the store's 5xx and throttling, bytes that did not arrive intact).
    ``wire``: ``exc`` came from reading a response body, so any OSError there is the network's.
    """
    from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError, NoCredentialsError
    from botocore.parsers import ResponseParserError

    endpoint = getattr(getattr(client, "meta", None), "endpoint_url", "?")
    bucket = split_s3(uri)[0] if is_s3(uri) else "?"  # only S3 URIs come here; never fail while reporting
    at = f"the S3 endpoint {endpoint} (bucket {bucket!r})"
    if isinstance(exc, network_errors()) or (wire and isinstance(exc, OSError)):
        why = str(exc) if isinstance(exc, DeadlinePassed) else type(exc).__name__
        return StoreUnreachable(f"cannot reach {at} for {uri}: {why}; {RETRY_HELPS}")
    if isinstance(exc, FlexibleChecksumError):  # the body as read does not hash to the checksum S3 stored
        return StoreUnreachable(f"{uri} as read from {at} does not match the checksum the store holds for it "
                                f"({exc}): its bytes changed on the way; {RETRY_HELPS} (if it keeps failing, the "
                                "stored object is damaged: upload it again)")
    if isinstance(exc, ResponseParserError):
        return StoreUnreachable(f"{at} answered something that is not an S3 response for {uri}; {RETRY_HELPS}")
    if isinstance(exc, NoCredentialsError):
        return StorageError(f"no AWS credentials found for bucket {bucket!r} at {endpoint} (for {uri}); "
                            f"{RETRY_USELESS}")
    if isinstance(exc, BotoCoreError):
        return StorageError(f"{uri}: the S3 client failed before {at} answered: {exc}; {RETRY_USELESS}")
    response = getattr(exc, "response", None)
    if not isinstance(exc, ClientError) or not isinstance(response, dict):
        return None
    code = error_code(exc)
    status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    if code in _BUSY or (isinstance(status, int) and (status >= 500 or status == 429)):
        return StoreUnreachable(f"{at} failed for {uri}: {code or status}; {RETRY_HELPS}")
    if code == "NoSuchBucket":
        return StorageError(f"bucket {bucket!r} does not exist at {endpoint} (for {uri}); {RETRY_USELESS}")
    if code in ("InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "403", "InvalidToken"):
        return StorageError(f"access denied to bucket {bucket!r} at {endpoint} ({code}) for {uri}: check the "
                            f"credentials; {RETRY_USELESS}")
    if code in PASSED_ON:
        return None
    message = str(response.get("Error", {}).get("Message", "") or "")
    return StorageError(f"{at} refused {getattr(exc, 'operation_name', 'a request')} of {uri}: "
                        f"{code or status}{': ' + message if message else ''}; {RETRY_USELESS}")


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
        want = min(max(want, BODY_CHUNK), 64 * BODY_CHUNK)
        seconds = deadline_seconds(self._received + want)
        started = time.monotonic()
        try:
            if self._abandoned or seconds <= self._waited:
                raise DeadlinePassed(seconds)
            try:
                chunk = within(seconds - self._waited, self._body.read, want) or b""
            except DeadlinePassed:
                self._abandoned = True
                _interrupt(self._body)
                raise DeadlinePassed(seconds) from None
        except Exception as exc:
            raise (translate(exc, self._uri, self._client, wire=True) or exc) from exc
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
            chunk = self._fill(size - have if size >= 0 else BODY_CHUNK)
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
