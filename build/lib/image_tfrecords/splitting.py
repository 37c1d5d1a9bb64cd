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
import itertools
import os
import sqlite3
import tempfile
from collections.abc import Iterable, Mapping


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


class DuplicateResolver:
    """Decide, for files sharing the same bytes, which one becomes the record.

    Same bytes and same label: the file with the smallest name is kept, the others are
    ``duplicate``. Same bytes under different labels: none is kept (``label_conflict``), since
    either label would be wrong for one of them.

    Memory does not grow with the number of images: the rows go into a temporary SQLite file and
    only the files that share content with another are held, with their verdicts.
    """

    def __init__(self, rows: Iterable[tuple[str, str, str]]) -> None:
        """``rows``: (filename, label, sha256) for every inspected image."""
        with tempfile.TemporaryDirectory(prefix="duplicates-") as tmp:
            db = sqlite3.connect(os.path.join(tmp, "files.db"))
            try:
                db.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA cache_size=-1024;"
                                 "CREATE TABLE files (sha TEXT, filename TEXT, label TEXT);")
                db.executemany("INSERT INTO files VALUES (?, ?, ?)", ((sha, f, label) for f, label, sha in rows))
                db.execute("CREATE INDEX by_sha ON files (sha, filename)")
                self._labels = {label for (label,) in db.execute(
                    "SELECT DISTINCT min(label) FROM files GROUP BY sha HAVING count(DISTINCT label) = 1")}
                self._verdicts = self._resolve(db.execute(
                    "SELECT sha, filename, label FROM files WHERE sha IN "
                    "(SELECT sha FROM files GROUP BY sha HAVING count(*) > 1) ORDER BY sha, filename"))
            finally:
                db.close()

    @staticmethod
    def _resolve(rows: Iterable[tuple[str, str, str]]) -> dict[tuple[str, str], tuple[str, str]]:
        """Verdicts for the files of each group of equal content (rows sorted by sha, then filename)."""
        verdicts: dict[tuple[str, str], tuple[str, str]] = {}
        for sha, group in itertools.groupby(rows, key=lambda row: row[0]):
            members = [(filename, label) for _, filename, label in group]
            labels = sorted({label for _, label in members})
            keeper = members[0][0]  # the smallest name
            for filename, _ in members:
                if len(labels) > 1:
                    verdicts[(filename, sha)] = ("label_conflict", "same content labelled " + ", ".join(labels))
                elif filename != keeper:
                    verdicts[(filename, sha)] = ("duplicate", f"same content as {keeper}")
        return verdicts

    def kept_labels(self) -> set[str]:
        """The labels of all content that will be kept."""
        return set(self._labels)

    def verdict(self, filename: str, sha256: str) -> tuple[str, str] | None:
        """None to keep the file, else (reason, detail)."""
        return self._verdicts.get((filename, sha256))
