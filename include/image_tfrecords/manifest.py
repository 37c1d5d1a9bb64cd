"""The record schema (``tf.train.Example`` keys) and the ``dataset_info.json`` manifest."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

# key -> dtype, as in the contract; every feature is a scalar (shape []).
FEATURES: dict[str, str] = {
    "image/encoded": "string",
    "image/format": "string",
    "image/height": "int64",
    "image/width": "int64",
    "image/channels": "int64",
    "image/class/label": "int64",
    "image/class/text": "string",
    "image/filename": "string",
    "image/sha256": "string",
}

# A record's row: what its tf.train.Example holds (and how its image was taken from the file).
RECORD_FIELDS = ("filename", "label", "label_id", "split", "sha256", "width", "height", "channels", "format",
                 "num_bytes", "source_format", "transform", "encoded_sha256", "encoded_bytes")
LABELS_FIELDS = (*RECORD_FIELDS, "shard")  # labels.csv: each record's row and the shard file that holds it
REJECTS_FIELDS = ("filename", "reason", "detail")
# How splits are shown (cards, the datasets page): the customary ones in this order, then others by name.
SPLIT_ORDER = ("train", "training", "validation", "valid", "val", "dev", "test", "eval")


def ordered_splits(names: Iterable[str]) -> list[str]:
    """``names`` in display order: train, validation, test (and their usual aliases) first."""
    rank = {name: i for i, name in enumerate(SPLIT_ORDER)}
    return sorted(names, key=lambda name: (rank.get(name, len(rank)), name))


def example_features(row: dict[str, str], encoded: bytes) -> dict[str, bytes | int]:
    """The features of one record, from its labels.csv row and its image bytes."""
    return {
        "image/encoded": encoded,
        "image/format": row["format"].encode(),
        "image/height": int(row["height"]),
        "image/width": int(row["width"]),
        "image/channels": int(row["channels"]),
        "image/class/label": int(row["label_id"]),
        "image/class/text": row["label"].encode(),
        "image/filename": row["filename"].encode(),
        "image/sha256": row["sha256"].encode(),
    }


def feature_spec() -> dict[str, dict[str, Any]]:
    """The manifest's ``features`` entry."""
    return {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURES.items()}
