"""Stage 4: decide the shards of each split and their members (``members/{shard}.csv``)."""

from __future__ import annotations

import json
import os
import tempfile
from array import array
from collections import defaultdict
from typing import Any

from .. import planning
from ..config import BuildConfig
from ..documents import RowWriter, read_json, read_rows, write_json
from ..manifest import LABELS_FIELDS
from ..storage import Storage
from .staging import LABELS, MAX_MAP_LENGTH, MEMBERS, PLAN, SPLIT_SUMMARY, staged


def plan_stage(cfg: BuildConfig, storage: Storage, max_tasks: int = MAX_MAP_LENGTH) -> dict[str, Any]:
    """Plan the shards (``planning.shard_count``), deal records to them (``planning.deal``) and group
    them into at most ``max_tasks`` write tasks; returns the number of shards and of tasks.

    Memory: about 32 bytes per record (order keys, row numbers, ranks, shards), besides one shard's rows.
    """
    import numpy as np

    summary = read_json(storage, staged(cfg, SPLIT_SUMMARY))
    keys: dict[str, array[float]] = defaultdict(lambda: array("d"))
    numbers: dict[str, array[int]] = defaultdict(lambda: array("q"))
    with read_rows(storage, staged(cfg, LABELS)) as rows:
        for number, row in enumerate(rows):
            keys[row["split"]].append(planning.order_key(cfg.salt, row["sha256"]))
            numbers[row["split"]].append(number)
    rank_of = np.zeros(summary["num_records"], dtype=np.int64)  # row number -> rank in its split's order
    shard_of = np.zeros(summary["num_records"], dtype=np.int64)  # row number -> shard index in its split
    specs: dict[str, list[planning.ShardSpec]] = {}
    for split, info in summary["splits"].items():
        count = planning.shard_count(info["num_bytes"], info["num_records"], cfg.shard_size_mb)
        specs[split] = [planning.ShardSpec(split, i, count, cfg.compression) for i in range(count)]
        if split in keys:
            ranks, shards = planning.deal(np.frombuffer(keys.pop(split), dtype=np.float64), count)
            rows_of_split = np.frombuffer(numbers.pop(split), dtype=np.int64)
            rank_of[rows_of_split], shard_of[rows_of_split] = ranks, shards
    with tempfile.TemporaryDirectory() as tmp:
        _write_members(cfg, storage, specs, rank_of, shard_of, tmp)
    shard_files = [spec.file for split in specs.values() for spec in split]
    tasks = planning.group_tasks(shard_files, max_tasks)
    plan = {"compression": cfg.compression, "shard_size_mb": cfg.shard_size_mb, "tasks": tasks,
            "splits": {split: [spec.file for spec in s] for split, s in specs.items()}}
    write_json(storage, staged(cfg, PLAN), plan)
    return {"num_shards": len(shard_files), "num_tasks": len(tasks)}


def _write_members(cfg: BuildConfig, storage: Storage, specs: dict[str, list[planning.ShardSpec]],
                   rank_of: Any, shard_of: Any, tmp: str) -> None:
    """Stage each shard's member rows (labels.csv rows, in rank order) as ``members/{shard}.csv``."""
    buffers: dict[str, list[str]] = defaultdict(list)

    def flush() -> None:
        for shard, lines in buffers.items():
            with open(os.path.join(tmp, shard), "a", encoding="utf-8") as f:
                f.writelines(lines)
        buffers.clear()

    with read_rows(storage, staged(cfg, LABELS)) as rows:
        for number, row in enumerate(rows):
            shard = specs[row["split"]][int(shard_of[number])].file
            buffers[shard].append(json.dumps([int(rank_of[number]), row]) + "\n")
            if number % 5_000 == 4_999:
                flush()
    flush()
    for shard in sorted(os.listdir(tmp)):
        with open(os.path.join(tmp, shard), encoding="utf-8") as f:
            members = sorted(json.loads(line) for line in f)  # one shard's rows: bounded by the shard size
        with RowWriter(storage, staged(cfg, MEMBERS, shard + ".csv"), LABELS_FIELDS) as out:
            for _, row in members:
                out.write(row)


def task_shards(cfg: BuildConfig, storage: Storage, task_index: int) -> list[str]:
    """The shard files that write task ``task_index`` produces."""
    return read_json(storage, staged(cfg, PLAN))["tasks"][task_index]


def all_shards(cfg: BuildConfig, storage: Storage) -> list[str]:
    """Every planned shard file, in plan order."""
    return [shard for task in read_json(storage, staged(cfg, PLAN))["tasks"] for shard in task]
