"""Shard planning: shard counts, file names, dealing records to shards, grouping shards into tasks."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest

from image_tfrecords.planning import MB, ShardSpec, deal, group_tasks, order_key, shard_count


@pytest.mark.parametrize("total_bytes,num_records,size_mb,expected", [
    (0, 0, 100, 0),
    (10**12, 0, 100, 0),
    (0, 5, 100, 1),
    (1, 1, 100, 1),
    (100 * MB, 1000, 100, 1),
    (100 * MB + 1, 1000, 100, 2),
    (250 * MB, 1000, 100, 3),
    (300 * MB, 1000, 100, 3),
    (300 * MB + 1, 1000, 100, 4),
    (10 * 1000 * MB, 5, 100, 5),  # never more shards than records
    (10 * 1000 * MB, 1, 0.001, 1),
    (3 * MB, 100, 0.5, 6),
    (3 * MB + 1, 100, 0.5, 7),
    (4096 * MB * 2, 10**6, 4096, 2),
])
def test_shard_count(total_bytes: int, num_records: int, size_mb: float, expected: int) -> None:
    assert shard_count(total_bytes, num_records, size_mb) == expected


def test_shard_count_is_ceil_of_bytes_over_size() -> None:
    rng = random.Random(0)
    for _ in range(2000):
        records = rng.randint(1, 10_000)
        total = rng.randint(0, 5 * 10**9)
        size = rng.choice([1, 10, 64, 100, 256, 0.5])
        count = shard_count(total, records, size)
        assert 1 <= count <= records
        if count < records:
            assert (count - 1) * size * MB < total <= count * size * MB or (total == 0 and count == 1)


@pytest.mark.parametrize("spec,expected", [
    (ShardSpec("train", 0, 3, "none"), "train-00000-of-00003.tfrecord"),
    (ShardSpec("train", 2, 3, "gzip"), "train-00002-of-00003.tfrecord.gz"),
    (ShardSpec("validation", 41, 100, "none"), "validation-00041-of-00100.tfrecord"),
    (ShardSpec("test", 99999, 100000, "gzip"), "test-99999-of-100000.tfrecord.gz"),
])
def test_shard_file_names(spec: ShardSpec, expected: str) -> None:
    assert spec.file == expected


def test_shard_file_names_sort_in_index_order() -> None:
    files = [ShardSpec("train", i, 1500, "none").file for i in range(1500)]
    assert sorted(files) == files
    assert len(set(files)) == 1500


def _keys(n: int, seed: int = 0) -> list[tuple[float, int]]:
    rng = random.Random(seed)
    return [(rng.random(), row) for row in range(n)]


@pytest.mark.parametrize("n,shards", [(1, 1), (10, 3), (100, 7), (1000, 1), (1001, 10), (5, 5), (12345, 64)])
def test_deal_is_balanced(n: int, shards: int) -> None:
    placement = deal(_keys(n), shards)
    assert sorted(placement) == list(range(n))
    counts = Counter(placement.values())
    assert set(counts) == set(range(min(n, shards)))
    assert max(counts.values()) - min(counts.values()) <= 1


def test_deal_is_round_robin_in_key_order() -> None:
    keys = _keys(50)
    placement = deal(keys, 4)
    by_key = [row for _, row in sorted(keys)]
    assert [placement[row] for row in by_key] == [rank % 4 for rank in range(50)]


def test_deal_is_deterministic_and_ignores_input_order() -> None:
    keys = _keys(500)
    expected = deal(keys, 7)
    shuffled = list(keys)
    random.Random(1).shuffle(shuffled)
    assert deal(shuffled, 7) == expected
    assert deal(iter(keys), 7) == expected


def test_deal_empty() -> None:
    assert deal([], 3) == {}


def test_order_key_is_deterministic_salted_and_not_the_split_hash() -> None:
    from image_tfrecords.splitting import unit_hash

    shas = [hashlib.sha256(bytes([i])).hexdigest() for i in range(200)]
    first = [order_key("s", sha) for sha in shas]
    assert first == [order_key("s", sha) for sha in shas]
    assert all(0 <= k < 1 for k in first)
    assert first != [order_key("t", sha) for sha in shas]
    assert first != [unit_hash("split", "s", sha) for sha in shas]


@pytest.mark.parametrize("n", [0, 1, 5, 1023, 1024, 1025, 2047, 2048, 2049, 5000])
@pytest.mark.parametrize("max_tasks", [1, 3, 1024])
def test_group_tasks(n: int, max_tasks: int) -> None:
    names = [f"shard-{i:05d}" for i in range(n)]
    groups = group_tasks(names, max_tasks)
    assert len(groups) <= max_tasks
    assert all(groups), "no empty task"
    assert [name for group in groups for name in group] == names  # order kept, each exactly once
    assert len(groups) == min(n, max_tasks)  # one shard per task while they fit, else max_tasks tasks
    sizes = [len(g) for g in groups]
    if sizes:
        assert max(sizes) - min(sizes) <= 1  # balanced


@pytest.mark.parametrize("n", [1, 5, 1024])
def test_group_tasks_one_shard_per_task_when_they_fit(n: int) -> None:
    names = [f"s{i}" for i in range(n)]
    assert group_tasks(names, 1024) == [[name] for name in names]


def test_group_tasks_over_the_limit() -> None:
    names = [f"s{i}" for i in range(5000)]
    groups = group_tasks(names, 1024)
    assert len(groups) == 1024
    assert {len(g) for g in groups} == {4, 5}
