"""``S3Store``: objects under ``s3://bucket/key`` URIs, through a boto3 client from a factory.

The factory decides where credentials come from: the Airflow connection inside Airflow, boto3's
standard environment on the command line (``default_s3_client``). Every write is a single PUT that
carries a SHA-256 the server verifies (a mismatch is rejected, never stored), except ``compose``: a
multipart upload whose parts the server verifies, copied from other objects where it can, which
records the whole object's SHA-256 in its metadata (S3 keeps only a checksum of the parts' checksums
for multipart objects; ``sha256_of`` reads the metadata then). Every call has a
deadline and its failures become one line naming endpoint and bucket (see ``deadlines``).
``IMAGE_TFRECORDS_S3_TIMEOUT_SECONDS`` (default 60) is the read timeout of the command line's client
(connect: the lesser of it and 10 s; 5 attempts at most).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO

from ..errors import SourceChanged, StorageError
from . import s3_listing, s3_reads
from .base import FileInfo, Store, from_s3_checksum, join, sha256_bytes, split_s3, to_s3_checksum
from .deadlines import (
    BODY_CHUNK,
    TIMEOUT_ENV,
    DeadlineBody,
    body_size,
    deadline_seconds,
    error_code,
    is_missing,
    network_errors,
    translate,
    within,
)
from .multipart import MAX_PARTS, Part, Segment, copied_bytes, part_count, plan_parts

ClientFactory = Callable[[], Any]
log = logging.getLogger("image_tfrecords")
_CONFLICT_CODES = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


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
    key = (os.getpid(), style, timeout, *(os.environ.get(n, "") for n in _CLIENT_ENV))
    with _CLIENT_LOCK:
        if key not in _clients:
            _clients.clear()
            _clients[key] = boto3.session.Session().client("s3", config=config,
                                                           region_name=os.environ.get("AWS_REGION", "us-east-1"))
        return _clients[key]


def _folder(prefix: str) -> str:
    """A listing prefix for the key ``prefix``: ``a/b`` -> ``a/b/``; the bucket's root -> ``""``."""
    return prefix.strip("/") + "/" if prefix.strip("/") else ""


_CLIENT_LOCK = threading.RLock()
_CLIENT_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
               "AWS_ENDPOINT_URL_S3", "AWS_REGION")
_clients: dict[tuple[Any, ...], Any] = {}  # this process's client (a pickled store's factory asks for it again)
os.register_at_fork(after_in_child=lambda: globals().update(_CLIENT_LOCK=threading.RLock()))


