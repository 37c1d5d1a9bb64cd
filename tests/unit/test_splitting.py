"""Deterministic split assignment and duplicate resolution."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest

from image_tfrecords.rules.splits import DuplicateResolver, assign_split, assign_splits, unit_hash, unit_points

SPLITS = {"train": 0.7, "validation": 0.2, "test": 0.1}


def _hashes(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [hashlib.sha256(rng.randbytes(16)).hexdigest() for _ in range(count)]


HASHES = _hashes(20_000)


def test_unit_hash_is_in_unit_interval_and_deterministic() -> None:
    values = [unit_hash("split", "salt", h) for h in HASHES[:2000]]
    assert all(0.0 <= v < 1.0 for v in values)
    assert values == [unit_hash("split", "salt", h) for h in HASHES[:2000]]
    assert len(set(values)) == len(values)


def test_unit_hash_separates_parts() -> None:
    # NUL-separated: moving text between parts changes the value.
    assert unit_hash("ab", "c") != unit_hash("a", "bc")
    assert unit_hash("split", "", "x") != unit_hash("split", "x", "")


def test_unit_hash_known_value() -> None:
    digest = hashlib.sha256(b"split\0salt\0abc").digest()
    assert unit_hash("split", "salt", "abc") == int.from_bytes(digest[:8], "big") / 2**64


def test_assign_split_is_deterministic() -> None:
    first = [assign_split(h, "s1", SPLITS) for h in HASHES[:1000]]
    assert first == [assign_split(h, "s1", dict(SPLITS)) for h in HASHES[:1000]]
    assert set(first) <= set(SPLITS)


def test_assign_split_depends_on_salt() -> None:
    a = [assign_split(h, "salt-a", SPLITS) for h in HASHES[:2000]]
    b = [assign_split(h, "salt-b", SPLITS) for h in HASHES[:2000]]
    changed = sum(x != y for x, y in zip(a, b, strict=True)) / len(a)
    # Independent draws with 0.7/0.2/0.1 differ with probability 1 - (0.49 + 0.04 + 0.01) = 0.46.
    assert 0.40 < changed < 0.52


@pytest.mark.parametrize("splits", [
    SPLITS,
    {"train": 0.8, "validation": 0.1, "test": 0.1},
    {"a": 0.5, "b": 0.5},
    {"test": 0.1, "validation": 0.2, "train": 0.7},
    {"x": 0.25, "y": 0.25, "z": 0.25, "w": 0.25},
])
def test_assign_split_follows_fractions(splits: dict[str, float]) -> None:
    counts = Counter(assign_split(h, "", splits) for h in HASHES)
    assert set(counts) == set(splits)
    for name, fraction in splits.items():
        assert abs(counts[name] / len(HASHES) - fraction) < 0.02, (name, counts)


def test_split_with_fraction_one_gets_everything() -> None:
    assert {assign_split(h, "any", {"all": 1.0}) for h in HASHES[:5000]} == {"all"}


def test_split_order_is_significant() -> None:
    forward = [assign_split(h, "", {"a": 0.5, "b": 0.5}) for h in HASHES[:2000]]
    backward = [assign_split(h, "", {"b": 0.5, "a": 0.5}) for h in HASHES[:2000]]
    assert forward != backward


def test_fractions_summing_just_under_one_never_fall_off_the_end() -> None:
    splits = {"a": 0.3333333, "b": 0.3333333, "c": 0.3333333}
    assert {assign_split(h, "", splits) for h in HASHES} == {"a", "b", "c"}


def test_assignment_is_independent_of_other_images() -> None:
    a_set, b_set = HASHES[:3000], _hashes(3000, seed=99)
    alone = {h: assign_split(h, "salt", SPLITS) for h in a_set}
    together = {h: assign_split(h, "salt", SPLITS) for h in [*b_set, *a_set, *b_set]}
    assert {h: together[h] for h in a_set} == alone


def test_assignment_is_monotone_in_fractions() -> None:
    # Growing the first split only moves images into it, never between the others.
    small = {h: assign_split(h, "", {"train": 0.6, "test": 0.4}) for h in HASHES[:3000]}
    large = {h: assign_split(h, "", {"train": 0.8, "test": 0.2}) for h in HASHES[:3000]}
    assert all(large[h] == "train" for h, s in small.items() if s == "train")


# -- duplicates ------------------------------------------------------------------------------------
H1, H2, H3, H4 = (hashlib.sha256(str(i).encode()).hexdigest() for i in range(4))

ROWS = [
    ("cat/b.jpg", "cat", H1),
    ("cat/a.jpg", "cat", H1),
    ("cat/c/z.jpg", "cat", H1),
    ("dog/x.jpg", "dog", H2),
    ("cat/x.jpg", "cat", H2),
    ("cat/x2.jpg", "cat", H2),
    ("cat/unique.jpg", "cat", H3),
    ("bird/only.jpg", "bird", H4),
]


def _verdicts(resolver: DuplicateResolver) -> dict[str, tuple[str, str] | None]:
    return {name: resolver.verdict(name, sha) for name, _, sha in ROWS}


def test_duplicates_keep_the_smallest_name() -> None:
    verdicts = _verdicts(DuplicateResolver(ROWS))
    assert verdicts["cat/a.jpg"] is None
    assert verdicts["cat/b.jpg"] == ("duplicate", "same content as cat/a.jpg")
    assert verdicts["cat/c/z.jpg"] == ("duplicate", "same content as cat/a.jpg")
    assert verdicts["cat/unique.jpg"] is None
    assert verdicts["bird/only.jpg"] is None


def test_same_content_with_different_labels_is_a_conflict_for_all() -> None:
    verdicts = _verdicts(DuplicateResolver(ROWS))
    for name in ("dog/x.jpg", "cat/x.jpg", "cat/x2.jpg"):
        assert verdicts[name] == ("label_conflict", "same content labelled cat, dog"), name


def test_kept_labels_exclude_conflicted_content() -> None:
    assert DuplicateResolver(ROWS).kept_labels() == {"cat", "bird"}
    only_conflict = [("dog/x.jpg", "dog", H2), ("cat/x.jpg", "cat", H2), ("cat/a.jpg", "cat", H1)]
    assert DuplicateResolver(only_conflict).kept_labels() == {"cat"}
    assert DuplicateResolver([]).kept_labels() == set()


def test_verdicts_do_not_depend_on_row_order() -> None:
    expected = _verdicts(DuplicateResolver(ROWS))
    rng = random.Random(3)
    for _ in range(5):
        rows = list(ROWS)
        rng.shuffle(rows)
        assert _verdicts(DuplicateResolver(rows)) == expected


def test_exactly_one_keeper_per_unconflicted_content() -> None:
    resolver = DuplicateResolver(iter(ROWS))  # any iterable, read once
    kept = [name for name, _, sha in ROWS if resolver.verdict(name, sha) is None]
    assert sorted(kept) == ["bird/only.jpg", "cat/a.jpg", "cat/unique.jpg"]



def test_a_shared_64_bit_prefix_is_not_shared_content() -> None:
    """The resolver narrows candidates by the first 64 bits of the SHA-256, then compares full hashes."""
    first, second = "0" * 16 + "1" * 48, "0" * 16 + "2" * 48
    resolver = DuplicateResolver(lambda: [("x/a.jpg", "x", first), ("y/b.jpg", "y", second),
                                          ("y/c.jpg", "y", second)])
    assert resolver.verdict("x/a.jpg", first) is None and resolver.verdict("y/b.jpg", second) is None
    assert resolver.verdict("y/c.jpg", second) == ("duplicate", "same content as y/b.jpg")
    assert resolver.kept_labels() == {"x", "y"}


def test_a_group_value_keys_the_split_whatever_the_content() -> None:
    splits = {"train": 0.5, "validation": 0.25, "test": 0.25}
    shas = [hashlib.sha256(str(i).encode()).hexdigest() for i in range(200)]
    for group in ("patient-1", "patient-2", "camera-7"):
        assert len({assign_split(sha, "s", splits, group) for sha in shas}) == 1
    by_group = {assign_split(shas[0], "s", splits, f"p{i}") for i in range(100)}
    assert by_group == set(splits)  # groups spread over every split
    assert [assign_split(sha, "s", splits, "") for sha in shas] == [assign_split(sha, "s", splits) for sha in shas]
    assert {assign_split(shas[0], salt, splits, "p1") for salt in map(str, range(50))} == set(splits)


@pytest.mark.parametrize("splits", [SPLITS, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, {"only": 1.0}])
def test_assign_splits_gives_assign_splits_answers(splits: dict[str, float]) -> None:
    groups = [f"p{i % 7}" if i % 3 == 0 else "" for i in range(len(HASHES))]
    assert assign_splits(HASHES, "salt", splits, groups) == \
        [assign_split(h, "salt", splits, g) for h, g in zip(HASHES, groups, strict=True)]
    assert assign_splits(HASHES, "salt", splits) == [assign_split(h, "salt", splits) for h in HASHES]
    assert assign_splits([], "salt", splits) == []


def test_unit_points_are_unit_hashes() -> None:
    points = unit_points(("order", "s\u00e9l"), [h.encode() for h in HASHES[:500]]).tolist()
    assert points == [unit_hash("order", "s\u00e9l", h) for h in HASHES[:500]]
