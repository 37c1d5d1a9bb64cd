"""The errors this package raises on purpose: each says in one line what is wrong, and whether
trying again later can help (``retryable``).

The CLI prints any ``ImageTfrecordsError`` as one line; the DAG fails a task at once for one that
is not retryable and lets Airflow retry the others. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import re

_OBJECT_REPR = re.compile(r" ?<[^<>]* at 0x[0-9a-fA-F]+>")


class ImageTfrecordsError(Exception):
    """Base of every error meant for the user. ``retryable``: whether a later attempt may succeed."""

    retryable = False


class ConfigError(ImageTfrecordsError, ValueError):
    """A parameter or location is invalid (exit status 2 on the command line)."""


class BuildError(ImageTfrecordsError):
    """The build cannot go on with this input (no images, a failed check, a changed source)."""


class GateTripped(BuildError):
    """The publish gate tripped (``rules.publish_gate``) and nobody accepted it: nothing is published.
    ``report``: the gate's report, several lines; the message is one."""

    def __init__(self, message: str, report: str = "") -> None:
        super().__init__(message)
        self.report = report


class StorageError(ImageTfrecordsError):
    """A store operation failed for a reason retrying will not fix (missing bucket, credentials)."""


class SourceChanged(StorageError):
    """An object a server-side copy was to take bytes from is no longer the version that was read."""


class StoreBusy(ImageTfrecordsError):
    """A store object kept changing under us (e.g. ``latest.json`` contended); a retry may pass."""

    retryable = True


class StoreUnreachable(ImageTfrecordsError):
    """The S3 endpoint does not answer, fails, or its bytes do not arrive intact; retrying later may help
    (Airflow retries these)."""

    retryable = True


class LockHeld(ImageTfrecordsError):
    """Another build holds this version's lock."""


class DamagedFile(ImageTfrecordsError, ValueError):
    """A published or staged file that cannot be parsed (a manifest that is not JSON, say)."""


class NotPublishedError(ImageTfrecordsError, ValueError):
    """The URI is not a published version (no ``_SUCCESS``) nor a dataset with a ``latest.json``."""


class ShardChecksumError(ImageTfrecordsError, ValueError):
    """A shard's bytes do not hash to the SHA-256 the manifest lists."""


class RejectedImage(Exception):
    """A file that will not become a record (a row of rejects.csv, not an error): ``reason`` is a short
    machine-readable word."""

    def __init__(self, reason: str, detail: str = "") -> None:
        detail = _OBJECT_REPR.sub("", detail)  # no memory addresses: rejects.csv must be reproducible
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail
