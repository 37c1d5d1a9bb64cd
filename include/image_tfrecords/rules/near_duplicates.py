"""Near-duplicate images: which ones, and the split each group of them goes to.

**Pairs.** Two images are a near pair when their perceptual hashes (``images.perceptual``: 63 bits)
differ in at most ``bits`` bits and share a key of the index. The index never compares all pairs:
it is locality-sensitive hashing by bit sampling, ``TABLES`` tables each keyed by ``KEY_BITS`` of
the 63 bits (picked once, by a fixed seed). A pair ``d`` bits apart shares a key in some table with
probability ``1 - (1 - (1 - d/63) ** 16) ** 64``: 99.9% at d = 8, 91% at d = 12, 49% at d = 16,
while photos that are not near (20 to 40 bits apart) meet in 0.001% to 0.2% of pairs, which the
bit count then turns away. Whether a pair is found is a property of the pair alone (the tables are
fixed), so a night that looks only at the pairs of its new images finds exactly the pairs of new
images that a full build finds. Cost: ``TABLES`` sorts of the hashes plus the candidates found,
linear in the images (about a second for 100,000 on one core).

**Groups and splits.** Published records never move between splits. An image is *new* when its
content is in no split of the previous version (a first build: every image). A group is a connected
component of the near pairs of two new images, with the published images near any of its members
(a published image joins groups, it never links two: pairs of two published images are not looked
at, they were placed before). In a group:

- new members go to the split of the published ones; when those are in two or more splits, the new
  members are rejected (``near_duplicate_across_splits``): storing them would put one picture in two
  splits;
- a group with no published member goes, whole, to the split the split rule gives its smallest
  content hash (so a first build stays a pure function of its source);
- members under different labels are all rejected, published ones too, as identical files under
  different labels are (``near_duplicate_label_conflict``), unless ``near_duplicate_labels`` is
  ``keep``: then they are kept, placed as above, and counted.

A group's key (labels.csv's ``near_group``) is its published members' key, else the first 16 hex
digits of its smallest content hash. An image in no group keeps its published split, or takes the
split rule's for its content hash.

**The reliability gate.** An image whose hash says too little takes no part in grouping (``gated``; the
split stage counts them): a shorter side under ``MIN_SIDE`` pixels (a JPEG's 1/8-scale thumbnail under 16
pixels, half the hash's 32 cells a side) or a contrast (the thumbnail's grey levels' standard deviation,
``images.quality``) under ``MIN_CONTRAST``: a near-uniform picture, whose 63 coefficients sit near their
median, so that its bits are noise. Measured on 2,000 crops of real photos and their variants
(``bench/near_duplicates.py``, docs/near-duplicates.md): a variant of a crop of contrast under 5 is within
8 bits of it 63% of the time (92-96% above), and 5 of the 8 pairs of distinct crops within 8 bits have a
member under 5; shrunk to a shorter side of 96 pixels, variants are within 8 bits 75% of the time (83% at
128, 91% at 256); the project's sample images (flat shapes of 96-200 pixels) pair within 8 bits only
where a member is under 128. Both are properties a re-encode shares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from .splits import assign_split

KEY_BITS = 16  # bits of the hash that key one table
TABLES = 64
SEED = 20261125  # picks each table's bits, once and for all: changing it changes which pairs are found
HASH_BITS = 63
MIN_SIDE = 128  # an image's shorter side (pixels) below: its hash takes no part in grouping
MIN_CONTRAST = 5.0  # its thumbnail's contrast (images.quality's) below: the same
GATE = f"shorter side under {MIN_SIDE} pixels or contrast under {MIN_CONTRAST:g}"


def gated(row: Mapping[str, str]) -> bool:
    """Whether the hash of an image (its row of split's images: ``width``, ``height``, ``contrast``) is too
    unreliable to group on (see the module); False for an image without a measured contrast."""
    return unreliable(row["width"], row["height"], row["contrast"])


def unreliable(width: str, height: str, contrast: str) -> bool:
    """``gated`` of the three cells."""
    try:
        return min(int(width), int(height)) < MIN_SIDE or float(contrast) < MIN_CONTRAST
    except ValueError:  # not measured ("")
        return False


@cache
def _key_weights() -> Any:
    """(64, TABLES) float32: column t weighs hash bit p (column 63 - p of the unpacked bits) 2**j when
    it is table t's j-th key bit, so that unpacked bits @ weights gives every table's key at once."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    weights = np.zeros((64, TABLES), dtype=np.float32)
    for table in range(TABLES):
        for j, position in enumerate(np.sort(rng.choice(HASH_BITS, KEY_BITS, replace=False))):
            weights[63 - int(position), table] = float(1 << j)
    return weights


def _keys(hashes: Any) -> Any:
    """(TABLES, n) uint16: each table's key of each hash."""
    import numpy as np

    bits = np.unpackbits(hashes.astype(">u8").view(np.uint8).reshape(-1, 8), axis=1)  # column 0: bit 63
    return (bits.astype(np.float32) @ _key_weights()).astype(np.uint16).T.copy()


def hash_array(hashes: Sequence[str]) -> Any:
    """Hex perceptual hashes as a numpy uint64 array ("" or a malformed one: 0, never near anything
    but another 0, which ``near_pairs`` leaves out)."""
    import numpy as np

    out = np.zeros(len(hashes), dtype=np.uint64)
    for i, value in enumerate(hashes):
        try:
            out[i] = int(value, 16) if len(value) == 16 else 0
        except ValueError:
            out[i] = 0
    return out


def near_pairs(hashes: Any, bits: int, new: Any | None = None) -> Any:
    """(P, 2) int64 array of the near pairs ``i < j`` of ``hashes`` (uint64), at most ``bits`` apart,
    sorted; only pairs with a member where ``new`` (bool array) is True, all pairs when it is None."""
    import numpy as np

    n = len(hashes)
    if n < 2 or bits <= 0:
        return np.zeros((0, 2), dtype=np.int64)
    valid = hashes != 0
    wanted = np.ones(n, dtype=bool) if new is None else np.asarray(new, dtype=bool)
    found: list[Any] = []
    for keys in _keys(hashes):
        if new is None:
            order = np.argsort(keys, kind="stable")  # a radix sort: the keys are 16-bit
        else:  # only the images that share a key with a new one: a pass over the keys, no sort of them all
            hit = np.zeros(1 << KEY_BITS, dtype=bool)
            hit[keys[wanted]] = True
            some = np.flatnonzero(hit[keys])
            order = some[np.argsort(keys[some], kind="stable")]
        ordered = keys[order]
        for offset in range(1, len(order)):
            same = ordered[:-offset] == ordered[offset:]
            if not same.any():
                break
            a, b = order[:-offset][same], order[offset:][same]
            keep = (wanted[a] | wanted[b]) & valid[a] & valid[b]
            a, b = a[keep], b[keep]
            close = np.bitwise_count(hashes[a] ^ hashes[b]) <= bits
            if close.any():
                found.append(np.stack([np.minimum(a[close], b[close]), np.maximum(a[close], b[close])], axis=1))
    if not found:
        return np.zeros((0, 2), dtype=np.int64)
    return np.unique(np.concatenate(found).astype(np.int64), axis=0)


def components(n: int, pairs: Any) -> dict[int, list[int]]:
    """The connected components of ``pairs`` with two members or more: root -> sorted members."""
    parent = list(range(n))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a, b in pairs.tolist():
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for i in sorted({i for pair in pairs.tolist() for i in pair}):
        groups.setdefault(root(i), []).append(i)
    return groups


@dataclass
class Placement:
    """What grouping decided: the split and group of every image in a group, the rejected ones with
    their reason, and counts for the build summary."""

    split: dict[int, str] = field(default_factory=dict)  # image index -> split, for new group members kept
    group: dict[int, str] = field(default_factory=dict)  # image index -> group key, for every member kept
    rejected: dict[int, tuple[str, str]] = field(default_factory=dict)  # image index -> (reason, detail)
    groups: int = 0
    gated: int = 0  # images with a hash that the reliability gate left out (``gated``)
    kept_across_labels: int = 0  # with near_duplicate_labels "keep": groups with more than one label


def place(names: Sequence[str], shas: Sequence[str], labels: Sequence[str], hashes: Any,
          published: Mapping[str, tuple[str, str]], bits: int, salt: str, splits: Mapping[str, float],
          keep_across_labels: bool = False, group_values: Sequence[str] | None = None) -> Placement:
    """Group the new images (see the module) and place each group: ``names``, content ``shas``,
    ``labels`` and perceptual ``hashes`` of every image; ``published``: content hash -> (split, group
    key) of the previous version's records; ``group_values``: each image's group column value ("" for none).
    A new group whose images carry group values follows the smallest one's split (the earlier group's,
    in a stable order), else its smallest content hash's."""
    import numpy as np

    placement = Placement()
    if bits <= 0 or len(names) < 2:
        return placement
    new = np.fromiter((sha not in published for sha in shas), dtype=bool, count=len(shas))
    pairs = near_pairs(hashes, bits, new)
    both_new = new[pairs[:, 0]] & new[pairs[:, 1]]
    neighbours: dict[int, set[int]] = {}  # new image -> the published images it is near
    for a, b in pairs[~both_new].tolist():
        fresh, old = (a, b) if new[a] else (b, a)
        neighbours.setdefault(fresh, set()).add(old)
    linked = pairs[both_new]
    groups = components(len(names), linked)
    for lone in set(neighbours) - {i for members in groups.values() for i in members}:
        groups[lone] = [lone]
    for members in sorted(groups.values()):
        old = sorted({j for i in members for j in neighbours.get(i, ())})
        placement.groups += 1
        everyone = sorted(members + old)
        member_labels = sorted({labels[i] for i in everyone})
        if len(member_labels) > 1:
            if not keep_across_labels:
                detail = f"near-duplicates labelled {', '.join(member_labels)}"
                for i in everyone:
                    placement.rejected[i] = ("near_duplicate_label_conflict",
                                             f"{detail} (with {_other(names, everyone, i)})")
                continue
            placement.kept_across_labels += 1
        old_splits = sorted({published[shas[j]][0] for j in old})
        if len(old_splits) > 1:
            for i in members:
                placement.rejected[i] = ("near_duplicate_across_splits", "near published images in splits "
                                         f"{', '.join(old_splits)} ({', '.join(names[j] for j in old[:3])})")
            continue
        smallest = min(shas[i] for i in members)
        group = min((group_values[i] for i in members if group_values[i]), default="") if group_values else ""
        split = old_splits[0] if old_splits else assign_split(smallest, salt, splits, group)
        key = min((published[shas[j]][1] or shas[j][:16] for j in old), default=smallest[:16])
        for i in members:
            placement.split[i] = split
        for i in everyone:
            placement.group[i] = key
    return placement


def _other(names: Sequence[str], members: list[int], i: int) -> str:
    """Another member of the group than ``i``, to name in a reject's detail."""
    return names[members[1] if members[0] == i else members[0]]
