"""Deterministic train/validation/test assignment and duplicate resolution.

The split of an image is a pure function of ``(salt, sha256 of its bytes)``: a salted SHA-256 is
read as a number in [0, 1) and compared with the cumulative split fractions, in the order the
splits are given. Keying on content, not on the file name, means:

- an image never moves when other images are added or removed (nothing depends on the set);
- identical bytes can never land in two splits, even under different names (no leakage);
- renaming or moving a file keeps its split.

Changing the salt or the fractions reshuffles everything, by design.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


def unit_hash(*parts: str) -> float:
    """A uniform number in [0, 1) from the SHA-256 of the parts (NUL-separated)."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def assign_split(sha256: str, salt: str, splits: Mapping[str, float]) -> str:
    """The split for an image with content hash ``sha256``."""
    point = unit_hash("split", salt, sha256)
    cumulative = 0.0
    names = list(splits)
    for name in names:
        cumulative += splits[name]
        if point < cumulative:
            return name
    return names[-1]  # float rounding at the top end


@dataclass
class _Content:
    keeper: str
    labels: set[str] = field(default_factory=set)


class DuplicateResolver:
    """Decide, for files sharing the same bytes, which one becomes the record.

    Same bytes and same label: the file with the smallest name is kept, the others are
    ``duplicate``. Same bytes under different labels: none is kept (``label_conflict``), since
    either label would be wrong for one of them. Memory: one small entry per distinct content.
    """

    def __init__(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """``rows``: (filename, label, sha256) for every inspected image."""
        self._by_sha: dict[str, _Content] = {}
        for filename, label, sha in rows:
            entry = self._by_sha.get(sha)
            if entry is None:
                self._by_sha[sha] = _Content(filename, {label})
            else:
                entry.labels.add(label)
                entry.keeper = min(entry.keeper, filename)

    def kept_labels(self) -> set[str]:
        """The labels of all content that will be kept."""
        return {next(iter(e.labels)) for e in self._by_sha.values() if len(e.labels) == 1}

    def verdict(self, filename: str, sha256: str) -> tuple[str, str] | None:
        """None to keep the file, else (reason, detail)."""
        entry = self._by_sha[sha256]
        if len(entry.labels) > 1:
            return "label_conflict", "same content labelled " + ", ".join(sorted(entry.labels))
        if filename != entry.keeper:
            return "duplicate", f"same content as {entry.keeper}"
        return None
