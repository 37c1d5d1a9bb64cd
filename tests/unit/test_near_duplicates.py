"""Near-duplicates (issue 25): the perceptual hash, the index that finds near pairs, and how groups
are placed in splits."""

from __future__ import annotations

import io
import random
from itertools import combinations

import numpy as np
import pytest
from PIL import Image

from image_tfrecords.images.perceptual import BITS, distance, perceptual_hash
from image_tfrecords.images.probe import inspect_image
from image_tfrecords.rules import near_duplicates as nd
from image_tfrecords.rules.splits import assign_split
from tests.near_duplicates_corpus import KINDS, variant

SPLITS = {"train": 0.8, "validation": 0.1, "test": 0.1}
PHOTO_BITS = 12  # the setting the docs recommend for photos


def photos(count: int, seed: int = 0) -> list[Image.Image]:
    from bench.make_corpus import synthetic_photo

    rng = random.Random(seed)
    return [synthetic_photo(random.Random(seed * 1000 + i), (rng.randint(420, 640), rng.randint(320, 480)))
            for i in range(count)]


def jpeg(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    return buf.getvalue()


def test_hash_of_variants_is_close_and_of_distinct_photos_far() -> None:
    """Through inspection (JPEGs decoded at 1/8 scale, EXIF applied): every kind of variant within the
    default bits of its photo at the 90th percentile and in most cases; distinct photos never that close."""
    rng = random.Random(5)
    images = photos(24)
    hashes = [inspect_image(jpeg(image)).phash for image in images]
    assert all(len(h) == 16 and int(h, 16) < 1 << BITS for h in hashes)
    near: dict[str, list[int]] = {kind: [] for kind in KINDS}
    for image, original in zip(images, hashes, strict=True):
        for kind in KINDS:
            near[kind].append(distance(original, inspect_image(variant(image, kind, rng)[1]).phash))
    default = PHOTO_BITS
    for kind, distances in near.items():
        assert np.percentile(distances, 90) <= default, (kind, distances)
    apart = [distance(a, b) for a, b in combinations(hashes, 2)]
    assert min(apart) > default, sorted(apart)[:5]


def test_hash_is_deterministic_and_upright() -> None:
    image = photos(1, seed=3)[0]
    assert perceptual_hash(image) == perceptual_hash(image.copy())
    turned = image.transpose(Image.Transpose.ROTATE_90)
    assert distance(perceptual_hash(image), perceptual_hash(turned)) > 16  # the hash sees orientation...
    exif = Image.Exif()
    exif[0x0112] = 6
    buf = io.BytesIO()
    turned.save(buf, "JPEG", quality=90, exif=exif.tobytes())
    upright = inspect_image(buf.getvalue())  # ...so inspection hashes the upright image
    assert distance(upright.phash, inspect_image(jpeg(image)).phash) <= 6


def planted(n: int, copies: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` random hashes, then ``copies`` near copies of the first ones, 1 to 14 bits away."""
    rng = np.random.default_rng(seed)
    hashes = rng.integers(1, 1 << BITS, n, dtype=np.uint64)
    source = rng.choice(n, copies, replace=False)
    apart = rng.integers(1, 15, copies)
    near = hashes[source].copy()
    for i in range(copies):
        for bit in rng.choice(BITS, apart[i], replace=False):
            near[i] ^= np.uint64(1) << np.uint64(int(bit))
    return np.concatenate([hashes, near]), source, apart


def test_pairs_found_without_comparing_all_and_checked_by_distance() -> None:
    hashes, source, apart = planted(20_000, 1_000)
    pairs = nd.near_pairs(hashes, 12)
    assert all(np.bitwise_count(hashes[a] ^ hashes[b]) <= 12 for a, b in pairs)
    found = {(int(a), int(b)) for a, b in pairs}
    n = 20_000
    hit = np.array([(int(s), n + i) in found for i, s in enumerate(source)])
    assert hit[apart <= 8].all()  # 8 bits apart: found in practice always
    assert hit[(apart > 8) & (apart <= 12)].mean() > 0.7
    assert not hit[apart > 12].any()


def test_a_night_finds_exactly_the_full_builds_pairs_of_its_new_images() -> None:
    hashes, _, _ = planted(20_000, 1_000, seed=1)
    every = nd.near_pairs(hashes, 12)
    new = np.zeros(len(hashes), dtype=bool)
    new[np.random.default_rng(2).choice(len(hashes), 700, replace=False)] = True
    of_new = every[new[every[:, 0]] | new[every[:, 1]]]
    assert np.array_equal(nd.near_pairs(hashes, 12, new), of_new) and len(of_new) > 20


def test_bits_zero_and_missing_hashes_find_nothing() -> None:
    hashes = np.array([0, 0, 5, 5], dtype=np.uint64)  # 0: no hash (an inspection from before them)
    assert nd.near_pairs(hashes, 0).shape == (0, 2)
    assert nd.near_pairs(hashes, 4).tolist() == [[2, 3]]
    assert nd.hash_array(["", "zz", "000000000000000f", "0f"]).tolist() == [0, 0, 15, 0]


def place(labels: list[str], hashes: list[int], published: dict[int, str] | None = None,
          keep: bool = False) -> nd.Placement:
    """``published``: image index -> its published split."""
    names = [f"f{i}.jpg" for i in range(len(labels))]
    shas = [f"{i:064x}" for i in range(len(labels))]
    known = {shas[i]: (split, "") for i, split in (published or {}).items()}
    return nd.place(names, shas, labels, np.array(hashes, dtype=np.uint64), known, 4, "salt", SPLITS,
                    keep_across_labels=keep)


def test_a_new_group_goes_whole_to_the_split_of_its_smallest_content_hash() -> None:
    placement = place(["a", "a", "a", "a"], [0b1, 0b11, 0b111, 0x1F << 40])
    assert placement.split == {i: assign_split(f"{0:064x}", "salt", SPLITS) for i in (0, 1, 2)}
    assert placement.group == {0: f"{0:016x}", 1: f"{0:016x}", 2: f"{0:016x}"}
    assert placement.groups == 1 and not placement.rejected


B = 1 << 62  # a bit every hash below has, so that none is 0 (no hash)


def test_new_members_join_the_published_split_and_never_bridge_two() -> None:
    # 0 (published, test) and 3 (published, train) are 8 bits apart; 1 is near 0 only; 4 near both
    hashes = [B | 0x0F, B | 0x0E, B | (0x1F << 40), B | 0xF0, B | 0x33]
    placement = place(["a"] * 5, hashes, {0: "test", 3: "train"})
    assert placement.split == {1: "test"}  # joins its published neighbour; 2 is near nothing
    assert placement.rejected[4][0] == "near_duplicate_across_splits" and "test, train" in placement.rejected[4][1]
    assert set(placement.rejected) == {4}  # a published image is never rejected for being near
    assert placement.group[0] == placement.group[1] == f"{0:016x}"  # the published member's key (its sha here)


def test_near_duplicates_under_two_labels_are_rejected_or_kept_and_counted() -> None:
    placement = place(["a", "b", "a"], [0b1, 0b11, 0x1F << 40])
    assert {i: r[0] for i, r in placement.rejected.items()} == {0: "near_duplicate_label_conflict",
                                                                1: "near_duplicate_label_conflict"}
    assert "labelled a, b" in placement.rejected[0][1]
    kept = place(["a", "b", "a"], [0b1, 0b11, 0x1F << 40], keep=True)
    assert not kept.rejected and kept.kept_across_labels == 1 and kept.split[0] == kept.split[1]


@pytest.mark.parametrize("bits", [0, -1])
def test_grouping_off(bits: int) -> None:
    placement = nd.place(["a", "b"], ["0" * 64, "1" * 64], ["x", "x"], np.array([1, 1], dtype=np.uint64), {}, bits,
                         "", SPLITS)
    assert placement.groups == 0 and not placement.split and not placement.rejected
