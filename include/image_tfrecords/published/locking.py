"""One build per version at a time: a lock object with a lease in the version's staging prefix.

Two builds of the same dataset version (two command-line runs, two DAG runs given the same
``version``, or one of each) would write the same staging files. The first takes
``DEST/DATASET/_staging/VERSION/_LOCK.json`` with a conditional write (S3 ``If-None-Match``/``If-Match``;
a folder lock locally), naming its owner and when its lease expires; the holder renews it; the other
build fails at once with one line naming the holder. A lease that expired, or one held by a
command-line process on this machine that no longer runs (killed with SIGKILL), is taken over.
Publishing deletes the staging prefix, lock included.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

from ..errors import LockHeld
from ..storage import Storage, join

LOCK_FILE = "_LOCK.json"
CLI_LEASE_SECONDS = 600.0
DAG_LEASE_SECONDS = 6 * 3600.0




def lock_uri(staging_uri: str) -> str:
    return join(staging_uri, LOCK_FILE)


def _parse(data: bytes | None) -> dict[str, Any] | None:
    if not data:
        return None
    try:
        record = json.loads(data)
        return record if isinstance(record, dict) and "owner" in record and "expires" in record else None
    except ValueError:
        return None  # a damaged lock protects nothing: it is replaced


def _process_gone(record: dict[str, Any]) -> bool:
    """True if the lock belongs to a process of this machine that no longer runs (only for locks
    bound to one process: a DAG run's tasks run in many processes)."""
    if not record.get("pid_bound") or record.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, TypeError):
        return False
    return False


def is_live(record: dict[str, Any] | None, now: float | None = None) -> bool:
    """True if ``record`` is a lock that still protects its version."""
    if record is None:
        return False
    return float(record["expires"]) > (time.time() if now is None else now) and not _process_gone(record)


def describe(record: dict[str, Any]) -> str:
    until = datetime.fromtimestamp(float(record["expires"]), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{record['owner']} (host {record.get('host', '?')}, pid {record.get('pid', '?')}, lease until {until})"


def read_lock(storage: Storage, staging_uri: str) -> dict[str, Any] | None:
    return _parse(storage.read_with_tag(lock_uri(staging_uri))[0])


def hold(storage: Storage, staging_uri: str, owner: str, lease_seconds: float, pid_bound: bool = False,
         attempts: int = 20) -> dict[str, Any]:
    """Take or renew the lock for ``owner``; raise LockHeld if another owner's lease is live.

    A lease of the same owner with more than half its time left is not rewritten (mapped tasks
    call this at once: most of them only read).
    """
    uri = lock_uri(staging_uri)
    for _ in range(attempts):
        data, tag = storage.read_with_tag(uri)
        current = _parse(data)
        now = time.time()
        if current is not None and current["owner"] != owner and is_live(current, now):
            raise LockHeld(f"another build holds this version: {describe(current)}")
        if current is not None and current["owner"] == owner and float(current["expires"]) - now > lease_seconds / 2:
            return current
        record = {"owner": owner, "host": socket.gethostname(), "pid": os.getpid(), "pid_bound": pid_bound,
                  "expires": now + lease_seconds,
                  "renewed": datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
        if storage.write_if_unchanged(uri, (json.dumps(record, sort_keys=True) + "\n").encode(), tag):
            return record
    raise LockHeld(f"the lock {uri} kept changing while it was being taken")


def release(storage: Storage, staging_uri: str, owner: str) -> None:
    """Drop the lock if ``owner`` holds it (the staging files stay)."""
    current = read_lock(storage, staging_uri)
    if current is not None and current["owner"] == owner:
        storage.delete(lock_uri(staging_uri))


class LeaseKeeper:
    """Holds a lock for one process: takes it, renews it in a daemon thread, releases it."""

    def __init__(self, storage: Storage, staging_uri: str, owner: str | None = None,
                 lease_seconds: float = CLI_LEASE_SECONDS) -> None:
        self.storage, self.staging_uri, self.lease_seconds = storage, staging_uri, lease_seconds
        self.owner = owner or f"cli:{socket.gethostname()}:{os.getpid()}:{os.urandom(4).hex()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None  # why renewing failed, if it did

    def __enter__(self) -> LeaseKeeper:
        hold(self.storage, self.staging_uri, self.owner, self.lease_seconds, pid_bound=True)
        self._thread = threading.Thread(target=self._renew, name="lease-keeper", daemon=True)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            try:
                hold(self.storage, self.staging_uri, self.owner, self.lease_seconds, pid_bound=True)
            except Exception as exc:  # reported by the build, never a crash in a thread
                self.lost = str(exc)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # staging may be gone already (published), or the store is down
            release(self.storage, self.staging_uri, self.owner)
