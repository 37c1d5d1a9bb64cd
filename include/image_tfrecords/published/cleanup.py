"""Remove the staging files of builds that never published.

A failed or interrupted build keeps ``DEST/DATASET/_staging/VERSION/`` so that a rerun of the same
version resumes (finished shards are reused) and so that its ``rejects.csv`` can be read. Nothing
else ever needs them: ``clean`` removes those older than a grace period. It only ever deletes under
``_staging/``, never a published version, and never a version whose lock is live (a build in progress).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import defaultdict
from typing import Any

from ..storage import Storage, is_s3, join
from .layout import STAGING
from .locking import LOCK_FILE, is_live, read_lock


def staging_root(dataset_uri: str) -> str:
    """``DEST/DATASET/_staging``: where every build in progress keeps its files."""
    return join(dataset_uri, STAGING)


def stale_staging(storage: Storage, dataset_uri: str, older_than_seconds: float,
                  now: float | None = None) -> list[dict[str, Any]]:
    """Every staged version with its size, age and what ``clean`` does with it (``remove`` or why it keeps it)."""
    root = staging_root(dataset_uri)
    if not is_s3(root) and not os.path.isdir(root):
        return []
    now = time.time() if now is None else now
    files: dict[str, int] = defaultdict(int)
    size: dict[str, int] = defaultdict(int)
    newest: dict[str, float] = {}
    for info in storage.iter_files(root, everything=True):
        version = info.key.split("/", 1)[0]
        files[version] += 1
        size[version] += info.size
        if info.key != f"{version}/{LOCK_FILE}":  # the lock is renewed: its age says nothing of the files
            newest[version] = max(newest.get(version, 0.0), info.modified_at().timestamp())
    report = []
    for version in sorted(files):
        age = now - newest.get(version, 0.0)
        lock = read_lock(storage, join(root, version))
        action = "remove"
        if is_live(lock, now):
            action = "keep: a build holds its lock"
        elif age < older_than_seconds:
            action = f"keep: changed {age / 3600:.1f} h ago (grace {older_than_seconds / 3600:g} h)"
        report.append({"version": version, "uri": join(root, version), "files": files[version],
                       "bytes": size[version], "age_hours": round(age / 3600, 2), "action": action})
    return report


def clean_staging(storage: Storage, dataset_uri: str, older_than_seconds: float,
                  dry_run: bool = False) -> list[dict[str, Any]]:
    """Delete the staging of versions that ``stale_staging`` marks ``remove``; returns the report."""
    report = stale_staging(storage, dataset_uri, older_than_seconds)
    if not dry_run:
        for entry in report:
            if entry["action"] == "remove":
                storage.delete_tree(entry["uri"])
        root = staging_root(dataset_uri)
        if not is_s3(root):
            with contextlib.suppress(OSError):
                os.rmdir(root)  # only if nothing is left
    return report
