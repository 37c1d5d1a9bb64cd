"""Stage 2: hash, identify and fully decode every candidate (the label CSV's facts)."""

from __future__ import annotations

from concurrent.futures import Executor
from functools import partial
from typing import Any

from ..config import BuildConfig
from ..documents import RowWriter, read_rows
from ..manifest import REJECTS_FIELDS
from ..parallel import batched_map, ordered_map
from ..probe import RejectedImage, inspect_image
from ..reading import read_source
from ..storage import Storage
from .staging import DISCOVERED, INSPECT_REJECTS, INSPECTED, INSPECTED_FIELDS, Progress, no_progress, staged


def inspect_one(storage: Storage, cfg: BuildConfig, row: dict[str, str]) -> dict[str, Any]:
    """One candidate's facts, or its reject row."""
    try:
        data = read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
        facts = inspect_image(data, cfg.max_pixels)
    except RejectedImage as exc:
        return {"filename": row["filename"], "reason": exc.reason, "detail": exc.detail}
    return {"filename": row["filename"], "label": row["label"], **vars(facts)}


def inspect_stage(cfg: BuildConfig, storage: Storage, workers: int = 4, progress: Progress = no_progress,
                  processes: Executor | None = None) -> dict[str, Any]:
    """Inspect every candidate, in listing order.

    Runs on ``workers`` threads (decoders release the GIL), or on the ``processes`` pool (with
    ``workers`` processes) when given, which also spreads the per-file Python work.
    """
    inspect = partial(inspect_one, storage, cfg)
    with read_rows(storage, staged(cfg, DISCOVERED)) as rows, \
            RowWriter(storage, staged(cfg, INSPECTED), INSPECTED_FIELDS) as good, \
            RowWriter(storage, staged(cfg, INSPECT_REJECTS), REJECTS_FIELDS) as rejects:
        results = batched_map(inspect, rows, processes, workers) if processes else ordered_map(inspect, rows, workers)
        for result in results:
            (rejects if "reason" in result else good).write(result)
            progress(1)
    return {"inspected": good.count, "rejected": rejects.count}
