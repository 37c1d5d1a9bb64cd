"""The record schema (``tf.train.Example`` keys) and the ``dataset_info.json`` manifest."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..options import DEFAULT_SEPARATOR
from .columns import feature_entry, feature_value

# The tf.train.Example keys, named once: the writer, the checks, the loader and TFDS's metadata use these.
IMAGE_KEY, FORMAT_KEY, HEIGHT_KEY, WIDTH_KEY, CHANNELS_KEY = (
    "image/encoded", "image/format", "image/height", "image/width", "image/channels")
LABEL_KEY, TEXT_KEY, FILENAME_KEY, SHA256_KEY = (
    "image/class/label", "image/class/text", "image/filename", "image/sha256")
RAW_KEY, SHAPE_KEY = "image/raw", "image/shape"  # raw pixels (uint8, row-major H x W x C) and [h, w, c]
# key -> dtype, as in the contract; every feature is a scalar (shape []).
FEATURES: dict[str, str] = {
    IMAGE_KEY: "string",
    FORMAT_KEY: "string",
    HEIGHT_KEY: "int64",
    WIDTH_KEY: "int64",
    CHANNELS_KEY: "int64",
    LABEL_KEY: "int64",
    TEXT_KEY: "string",
    FILENAME_KEY: "string",
    SHA256_KEY: "string",
}

# A record's row: what its tf.train.Example holds (and how its image was taken from the file).
RECORD_FIELDS = ("filename", "label", "label_id", "split", "sha256", "width", "height", "channels", "format",
                 "num_bytes", "source_format", "transform", "encoded_sha256", "encoded_bytes",
                 "brightness", "contrast", "sharpness", "colourfulness", "quality")
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
    ``image/class/text``), and the labels.csv columns declared in ``columns`` (name -> ``columns`` type)."""

    raw: bool = False
    multi_label: bool = False
    separator: str = DEFAULT_SEPARATOR
    columns: tuple[tuple[str, str], ...] = ()

    @property
    def image_key(self) -> str:
        return RAW_KEY if self.raw else IMAGE_KEY

    def features(self) -> dict[str, dict[str, Any]]:
        """The manifest's ``features``: key -> dtype and shape (``[]`` one value, ``[None]`` any number)."""
        spec = {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURES.items()}
        if self.raw:
            del spec[IMAGE_KEY]
            spec[RAW_KEY] = {"dtype": "string", "shape": []}
            spec[SHAPE_KEY] = {"dtype": "int64", "shape": [3]}
        if self.multi_label:
            spec[LABEL_KEY]["shape"] = spec[TEXT_KEY]["shape"] = [None]
        for name, kind in self.columns:
            spec[name] = feature_entry(kind)
        return spec


def example_features(row: dict[str, str], encoded: bytes, schema: RecordSchema = RecordSchema()) -> dict[str, Any]:
    """The features of one record, from its labels.csv row and its image bytes (or raw pixels)."""
    height, width, channels = int(row["height"]), int(row["width"]), int(row["channels"])
    features: dict[str, Any] = {
        schema.image_key: encoded,
        FORMAT_KEY: row["format"].encode(),
        HEIGHT_KEY: height,
        WIDTH_KEY: width,
        CHANNELS_KEY: channels,
        FILENAME_KEY: row["filename"].encode(),
        SHA256_KEY: row["sha256"].encode(),
    }
    if schema.raw:
        features[SHAPE_KEY] = [height, width, channels]
    if schema.multi_label:
        features[LABEL_KEY] = [int(i) for i in row["label_id"].split(schema.separator)]
        features[TEXT_KEY] = [name.encode() for name in row["label"].split(schema.separator)]
    else:
        features[LABEL_KEY] = int(row["label_id"])
        features[TEXT_KEY] = row["label"].encode()
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
