"""Stage 5: write each planned shard (and its ``.tfindex``) into staging, then check it.

A write task writes its shards one after another; each shard is checked right after it is
staged by ``validate.validate_shard`` (an independent re-read from the store), so the reduce
step that follows only adds up per-shard results.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any

from .. import layout
from ..config import BuildConfig
from ..documents import read_json, read_rows, write_json
from ..errors import BuildError
from ..example import encode_example
from ..manifest import example_features
from ..parallel import ordered_map
from ..probe import RejectedImage, stored_bytes
from ..reading import read_source
from ..storage import HashingWriter, Storage
from ..tfrecord import TFRecordWriter
from .plan import task_shards
from .staging import MEMBERS, RECEIPTS, SHARDS, TMP_PREFIX, Progress, no_progress, staged
from .validate import validate_shard


def write_task(cfg: BuildConfig, storage: Storage, task_index: int, progress: Progress = no_progress,
               read_workers: int = 4) -> list[dict[str, Any]]:
    """Write and check every shard of one write task; returns their small results."""
    return [write_and_check(cfg, storage, shard, progress, read_workers)
            for shard in task_shards(cfg, storage, task_index)]


def write_and_check(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress = no_progress,
                    read_workers: int = 4) -> dict[str, Any]:
    """Write one shard, then re-read and check it (the result is staged for the validate stage)."""
    write_shard(cfg, storage, shard, progress, read_workers)
    return validate_shard(cfg, storage, shard)


def write_shard(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress = no_progress,
                read_workers: int = 4) -> dict[str, Any]:
    """Write one shard from its member list and stage it whole; skip if already staged identically."""
    members_uri = staged(cfg, MEMBERS, shard + ".csv")
    receipt_uri = staged(cfg, RECEIPTS, shard + ".json")
    members_sha = hashlib.sha256(storage.read_bytes(members_uri)).hexdigest()
    if storage.exists(receipt_uri):
        receipt = read_json(storage, receipt_uri)
        if receipt.get("members_sha256") == members_sha and \
                storage.sha256_of(staged(cfg, SHARDS, shard)) == receipt["sha256"] and \
                storage.sha256_of(staged(cfg, SHARDS, layout.index_file(shard))) == receipt.get("index_sha256"):
            progress(receipt["num_records"])
            return receipt

    def fetch(row: dict[str, str]) -> tuple[dict[str, str], bytes]:
        try:
            return row, read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
        except RejectedImage as exc:
            raise BuildError(f"{row['filename']} changed since it was inspected ({exc}); rerun the build") from None

    with tempfile.TemporaryDirectory(dir=storage.scratch_dir(staged(cfg, SHARDS)), prefix=TMP_PREFIX) as tmp:
        path = os.path.join(tmp, shard)
        with read_rows(storage, members_uri) as rows, open(path, "wb") as file, \
                TFRecordWriter(raw := HashingWriter(file), cfg.compression) as writer:
            for row, data in ordered_map(fetch, rows, read_workers):
                if hashlib.sha256(data).hexdigest() != row["sha256"]:
                    raise BuildError(f"{row['filename']} changed since it was inspected; rerun the build")
                try:
                    encoded = stored_bytes(data, row, cfg.max_pixels)
                except (ValueError, RejectedImage) as exc:
                    raise BuildError(f"{row['filename']}: {exc}") from exc
                writer.write(encode_example(example_features(row, encoded)))
                progress(1)
        index = writer.index()
        receipt = {"file": shard, "num_records": writer.num_records, "num_bytes": raw.num_bytes,
                   "sha256": raw.sha256.hexdigest(), "members_sha256": members_sha,
                   "index_sha256": hashlib.sha256(index).hexdigest()}
        storage.write_bytes(staged(cfg, SHARDS, layout.index_file(shard)), index)
        storage.upload(path, staged(cfg, SHARDS, shard), receipt["sha256"])
    write_json(storage, receipt_uri, receipt)
    return receipt
