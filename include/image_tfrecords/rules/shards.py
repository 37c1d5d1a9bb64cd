"""Shard planning: how many shards per split, which records go where, in which order.

Per split, the shard count is ``ceil(total image bytes / shard size)`` (at most one shard per
record). Records are ordered by a salted hash of their content (a deterministic shuffle: classes
are interleaved and the order never depends on listing order) and dealt round-robin, so shards
are balanced in count and never empty. Shards are grouped into at most ``max_tasks`` write tasks.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..published.layout import shard_file
from .splits import unit_hash

if TYPE_CHECKING:
    import numpy as np

MB = 1_000_000


@dataclass(frozen=True)
class ShardSpec:
    split: str
    index: int
    count: int
    compression: str

    @property
    def file(self) -> str:
        """``{split}-{index:05d}-of-{count:05d}.tfrecord[.gz]``."""
        return shard_file(self.split, self.index, self.count, self.compression)


def shard_count(total_bytes: int, num_records: int, shard_size_mb: float) -> int:
    """Shards needed so each holds about ``shard_size_mb`` MB (1 MB = 10^6 bytes)."""
    if num_records == 0:
        return 0
    return max(1, min(num_records, math.ceil(total_bytes / (shard_size_mb * MB))))


def order_key(salt: str, sha256: str) -> float:
    """Position of a record in its split's shuffled order."""
    return unit_hash("order", salt, sha256)


def deal(keys: Sequence[float], num_shards: int) -> tuple[np.ndarray, np.ndarray]:
    """Deal one split's records to its shards: ``(ranks, shards)``, one entry per record.

    ``keys[i]`` is record ``i``'s order key (records in labels.csv order). A record's rank is its
    position in the split sorted by (key, i); rank ``r`` goes to shard ``r % num_shards`` (round
    robin), and within a shard records are written in rank order. 16 bytes per record.
    """
    import numpy as np

    order = np.argsort(np.asarray(keys, dtype=np.float64), kind="stable")
    ranks = np.empty(len(order), dtype=np.int64)
    ranks[order] = np.arange(len(order), dtype=np.int64)
    return ranks, ranks % max(1, num_shards)


def runs_of(positions: Any) -> list[list[int]]:
    """Sorted places ``positions`` (a sequence or numpy array of ints) as ``[start, stop)`` runs of consecutive
    places: the kept records of a base shard, as a plan's rewrite (and a copy made ahead of it) gives them."""
    import numpy as np

    positions = np.asarray(positions, dtype=np.int64)
    if not len(positions):
        return []
    breaks = np.flatnonzero(np.diff(positions) != 1) + 1
    starts = np.concatenate(([0], breaks))
    stops = np.concatenate((breaks, [len(positions)]))
    return [[int(positions[a]), int(positions[b - 1]) + 1] for a, b in zip(starts, stops, strict=True)]


def group_tasks(shard_files: list[str], max_tasks: int) -> list[list[str]]:
    """Split shard names into at most ``max_tasks`` contiguous groups of near-equal size."""
    count = min(len(shard_files), max_tasks)
    n = len(shard_files)
    return [shard_files[i * n // count : (i + 1) * n // count] for i in range(count)]
