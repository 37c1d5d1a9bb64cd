"""Stage 2: hash, identify and fully decode every candidate (the label CSV's facts).

A file the previous version inspected, with the same name, size and stamp, is not read again:
its row of the previous ``inspected.csv`` is taken over (``incremental``).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from concurrent.futures import Executor
from functools import partial
from typing import Any

from ..config import BuildConfig
from ..documents import RowWriter, read_json, write_json
from ..incremental import INSPECTION_FIELDS, base_of, inspections, why_not_reuse_inspection
from ..manifest import REJECTS_FIELDS
from ..parallel import batched_map, ordered_map
from ..probe import RejectedImage, inspect_image
from ..reading import read_source
from ..storage import Storage
from .staging import (
    DISCOVER_SUMMARY,
    DISCOVERED,
    IMAGE_FIELDS,
    IMAGES,
    INSPECT_REJECTS,
    INSPECT_SUMMARY,
    INSPECTED,
    Progress,
    no_progress,
    staged,
)


def inspect_one(storage: Storage, cfg: BuildConfig, row: dict[str, str]) -> dict[str, Any]:
    """One candidate's facts, or its reject row."""
    try:
        data = read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
        facts = inspect_image(data, cfg.max_pixels)
    except RejectedImage as exc:
        return {"filename": row["filename"], "reason": exc.reason, "detail": exc.detail}
    return {"filename": row["filename"], "label": row["label"], **vars(facts)}


def _carried(row: dict[str, str], known: dict[str, str]) -> dict[str, Any]:
    """The previous inspection of an unchanged file, as ``inspect_one`` would return it now."""
    if known.get("reason"):
        return {"filename": row["filename"], "reason": known["reason"], "detail": known.get("detail", "")}
    return {**{k: known[k] for k in IMAGE_FIELDS if k in known}, "filename": row["filename"],
            "label": row["label"]}


def inspect_stage(cfg: BuildConfig, storage: Storage, workers: int = 4, progress: Progress = no_progress,
                  processes: Executor | None = None) -> dict[str, Any]:
    """Inspect every candidate (or take its previous inspection over), in listing order.

    Runs on ``workers`` threads (decoders release the GIL), or on the ``processes`` pool (with
    ``workers`` processes) when given, which also spreads the per-file Python work.
    """
    base = base_of(cfg, storage, read_json(storage, staged(cfg, DISCOVER_SUMMARY))["previous_version"])
    why_not = why_not_reuse_inspection(cfg, base)
    inspect = partial(inspect_one, storage, cfg)
    read = {"files": 0, "bytes": 0}
    with tempfile.TemporaryDirectory() as tmp, \
            inspections(storage, None if why_not else base, staged(cfg, DISCOVERED), tmp) as known, \
            RowWriter(storage, staged(cfg, IMAGES), IMAGE_FIELDS) as good, \
            RowWriter(storage, staged(cfg, INSPECT_REJECTS), REJECTS_FIELDS) as rejects, \
            RowWriter(storage, staged(cfg, INSPECTED), INSPECTION_FIELDS) as inspection:

        def to_read() -> Iterator[dict[str, str]]:
            for row in known.unread():
                read["files"] += 1
                read["bytes"] += int(row["num_bytes"])
                yield row

        fresh = batched_map(inspect, to_read(), processes, workers) if processes else \
            ordered_map(inspect, to_read(), workers)
        for row, before in known.all():
            result = next(fresh) if before is None else _carried(row, before)
            (rejects if "reason" in result else good).write(result)
            inspection.write({**result, "num_bytes": row["num_bytes"], "stamp": row["stamp"]})
            progress(1)
    summary = {"inspected": good.count, "rejected": rejects.count, "files_read": read["files"],
               "bytes_read": read["bytes"], "files_reused": good.count + rejects.count - read["files"],
               "base_version": base.version if base else None, "not_reused_because": why_not}
    write_json(storage, staged(cfg, INSPECT_SUMMARY), summary)
    return {key: summary[key] for key in ("inspected", "rejected", "files_read", "files_reused")}
