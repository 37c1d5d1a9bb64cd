"""Deterministic train/validation/test assignment and duplicate resolution.

The split of an image is a pure function of ``(salt, sha256 of its bytes)``: a salted SHA-256 is
read as a number in [0, 1) and compared with the cumulative split fractions, in the order the
splits are given. Keying on content, not on the file name, means:

- an image never moves when other images are added or removed (nothing depends on the set);
- identical bytes can never land in two splits, even under different names (no leakage);
- renaming or moving a file keeps its split.

Changing the salt or the fractions reshuffles everything, by design.

With a group column (``group_column``: a patient, camera or source document in labels.csv), an
image's split is its group's, a function of ``(salt, group value)``: all of a group's images land
in one split, and an image with an empty cell falls back to its content hash.
"""

from __future__ import annotations

import hashlib
import itertools
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ..storage import Storage
from ..storage.tables import polars, read_table

if TYPE_CHECKING:
    import polars as pl


def unit_hash(*parts: str) -> float:
    """A uniform number in [0, 1) from the SHA-256 of the parts (NUL-separated)."""
    digest = hashlib.sha256("\0".join(parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def unit_points(parts: tuple[str, ...], values: list[bytes]) -> Any:
    """``unit_hash(*parts, value)`` of each of ``values`` (UTF-8 bytes), as a numpy float64 array: for passes over
    every image."""
    import numpy as np

    prefix = "\0".join((*parts, "")).encode()
    sha256 = hashlib.sha256
    first = b"".join([sha256(prefix + value).digest()[:8] for value in values])
    return np.frombuffer(first, dtype=">u8").astype(np.float64) / 2**64


def assign_splits(shas: Sequence[str], salt: str, splits: Mapping[str, float],
                  groups: Sequence[str] | None = None) -> list[str]:
    """The split rule: the split of each image with content hash ``shas[i]``, or, with a group value
    ``groups[i]`` (the group column's; ``""`` for none), its group's, which every image of the group shares:
    the first split whose cumulative fraction is above the salted hash's point in [0, 1)."""
    import numpy as np

    points = unit_points(("split", salt), [sha.encode() for sha in shas])
    if groups is not None and any(groups):
        points = np.where([bool(group) for group in groups],
                          unit_points(("group", salt), [group.encode() for group in groups]), points)
    names = list(splits)
    bounds = np.array(list(itertools.accumulate(splits.values())))
    at = np.minimum(np.searchsorted(bounds, points, side="right"), len(names) - 1)  # the top end: float rounding
    return [names[i] for i in at.tolist()]


def assign_split(sha256: str, salt: str, splits: Mapping[str, float], group: str = "") -> str:
    """``assign_splits`` of one image."""
    return assign_splits([sha256], salt, splits, [group])[0]


class DuplicateResolver:
    """Decide, for files sharing the same bytes, which one becomes the record.

    Same bytes and same label: the file with the smallest name is kept, the others are
    ``duplicate``. Same bytes under different labels: none is kept (``label_conflict``), since
    either label would be wrong for one of them.

    Memory holds 12 bytes per image (the first 64 bits of its SHA-256 and its label's number, in
    numpy arrays) and the files that may share content with another, with their verdicts: a second
    pass over ``rows()`` reads those (whose 64-bit prefix is not unique) and compares full hashes.
    """

    def __init__(self, rows: Callable[[], Iterable[tuple[str, str, str]]] | Iterable[tuple[str, str, str]],
                 columns: tuple[Any, Any, dict[str, int]] | None = None) -> None:
        """``rows``: (filename, label, sha256) for every inspected image: a callable giving them afresh each
        call (read twice: the streaming way), or an iterable (held in memory). ``columns``: the first pass's
        answer, when it was read as columns (``content_columns``)."""
        import numpy as np

        if not callable(rows):
            held = list(rows)
            rows = lambda: held  # noqa: E731

        if columns is not None:
            content, numbers, label_number = columns
        else:
            label_number = {}
            prefixes, labels = array("Q"), array("q")
            for _, label, sha in rows():
                prefixes.append(int(sha[:16], 16))
                labels.append(label_number.setdefault(label, len(label_number)))
            content = np.frombuffer(prefixes, dtype=np.uint64) if prefixes else np.zeros(0, dtype=np.uint64)
            numbers = np.frombuffer(labels, dtype=np.int64) if labels else np.zeros(0, dtype=np.int64)
        ordered = np.sort(content)
        shared = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])  # prefixes two rows or more hold
        candidate = np.isin(content, shared, kind="sort")  # (none where nothing is shared)
        names = {number: label for label, number in label_number.items()}
        self._labels = {names[int(n)] for n in np.unique(numbers[~candidate])}  # unique content: kept
        self._verdicts: dict[tuple[str, str], tuple[str, str]] = {}
        if len(shared):
            wanted = {int(p) for p in shared}
            grouped = sorted((sha, filename, label) for filename, label, sha in rows()
                             if int(sha[:16], 16) in wanted)
            self._verdicts = self._resolve(grouped)
            self._labels |= {label for sha, filename, label in grouped if (filename, sha) not in self._verdicts}

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

    @property
    def verdicts(self) -> dict[tuple[str, str], tuple[str, str]]:
        """(filename, sha256) -> (reason, detail) of every file not kept."""
        return self._verdicts

    def kept_labels(self) -> set[str]:
        """The labels of all content that will be kept."""
        return set(self._labels)

    def verdict(self, filename: str, sha256: str) -> tuple[str, str] | None:
        """None to keep the file, else (reason, detail)."""
        return self._verdicts.get((filename, sha256))


def hex_prefixes(sha256: pl.Series) -> pl.Series:
    """The first 64 bits of each SHA-256 hexdigest of ``sha256`` (its first 16 hex digits, as
    ``int(value[:16], 16)`` reads them) as UInt64; null where a value is not hex digits (empty or damaged)."""
    pl = polars()

    return sha256.str.slice(0, 16).str.to_integer(base=16, dtype=pl.UInt64, strict=False)


def content_columns(storage: Storage, uri: str, header: str, col: dict[str, int],
                    table: pl.DataFrame | None = None) -> tuple[Any, Any, dict[str, int]] | None:
    """``DuplicateResolver``'s first pass over the images (read from ``uri``, columns ``col``, its header ``header``) as
    polars columns: each row's first 64 bits of SHA-256 (uint64) and its label's number (int64, numbered in order
    of first appearance), and the numbers. One path for every table ``storage.tables.read_table`` reads (a damaged
    one: ``BuildError``); None, for the caller to read it row by row, where its header is not ``header`` or a
    sha256 is not hex digits. ``table``: the images read already (by the caller), not read again."""
    pl = polars()

    table = read_table(storage, uri) if table is None else table
    if ",".join(table.columns) != header:
        return None
    prefixes = hex_prefixes(table.to_series(col["sha256"]))
    if prefixes.null_count():
        return None
    labels = table.to_series(col["label"]).fill_null("")
    order = labels.unique(maintain_order=True)
    numbers = labels.cast(pl.Enum(order)).to_physical().cast(pl.Int64)
    return prefixes.to_numpy(), numbers.to_numpy(), {label: i for i, label in enumerate(order.to_list())}
