"""The numbers a version's dataset card and the datasets page both show, defined once.

Both read them from the version's manifest through these functions, and write shares with ``share``, so the
card and the page cannot disagree: records, rejected files, classes, records per split, the near-duplicate
groups the build formed, and the records stored with each image-quality flag with their share of *all* the
version's records (the share the publish gate compares; the card also says how many records were measured,
see docs/quality.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..records.schema import ordered_splits
from .manifest import Manifest


def records(manifest: Manifest) -> int:
    """The records the version's shards hold."""
    return manifest.num_records


def rejected(manifest: Manifest) -> int:
    """Files of the source that were not stored (each with a reason in rejects.csv)."""
    return manifest.num_rejected


def classes(manifest: Manifest) -> list[str]:
    """The class names, by id."""
    return list(manifest.classes)


def split_records(manifest: Manifest) -> dict[str, int]:
    """Records per split: train, validation, test first (as is customary), then any others by name."""
    return {name: manifest.splits[name].num_records for name in ordered_splits(manifest.splits)}


def _build(manifest: Manifest) -> Mapping[str, Any]:
    return manifest.build if isinstance(manifest.build, Mapping) else {}


def quality_flags(manifest: Manifest) -> dict[str, int]:
    """Records stored with each image-quality flag (the manifest's ``build.quality_flags``, 0.7.0+), flags with
    none left out; in the manifest's order (the order of ``images.quality.FLAGS``). Empty for older versions."""
    flags = _build(manifest).get("quality_flags")
    if not isinstance(flags, Mapping):
        return {}
    return {str(flag): n for flag, n in flags.items() if isinstance(n, int) and not isinstance(n, bool) and n > 0}


def _near_count(manifest: Manifest, key: str) -> int:
    """The whole number ``build.near_duplicates.<key>`` of ``manifest``, 0 when not recorded."""
    near = _build(manifest).get("near_duplicates")
    value = near.get(key) if isinstance(near, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def near_duplicate_groups(manifest: Manifest) -> int:
    """Near-duplicate groups the build formed among the images new to the version (``build.near_duplicates.
    groups_found``, 0.6.0+; near_duplicates.csv lists the version's groups), 0 when not recorded."""
    return _near_count(manifest, "groups_found")


def near_duplicate_gated(manifest: Manifest) -> int:
    """Images the build left out of the near-duplicate search, their hash saying too little (``build.
    near_duplicates.gated``, the reliability gate of ``rules.near_duplicates``), 0 when not recorded."""
    return _near_count(manifest, "gated")


def share(count: int, total: int) -> str:
    """``count`` as a share of ``total``, as the card and the page write it: one decimal, ``12.5%``."""
    return f"{count / total:.1%}" if total else "0.0%"


def flag_shares(manifest: Manifest) -> dict[str, str]:
    """Each flag of ``quality_flags`` as a share of the version's records (``share``)."""
    return {flag: share(n, records(manifest)) for flag, n in quality_flags(manifest).items()}
