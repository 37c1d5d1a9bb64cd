"""Reads of many S3 objects through obstore (Python bindings of Rust's ``object_store``), many in flight.

boto3 costs about 1-4 ms of CPU per GET (signing, its event hooks, a thread per call for the deadline);
obstore about a quarter of that, with the GIL released while a request waits, so a process keeps dozens of
source images in flight on a few threads (``IMAGE_TFRECORDS_S3_CONCURRENCY``, default 16) and stays free
for the work on their bytes; ``s3_listing`` lists a source's folders through it too. Everything else (writes
with the SHA-256 the server verifies, multipart copies, conditional writes, the staged files) stays on boto3.

The obstore store is made from the boto3 client the caller's factory gives (the Airflow connection, or
boto3's standard environment): its endpoint, region, addressing style and credentials (asked again every
few minutes, so refreshing credentials refresh here too). Deadlines are the client's own: a connect
timeout, a read timeout on each stalled read, and a whole-request timeout of ``deadline_seconds`` for the
largest object it reads, with no thread per call. ``object_store`` refuses some keys S3 allows (a control
character in a name); those are read with boto3 (``Unreadable``), nothing is ever read under another key.
``IMAGE_TFRECORDS_S3_READER=boto3`` reads every object with boto3.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from ..errors import StorageError, StoreUnreachable
from .base import split_s3
from .deadlines import RETRY_HELPS, RETRY_USELESS, TIMEOUT_ENV, DeadlinePassed, deadline_seconds

CONCURRENCY_ENV, READER_ENV = "IMAGE_TFRECORDS_S3_CONCURRENCY", "IMAGE_TFRECORDS_S3_READER"
DEFAULT_CONCURRENCY = 16
LARGEST_READ = 256 << 20  # the whole-request deadline is that of an object this large
LISTING_PAGE = 1 << 20  # and a listing page's, that of this many bytes
CREDENTIALS_TTL = timedelta(minutes=5)
MAX_STORES = 32
log = logging.getLogger("image_tfrecords")


def concurrency() -> int:
    """Requests in flight per process for reads of many objects (``IMAGE_TFRECORDS_S3_CONCURRENCY``, >= 1)."""
    value = os.environ.get(CONCURRENCY_ENV, "").strip()
    try:
        return max(1, int(value)) if value else DEFAULT_CONCURRENCY
    except ValueError:
        raise StorageError(f"{CONCURRENCY_ENV}={value!r} is not a whole number of requests") from None


def through_obstore() -> bool:
    """Whether source images are read (and listed) through obstore: yes, unless ``IMAGE_TFRECORDS_S3_READER=boto3``
    (an endpoint only boto3 reaches: a custom CA bundle or proxy set in the connection; moto in tests), or this
    process was forked from one that had used obstore (see ``_after_fork``)."""
    global _warned
    value = os.environ.get(READER_ENV, "obstore").strip().lower() or "obstore"
    if value not in ("obstore", "boto3"):
        raise StorageError(f"{READER_ENV}={value!r}: use obstore (the default) or boto3")
    if value == "obstore" and _inherited:
        if not _warned:
            _warned = True
            log.warning("S3 reads: this process was forked from one that had used obstore, whose I/O threads do not "
                        "survive a fork; reading with boto3 (slower). Fork worker processes before the first S3 "
                        "read (parallel.process_pool's preload does)")
        return False
    return value == "obstore"


class Unreadable(Exception):
    """A key ``object_store`` cannot express (read it with boto3 instead)."""


class _Credentials:
    """obstore's credential provider: the boto3 client's credentials, frozen anew every few minutes."""

    def __init__(self, client: Any) -> None:
        self._client = client

    def __call__(self) -> dict[str, Any]:
        credentials = self._client._get_credentials()  # botocore's own accessor (the signer's credentials)
        if credentials is None:
            raise StorageError(f"no AWS credentials found for {_endpoint(self._client)}; {RETRY_USELESS}")
        frozen = credentials.get_frozen_credentials()
        return {"access_key_id": frozen.access_key, "secret_access_key": frozen.secret_key,
                "token": frozen.token, "expires_at": datetime.now(UTC) + CREDENTIALS_TTL}


def _endpoint(client: Any) -> str:
    return str(getattr(getattr(client, "meta", None), "endpoint_url", "?"))


def _path_style(client: Any) -> bool:
    style = ((getattr(client.meta.config, "s3", None) or {}).get("addressing_style") or "auto")
    return style == "path"


_stores: dict[tuple[int, int, str, bool], Any] = {}  # (pid, id of the boto3 client, bucket, listing) -> store
_inherited_stores: list[dict[tuple[int, int, str, bool], Any]] = []
_lock = threading.Lock()
_runtime_pid: int | None = None  # the process whose obstore calls started its I/O runtime (Rust threads)
_inherited = _warned = False


def _after_fork() -> None:
    """In a forked child: forget the parent's stores; if the parent had used obstore, never use it here. Its
    runtime's threads stayed behind in the parent, and a call would wait for them forever (obstore is not
    fork-safe)."""
    global _lock, _inherited, _stores
    _inherited_stores.append(_stores)  # never freed here: dropping a store the parent made can abort this process
    _stores = {}
    _lock = threading.Lock()
    _inherited = _inherited or _runtime_pid is not None


os.register_at_fork(after_in_child=_after_fork)


def obstore_for(client: Any, bucket: str, listing: bool = False) -> Any:
    """This process's obstore store of ``bucket`` with ``client``'s endpoint, region, addressing and credentials;
    for ``listing``, with the whole-request deadline of a listing page, not of the largest object."""
    global _runtime_pid
    key = (os.getpid(), id(client), bucket, listing)
    with _lock:
        _runtime_pid = _runtime_pid or os.getpid()
        store = _stores.get(key)
        if store is None:
            if len(_stores) >= MAX_STORES:  # clients made anew (the Airflow glue's every few minutes) keep none
                _stores.clear()  # (made in this process: safe to drop)
            store = _stores[key] = _make(client, bucket, LISTING_PAGE if listing else LARGEST_READ)
        return store


def _make(client: Any, bucket: str, largest: int) -> Any:
    from obstore.store import S3Store

    endpoint = _endpoint(client)
    timeout = float(os.environ.get(TIMEOUT_ENV, "60"))
    options = {"connect_timeout": timedelta(seconds=min(10.0, timeout)), "read_timeout": timedelta(seconds=timeout),
               "timeout": timedelta(seconds=deadline_seconds(largest)),
               "allow_http": endpoint.startswith("http://"), "pool_max_idle_per_host": "64"}
    retry = {"max_retries": 4, "retry_timeout": timedelta(seconds=deadline_seconds())}
    return S3Store(bucket, region=client.meta.region_name or "us-east-1", client_options=options,
                   retry_config=retry, credential_provider=_Credentials(client), **addressing(endpoint, bucket,
                                                                                           _path_style(client)))


def addressing(endpoint: str, bucket: str, path_style: bool) -> dict[str, Any]:
    """obstore's endpoint settings for boto3's ``endpoint`` and addressing: AWS's own endpoints are left to
    obstore (it builds them from the region); another's is used as it is with path-style addressing, and with
    the bucket in its host name with virtual-hosted addressing (boto3's ``auto`` for a custom endpoint)."""
    scheme, _, host = endpoint.partition("://")
    if not host or host.split("/")[0].split(":")[0].endswith(".amazonaws.com"):
        return {"virtual_hosted_style_request": not path_style}
    if path_style:
        return {"endpoint": endpoint, "virtual_hosted_style_request": False}
    return {"endpoint": f"{scheme}://{bucket}.{host}", "virtual_hosted_style_request": True}


class Body:
    """An object's bytes, fetched when first read (the caller decides on its size first): a ``read`` stream.

    The fetch streams the body as it arrives and gives up, as ``deadlines.DeadlineBody`` does, once the time
    spent on it passes the deadline of the bytes received so far (a body that trickles; one that stalls ends at
    the client's read timeout)."""

    def __init__(self, result: Any, uri: str, client: Any) -> None:
        self._result, self._uri, self._client = result, uri, client
        self._data: bytes | None = None
        self._pos = 0

    def _fetch_all(self) -> bytes:
        started, received, chunks = time.monotonic(), 0, []
        stream = self._result.stream(min_chunk_size=0)
        for chunk in stream:
            received += len(chunk)
            chunks.append(bytes(chunk))
            seconds = deadline_seconds(received)
            if time.monotonic() - started > seconds:
                raise DeadlinePassed(seconds)
        return b"".join(chunks)

    def read(self, size: int | None = -1) -> bytes:
        if self._data is None:
            self._data = _fetch(self._fetch_all, self._uri, self._client)
        end = len(self._data) if size is None or size < 0 else self._pos + size
        chunk, self._pos = self._data[self._pos:end], min(end, len(self._data))
        return chunk

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._result = self._data = None


def open_object(client: Any, uri: str) -> tuple[Body, int]:
    """The object ``uri`` as a ``Body`` and its size (the body is not read yet). FileNotFoundError if there is
    none, Unreadable for a key obstore cannot express; failures of the store become StorageError or
    StoreUnreachable naming the object, the endpoint and the bucket."""
    import obstore

    bucket, key = split_s3(uri)
    result = _fetch(lambda: obstore.get(obstore_for(client, bucket), key), uri, client)
    return Body(result, uri, client), int(result.meta["size"])


def _fetch(call: Any, uri: str, client: Any) -> Any:
    """``call()`` with obstore's errors as this package's (see ``open_object``)."""
    from obstore.exceptions import BaseError, NotFoundError

    try:
        return call()
    except (FileNotFoundError, NotFoundError) as exc:
        if "NoSuchBucket" in str(exc):  # a 404 too, and a store-wide failure: never an image's reject
            raise translate_obstore(exc, uri, client) from None
        raise FileNotFoundError(uri) from None
    except ValueError as exc:  # the key as a path: "Could not parse path" (checked before any request)
        raise Unreadable(str(exc)) from None
    except (BaseError, OSError, TimeoutError, DeadlinePassed) as exc:
        raise translate_obstore(exc, uri, client) from exc


def translate_obstore(exc: BaseException, uri: str, client: Any) -> Exception:
    """One line naming the object, endpoint and bucket, and whether a retry can help (see ``deadlines.translate``)."""
    from obstore.exceptions import PermissionDeniedError, UnauthenticatedError

    bucket = split_s3(uri)[0]
    at = f"the S3 endpoint {_endpoint(client)} (bucket {bucket!r})"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, PermissionDeniedError | UnauthenticatedError):
        return StorageError(f"access denied to bucket {bucket!r} at {_endpoint(client)} for {uri}: check the "
                            f"credentials ({first}); {RETRY_USELESS}")
    if isinstance(exc, StorageError):
        return exc
    if "NoSuchBucket" in str(exc):
        return StorageError(f"bucket {bucket!r} does not exist at {_endpoint(client)} (for {uri}); {RETRY_USELESS}")
    return StoreUnreachable(f"cannot read {uri} from {at}: {first}; {RETRY_HELPS}")
