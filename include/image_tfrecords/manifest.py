"""The record schema (``tf.train.Example`` keys) and the ``dataset_info.json`` manifest."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .metadata import DEFAULT_SEPARATOR, feature_entry, feature_value

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
# labels.csv: each record's row, the shard file that holds it and its place there (0-based: the line of the
# shard's .tfindex that gives its bytes)
LABELS_FIELDS = (*RECORD_FIELDS, "shard", "shard_position")
REJECTS_FIELDS = ("filename", "reason", "detail")
# How splits are shown (cards, the datasets page): the customary ones in this order, then others by name.
SPLIT_ORDER = ("train", "training", "validation", "valid", "val", "dev", "test", "eval")


def ordered_splits(names: Iterable[str]) -> list[str]:
    """``names`` in display order: train, validation, test (and their usual aliases) first."""
    rank = {name: i for i, name in enumerate(SPLIT_ORDER)}
    return sorted(names, key=lambda name: (rank.get(name, len(rank)), name))


@dataclass(frozen=True)
class RecordSchema:
    """What a build's records hold besides the classic keys: raw pixels (``image/raw`` and ``image/shape``
    in place of ``image/encoded``), several classes (variable-length ``image/class/label`` and
    ``image/class/text``), and the labels.csv columns declared in ``columns`` (name -> ``metadata`` type)."""

    raw: bool = False
    multi_label: bool = False
    separator: str = DEFAULT_SEPARATOR
    columns: tuple[tuple[str, str], ...] = ()

    @property
    def image_key(self) -> str:
        return "image/raw" if self.raw else "image/encoded"

    def features(self) -> dict[str, dict[str, Any]]:
        """The manifest's ``features``: key -> dtype and shape (``[]`` one value, ``[None]`` any number)."""
        spec = {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURES.items()}
        if self.raw:
            del spec["image/encoded"]
            spec["image/raw"] = {"dtype": "string", "shape": []}
            spec["image/shape"] = {"dtype": "int64", "shape": [3]}
        if self.multi_label:
            spec["image/class/label"]["shape"] = spec["image/class/text"]["shape"] = [None]
        for name, kind in self.columns:
            spec[name] = feature_entry(kind)
        return spec


def example_features(row: dict[str, str], encoded: bytes, schema: RecordSchema = RecordSchema()) -> dict[str, Any]:
    """The features of one record, from its labels.csv row and its image bytes (or raw pixels)."""
    height, width, channels = int(row["height"]), int(row["width"]), int(row["channels"])
    features: dict[str, Any] = {
        schema.image_key: encoded,
        "image/format": row["format"].encode(),
        "image/height": height,
        "image/width": width,
        "image/channels": channels,
        "image/filename": row["filename"].encode(),
        "image/sha256": row["sha256"].encode(),
    }
    if schema.raw:
        features["image/shape"] = [height, width, channels]
    if schema.multi_label:
        features["image/class/label"] = [int(i) for i in row["label_id"].split(schema.separator)]
        features["image/class/text"] = [name.encode() for name in row["label"].split(schema.separator)]
    else:
        features["image/class/label"] = int(row["label_id"])
        features["image/class/text"] = row["label"].encode()
    for name, kind in schema.columns:
        features[name] = feature_value(kind, row[name], schema.separator)
    return features


def feature_spec(schema: RecordSchema = RecordSchema()) -> dict[str, dict[str, Any]]:
    """The manifest's ``features`` entry."""
    return schema.features()


def record_fields(cfg: Any) -> tuple[str, ...]:
    """The columns of a build's records (labels.csv without ``shard``): ``RECORD_FIELDS``, then the declared
    labels.csv columns (``cfg.columns``)."""
    return (*RECORD_FIELDS, *cfg.columns)


def schema_of(cfg: Any, multi_label: bool) -> RecordSchema:
    """The record schema of a build with config ``cfg`` (a multi-label source or not)."""
    return RecordSchema(raw=cfg.encoding == "raw", multi_label=multi_label, separator=cfg.label_separator,
                        columns=tuple(cfg.columns.items()))
