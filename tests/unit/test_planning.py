"""Shard planning: shard counts, file names, dealing records to shards, grouping shards into tasks."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest

from image_tfrecords.rules.shards import MB, ShardSpec, deal, group_tasks, order_key, shard_count


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


def _keys(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return [rng.random() for _ in range(n)]


@pytest.mark.parametrize("n,shards", [(1, 1), (10, 3), (100, 7), (1000, 1), (1001, 10), (5, 5), (12345, 64)])
def test_deal_is_balanced(n: int, shards: int) -> None:
    ranks, placement = deal(_keys(n), shards)
    assert sorted(ranks.tolist()) == list(range(n))
    counts = Counter(placement.tolist())
    assert set(counts) == set(range(min(n, shards)))
    assert max(counts.values()) - min(counts.values()) <= 1


def test_deal_is_round_robin_in_key_order() -> None:
    keys = _keys(50)
    ranks, placement = deal(keys, 4)
    by_key = [row for _, row in sorted((key, row) for row, key in enumerate(keys))]
    assert [int(ranks[row]) for row in by_key] == list(range(50))
    assert [int(placement[row]) for row in by_key] == [rank % 4 for rank in range(50)]


def test_deal_breaks_ties_by_row_number() -> None:
    ranks, placement = deal([0.5, 0.25, 0.5, 0.25], 2)
    assert ranks.tolist() == [2, 0, 3, 1]
    assert placement.tolist() == [0, 0, 1, 1]


def test_deal_is_deterministic() -> None:
    keys = _keys(500)
    first, second = deal(keys, 7), deal(list(keys), 7)
    assert first[0].tolist() == second[0].tolist() and first[1].tolist() == second[1].tolist()


def test_deal_empty() -> None:
    ranks, placement = deal([], 3)
    assert len(ranks) == 0 and len(placement) == 0


def test_plan_stage_stages_the_members_deal_decides(sample_dir, tmp_path) -> None:
    """The shards production plans are the ones ``deal`` gives, in rank order (no separate rule)."""
    import csv

    from image_tfrecords import stages
    from image_tfrecords.config import BuildConfig
    from image_tfrecords.storage import Storage

    cfg = BuildConfig(source=str(sample_dir), destination=str(tmp_path), dataset="d", version="v1",
                      shard_size_mb=0.01, salt="s")
    storage = Storage()
    for stage in (stages.discover_stage, stages.inspect_stage, stages.split_stage, stages.plan_stage):
        stage(cfg, storage)
    staging = tmp_path / "d" / "_staging" / "v1"
    with open(staging / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    plan = __import__("json").loads((staging / "plan.json").read_text())
    assert len(plan["splits"]["train"]) >= 3, "several shards in a split, or this test means nothing"
    for split, files in plan["splits"].items():
        members = [r["filename"] for r in rows if r["split"] == split]
        keys = [order_key("s", r["sha256"]) for r in rows if r["split"] == split]
        ranks, placement = deal(keys, len(files))
        for index, shard in enumerate(files):
            with open(staging / "members" / f"{shard}.csv", newline="") as f:
                staged = [r["filename"] for r in csv.DictReader(f)]
            expected = sorted((int(ranks[i]), name) for i, name in enumerate(members) if placement[i] == index)
            assert staged == [name for _, name in expected], shard


def test_order_key_is_deterministic_salted_and_not_the_split_hash() -> None:
    from image_tfrecords.rules.splits import unit_hash

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