class S3Store(Store):
    """Objects in S3 (or an S3-compatible server); the client is made on first use."""

    def __init__(self, client_factory: ClientFactory | None = None) -> None:
        self._factory = client_factory or default_s3_client
        self._client: Any = None
        self._pid = os.getpid()

    def __getstate__(self) -> dict[str, Any]:  # clients do not pickle; each process makes its own
        return {"_factory": self._factory, "_client": None, "_pid": 0}

    @property
    def client(self) -> Any:
        """The client of this process: a store that crossed a fork makes its own, as one that was pickled does
        (the parent's client holds its pooled connections, whose sockets the parent goes on using)."""
        if self._client is None or self._pid != os.getpid():
            with _CLIENT_LOCK:  # one client for the threads that ask at once (each costs ~0.1 s of CPU)
                if self._client is None or self._pid != os.getpid():
                    self._client, self._pid = self._factory(), os.getpid()
        return self._client

    def prime(self) -> None:
        _ = self.client

    def _call(self, uri: str, method: str, **kwargs: Any) -> Any:
        """One client call under its deadline; errors translated (see ``translate``); a streaming
        ``Body`` in the result is wrapped so that reading it has a deadline too."""
        from botocore.exceptions import BotoCoreError, ClientError
        from botocore.parsers import ResponseParserError

        client = self.client
        try:
            result = within(deadline_seconds(body_size(kwargs.get("Body"))), getattr(client, method), **kwargs)
        except (ClientError, BotoCoreError, ResponseParserError, *network_errors()) as exc:
            raise (translate(exc, uri, client) or exc) from exc
        if isinstance(result, dict) and hasattr(result.get("Body"), "read"):
            result["Body"] = DeadlineBody(result["Body"], uri, client)
        return result

    def pages(self, uri: str, **kwargs: Any) -> Iterator[dict[str, Any]]:
        """The pages of a ListObjectsV2 of ``uri``'s bucket, each fetched under the deadline; errors
        translated."""
        bucket, _ = split_s3(uri)
        try:
            pages = iter(self.client.get_paginator("list_objects_v2").paginate(Bucket=bucket, **kwargs))
            while (page := within(deadline_seconds(), next, pages, None)) is not None:
                yield page
        except Exception as exc:
            raise (translate(exc, uri, self.client) or exc) from exc

    @staticmethod
    def folder(uri: str) -> str:
        """The listing prefix of ``uri``: ``s3://b/a/b`` -> ``a/b/``; the bucket's root -> ``""``."""
        return _folder(split_s3(uri)[1])

    @staticmethod
    def infos(objects: list[dict[str, Any]], prefix: str, everything: bool) -> Iterator[FileInfo]:
        """A listing page's ``Contents`` as FileInfo, keys relative to ``prefix`` (see ``iter_files``)."""
        for obj in objects:
            key = obj["Key"][len(prefix) :]
            if key and not key.endswith("/"):
                yield FileInfo(key, obj["Size"], obj["LastModified"], stamp=obj.get("ETag", "").strip('"'))
            elif everything:  # an empty "folder/" object (the prefix's own included) is a console's folder marker
                kind = "folder_marker" if not obj["Size"] or not key else "file"
                yield FileInfo(key, obj["Size"], obj["LastModified"], kind, stamp=obj.get("ETag", "").strip('"'))

    # -- listing ---------------------------------------------------------------------------------
    def iter_files(self, uri: str, everything: bool = False) -> Iterator[FileInfo]:
        """Every object below ``uri`` (see ``Store.iter_files``): its folders listed in parallel
        (``s3_listing``), or one request at a time with ``IMAGE_TFRECORDS_S3_CONCURRENCY=1``."""
        if s3_listing.parallel_ok():
            return s3_listing.iter_files(self, uri, everything, lambda: self._iter_sequential(uri, everything))
        return self._iter_sequential(uri, everything)

    def iter_file_runs(self, uri: str) -> Iterator[Any]:
        """``iter_files(uri, everything=True)``, where the folders are listed in parallel with the objects of a page
        directly in its folder as one ``FileRun`` (their times in ``modified``; names as listed)."""
        if s3_listing.parallel_ok():
            return s3_listing.iter_files(self, uri, True, lambda: self._iter_sequential(uri, True), runs=True)
        return self._iter_sequential(uri, True)

    def _iter_sequential(self, uri: str, everything: bool) -> Iterator[FileInfo]:
        prefix = self.folder(uri)
        for page in self.pages(uri, Prefix=prefix):
            yield from self.infos(page.get("Contents", []), prefix, everything)

    def list_children(self, uri: str) -> tuple[list[str], list[str]]:
        prefix = _folder(split_s3(uri)[1])
        folders: list[str] = []
        files: list[str] = []
        for page in self.pages(uri, Prefix=prefix, Delimiter="/"):
            folders += [p["Prefix"][len(prefix):].rstrip("/") for p in page.get("CommonPrefixes", [])]
            files += [o["Key"][len(prefix):] for o in page.get("Contents", []) if not o["Key"].endswith("/")]
        return sorted(folders), sorted(files)

    # -- reading ---------------------------------------------------------------------------------
    @contextlib.contextmanager
    def open_source(self, source: str, key: str) -> Iterator[tuple[BinaryIO, int]]:
        """A source image and its size, through obstore (``s3_reads``: a fraction of boto3's CPU, no thread per
        call); boto3 reads a key obstore cannot express (its size then comes from the listing: -1)."""
        uri = join(source, key)
        try:
            if not s3_reads.through_obstore():
                raise s3_reads.Unreadable
            body, size = s3_reads.open_object(self.client, uri)
        except s3_reads.Unreadable:
            with self.open_read(uri) as stream:
                yield stream, -1
            return
        try:
            yield body, size  # type: ignore[misc]
        finally:
            body.close()

    def exists(self, uri: str) -> bool:
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            self._call(uri, "head_object", Bucket=bucket, Key=key)
            return True
        except ClientError as exc:
            if is_missing(exc):
                return False
            raise

    def _get(self, uri: str) -> dict[str, Any] | None:
        """The GetObject answer (its body under the deadline), None if there is no such object."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            return self._call(uri, "get_object", Bucket=bucket, Key=key)
        except ClientError as exc:
            if is_missing(exc):
                return None
            raise

    @contextlib.contextmanager
    def open_read(self, uri: str) -> Iterator[BinaryIO]:
        obj = self._get(uri)
        if obj is None:
            raise FileNotFoundError(uri)
        body = obj["Body"]
        try:
            yield body
        finally:
            body.close()

    def read_range(self, uri: str, start: int, length: int) -> bytes:
        """One ranged GET (``Range: bytes=start-end``), under the deadline."""
        from botocore.exceptions import ClientError

        if length <= 0:
            return b""
        bucket, key = split_s3(uri)
        try:
            obj = self._call(uri, "get_object", Bucket=bucket, Key=key, Range=f"bytes={start}-{start + length - 1}")
        except ClientError as exc:
            if is_missing(exc):
                raise FileNotFoundError(uri) from None
            if error_code(exc) in ("InvalidRange", "416"):
                return b""  # the range starts past the object's end
            raise
        with contextlib.closing(obj["Body"]) as body:
            return body.read(length)

    def download(self, uri: str, path: str) -> str | None:
        obj = self._get(uri)
        if obj is None:
            raise FileNotFoundError(uri)
        body = obj["Body"]
        with open(path, "wb") as f:
            while chunk := body.read(BODY_CHUNK):
                f.write(chunk)
        return obj.get("ETag")

    def sha256_of(self, uri: str) -> str | None:
        """The SHA-256 S3 holds for the object; for a multipart object (``compose``), the one its metadata
        records. None if there is no such object, or it was stored without either."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(uri)
        try:
            head = self._call(uri, "head_object", Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        except ClientError as exc:
            if is_missing(exc):
                return None
            raise
        return from_s3_checksum(head.get("ChecksumSHA256")) or _metadata_sha256(head)

    def read_with_tag(self, uri: str) -> tuple[bytes | None, str | None]:
        """Content and ETag; (None, None) if absent."""
        obj = self._get(uri)
        if obj is None:
            return None, None
        return obj["Body"].read(), obj["ETag"]

    # -- writing ---------------------------------------------------------------------------------
    def _put(self, uri: str, body: bytes | BinaryIO, sha256: str, **kwargs: Any) -> None:
        bucket, key = split_s3(uri)
        self._call(uri, "put_object", Bucket=bucket, Key=key, Body=body, ChecksumSHA256=to_s3_checksum(sha256),
                   **kwargs)

    def write_bytes(self, uri: str, data: bytes) -> None:
        self._put(uri, data, sha256_bytes(data))

    def upload(self, path: str, uri: str, sha256: str) -> None:
        with open(path, "rb") as body:
            self._put(uri, body, sha256)

    def write_if_unchanged(self, uri: str, data: bytes, tag: str | None) -> bool:
        """A conditional PUT: ``If-Match`` the ETag ``tag``, or ``If-None-Match: *`` for None."""
        from botocore.exceptions import ClientError

        condition = {"IfMatch": tag} if tag else {"IfNoneMatch": "*"}
        try:
            self._put(uri, data, sha256_bytes(data), **condition)
        except ClientError as exc:
            if error_code(exc) in _CONFLICT_CODES:
                return False
            raise
        return True

    def copy(self, src: str, dst: str, sha256: str | None = None) -> None:
        """A server-side copy; with ``sha256``, checked against the SHA-256 S3 computes for the copy."""
        (sbucket, skey), (dbucket, dkey) = split_s3(src), split_s3(dst)
        result = self._call(dst, "copy_object", Bucket=dbucket, Key=dkey, CopySource={"Bucket": sbucket, "Key": skey},
                            ChecksumAlgorithm="SHA256")
        if sha256 is None:
            return
        held = from_s3_checksum(result.get("CopyObjectResult", {}).get("ChecksumSHA256")) or self.sha256_of(dst)
        if held != sha256:
            raise StorageError(f"copy of {src} to {dst} has sha256 {held}, expected {sha256}")

    def compose(self, dst: str, segments: list[Segment], sha256: str, if_match: dict[str, str] | None = None
                ) -> int:
        """Write the object ``dst`` as ``segments`` in order (``multipart.plan_parts``): byte ranges of other
        objects are copied by the store (``UploadPartCopy``, each source only while its ETag is still
        ``if_match[source]``), new bytes are uploaded; a short run between two others first becomes a temporary
        object with the 5 MiB before it (``dst`` + ``.part-N``, deleted once ``dst`` is complete). The whole
        object's SHA-256, ``sha256``, goes into its metadata. Nothing is visible at ``dst`` until the upload
        completes; a failed one is aborted. Returns the bytes of ``dst`` the store copied (0: one PUT of the
        whole, when no range is worth copying)."""
        parts = plan_parts(segments)
        if not copied_bytes(parts) or part_count(parts) > MAX_PARTS:
            with tempfile.TemporaryFile() as whole:  # bounded memory: the segments may be a whole shard
                for segment in segments:
                    for start in range(0, segment.length, BODY_CHUNK):
                        whole.write(segment.read(start, min(BODY_CHUNK, segment.length - start)))
                whole.seek(0)
                self._put(dst, whole, sha256)
            return 0
        conditions, temporary = dict(if_match or {}), []
        try:
            flat = [self._made(dst, part, conditions, temporary) for part in parts]
            self._multipart(dst, flat, conditions, {"sha256": sha256})
        finally:
            for uri in temporary:
                try:
                    self.delete(uri)
                except Exception as exc:  # left in the staging prefix, which is removed whole after the publish
                    log.warning("compose: cannot delete the temporary object %s (%s)", uri, exc)
        return copied_bytes(parts)

    def _made(self, dst: str, part: Part, conditions: dict[str, str], temporary: list[str]) -> Part:
        """``part`` as a plain copy or upload: a temporary object's parts are written first (its ETag joins
        ``conditions``, so the copy of it is of what was written)."""
        if part.parts is None:
            return part
        inner = [self._made(dst, p, conditions, temporary) for p in part.parts]
        uri = f"{dst}.part-{len(temporary) + 1}"
        temporary.append(uri)
        conditions[uri] = self._multipart(uri, inner, conditions)
        return Part(uri, 0, part.size)

    def _multipart(self, dst: str, parts: list[Part], conditions: dict[str, str],
                   metadata: dict[str, str] | None = None) -> str:
        """One multipart upload of plain ``parts`` to ``dst``; its ETag. Aborted if a part fails."""
        bucket, key = split_s3(dst)
        upload = self._call(dst, "create_multipart_upload", Bucket=bucket, Key=key, ChecksumAlgorithm="SHA256",
                            **({"Metadata": metadata} if metadata else {}))["UploadId"]
        try:
            done = [self._part(dst, upload, number, part, conditions) for number, part in enumerate(parts, 1)]
            answer = self._call(dst, "complete_multipart_upload", Bucket=bucket, Key=key, UploadId=upload,
                                MultipartUpload={"Parts": done})
        except BaseException:
            with contextlib.suppress(Exception):
                self._call(dst, "abort_multipart_upload", Bucket=bucket, Key=key, UploadId=upload)
            raise
        return str(answer.get("ETag", ""))

    def _part(self, dst: str, upload: str, number: int, part: Part, if_match: dict[str, str]) -> dict[str, Any]:
        """Copy or upload one part; its entry for CompleteMultipartUpload."""
        from botocore.exceptions import ClientError

        bucket, key = split_s3(dst)
        common = {"Bucket": bucket, "Key": key, "UploadId": upload, "PartNumber": number}
        if part.source is None:
            body = part.body()
            answer = self._call(dst, "upload_part", Body=body, ChecksumSHA256=to_s3_checksum(sha256_bytes(body)),
                                **common)
            return {"PartNumber": number, "ETag": answer["ETag"], "ChecksumSHA256": answer["ChecksumSHA256"]}
        sbucket, skey = split_s3(part.source)
        condition = {"CopySourceIfMatch": if_match[part.source]} if if_match.get(part.source) else {}
        try:
            answer = self._call(dst, "upload_part_copy", CopySource={"Bucket": sbucket, "Key": skey},
                                CopySourceRange=f"bytes={part.offset}-{part.offset + part.length - 1}", **condition,
                                **common)["CopyPartResult"]
        except ClientError as exc:
            if condition and error_code(exc) in _CONFLICT_CODES:
                raise SourceChanged(f"{part.source} changed after it was read") from exc
            raise
        entry = {"PartNumber": number, "ETag": answer["ETag"]}
        if answer.get("ChecksumSHA256"):
            entry["ChecksumSHA256"] = answer["ChecksumSHA256"]
        return entry

    def delete(self, uri: str) -> None:
        bucket, key = split_s3(uri)
        self._call(uri, "delete_object", Bucket=bucket, Key=key)

    def delete_tree(self, uri: str) -> None:
        """DeleteObjects of every key below ``uri``, 1000 at a time."""
        bucket, _ = split_s3(uri)
        batch: list[dict[str, str]] = []
        for info in self.iter_files(uri):
            batch.append({"Key": split_s3(join(uri, info.key))[1]})
            if len(batch) == 1000:
                self._call(uri, "delete_objects", Bucket=bucket, Delete={"Objects": batch})
                batch = []
        if batch:
            self._call(uri, "delete_objects", Bucket=bucket, Delete={"Objects": batch})


def _metadata_sha256(head: dict[str, Any]) -> str | None:
    """The SHA-256 ``compose`` recorded in a multipart object's metadata (64 hex digits), else None."""
    value = str((head.get("Metadata") or {}).get("sha256", "")).lower()
    return value if len(value) == 64 and all(c in "0123456789abcdef" for c in value) else None
