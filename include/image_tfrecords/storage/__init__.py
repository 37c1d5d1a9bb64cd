"""One storage interface for local folders and ``s3://bucket/prefix`` URIs.

``Storage`` (facade.py) is what callers use: it picks the store for a URI and delegates to it.
``Store`` (base.py) is the interface, with ``LocalStore`` (local.py) and ``S3Store`` (s3.py) as its
implementations; deadlines.py holds the deadlines of S3 calls and the translation of their failures.

Every write is atomic: local files go to a temporary name and are renamed; S3 objects are single
PUTs that carry a SHA-256 the server verifies (a mismatch is rejected, never stored).
"""

from ..errors import StorageError, StoreUnreachable
from .base import (
    FileInfo,
    HashingReader,
    HashingWriter,
    Store,
    from_s3_checksum,
    is_s3,
    join,
    sha256_file,
    split_s3,
    to_s3_checksum,
)
from .deadlines import DEADLINE_ENV, MIN_RATE_ENV, TIMEOUT_ENV, DeadlineBody, deadline_seconds
from .facade import Storage
from .local import LocalStore
from .multipart import Segment
from .s3 import ClientFactory, S3Store, default_s3_client

__all__ = [
    "DEADLINE_ENV",
    "MIN_RATE_ENV",
    "TIMEOUT_ENV",
    "ClientFactory",
    "DeadlineBody",
    "FileInfo",
    "HashingReader",
    "HashingWriter",
    "LocalStore",
    "S3Store",
    "Segment",
    "Storage",
    "StorageError",
    "Store",
    "StoreUnreachable",
    "deadline_seconds",
    "default_s3_client",
    "from_s3_checksum",
    "is_s3",
    "join",
    "sha256_file",
    "split_s3",
    "to_s3_checksum",
]
