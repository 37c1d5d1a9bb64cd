"""TensorFlow Datasets metadata for a published version, so ``tfds.builder_from_directory`` reads it.

The files are what TFDS's own ``DatasetInfo.write_to_directory`` writes (checked byte for byte in
the tests against tensorflow-datasets 4.9): ``dataset_info.json`` (the ``DatasetInfo`` proto as
JSON), ``features.json`` (``FeaturesDict.to_json``) and ``image.class.label.labels.txt`` (the class
names: TFDS keeps them out of ``features.json``). Standard library only: TFDS is not imported.

The feature tree is a *flat* ``FeaturesDict`` whose keys are our record keys (``image/encoded``,
``image/class/label``, ...). A nested tree (``{"image": {"class": {"label": ...}}}``) serializes to
the same keys, but TFDS's ``as_supervised`` looks supervised keys up at the top level only
(``features[key]``), so it could not reach a nested feature; ``/`` in a top-level key is fine.

What a TFDS reader gets, per record (``info.features["image/class/label"].names`` == ``classes``):

* ``image/encoded``: the decoded image, ``uint8``, shape ``(height, width, 3)``: every record
  decodes to RGB (grey is repeated, alpha dropped), since channels vary from record to record;
* ``image/class/label``: the class id (``int64``), ``ClassLabel`` over the manifest's ``classes``;
* ``image/height``, ``image/width``, ``image/channels`` (``int64``; the stored image's, so
  ``image/channels`` may be 1, 2 or 4 while ``image/encoded`` has 3);
* ``image/format``, ``image/class/text``, ``image/filename``, ``image/sha256``: ``tf.string``.

``as_supervised=True`` yields ``(image, label)``: supervised keys ``("image/encoded",
"image/class/label")``. TFDS wants an ``X.Y.Z`` version, so the metadata says ``1.0.0`` and names
our version in the description and release notes. The split files are read through
``filepathTemplate`` ``{SPLIT}-{SHARD_X_OF_Y}.tfrecord`` (TFDS pads index and count to at least
5 digits) with ``shardLengths`` from the manifest's shards.
"""

from __future__ import annotations

import json
from typing import Any

from .manifest import FEATURES

TFDS_VERSION = "1.0.0"
IMAGE_KEY, LABEL_KEY = "image/encoded", "image/class/label"
LABELS_FILE = LABEL_KEY.replace("/", ".") + ".labels.txt"  # features.convert_feature_name_to_filename
TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.tfrecord"
_MODULE = "tensorflow_datasets.core.features."
_TENSOR_DTYPES = {"int64": "int64", "float": "float32"}


def _feature(key: str, dtype: str, num_classes: int) -> dict[str, Any]:
    """One feature as ``json_format.MessageToDict(feature.to_proto())`` gives it."""
    if key == IMAGE_KEY:
        return {"image": {"dtype": "uint8", "shape": {"dimensions": ["-1", "-1", "3"]}},
                "pythonClassName": _MODULE + "image_feature.Image"}
    if key == LABEL_KEY:
        return {"classLabel": {"numClasses": str(num_classes)},
                "pythonClassName": _MODULE + "class_label_feature.ClassLabel"}
    if dtype == "string":
        return {"pythonClassName": _MODULE + "text_feature.Text", "text": {}}
    return {"pythonClassName": _MODULE + "tensor_feature.Tensor",
            "tensor": {"dtype": _TENSOR_DTYPES[dtype], "encoding": "none", "shape": {}}}


def features_json(schema: dict[str, str], num_classes: int) -> dict[str, Any]:
    """``features.json``'s content: a flat ``FeaturesDict`` over the record keys (``schema``: key -> dtype)."""
    return {"featuresDict": {"features": {key: _feature(key, dtype, num_classes) for key, dtype in schema.items()}},
            "pythonClassName": _MODULE + "features_dict.FeaturesDict"}


def _schema(manifest: dict[str, Any]) -> dict[str, str] | None:
    """The version's record keys and dtypes (its manifest's ``features``), or None if TFDS could not parse them."""
    spec = manifest.get("features") or {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURES.items()}
    schema = {key: value["dtype"] for key, value in spec.items()}
    if any(value.get("shape") != [] for value in spec.values()) or \
            not {IMAGE_KEY, LABEL_KEY} <= set(schema) or not set(schema.values()) <= {"string", *_TENSOR_DTYPES}:
        return None
    return schema


def _shard_name(split: str, index: int, count: int) -> str:
    """The name TFDS reads shard ``index`` of ``count`` under (``naming.ShardedFileTemplate``)."""
    width = max(len(str(count)), 5)
    return f"{split}-{index:0{width}d}-of-{count:0{width}d}.tfrecord"


def _split_info(name: str, split: dict[str, Any]) -> dict[str, Any]:
    shards = split["shards"]
    return {"filepathTemplate": TEMPLATE, "name": name,
            "numBytes": str(sum(int(s["num_bytes"]) for s in shards)),
            "shardLengths": [str(int(s["num_records"])) for s in shards]}


def _readable(manifest: dict[str, Any]) -> bool:
    """Whether TFDS can read the version's shards as the manifest lists them."""
    if manifest.get("compression", "none") != "none":
        return False
    for name, split in manifest["splits"].items():
        shards = split["shards"]
        if not any(c.isalnum() for c in name) or any(
                s["file"] != _shard_name(name, i, len(shards)) for i, s in enumerate(shards)):
            return False
    return True


def tfds_metadata_files(manifest: dict[str, Any]) -> dict[str, bytes]:
    """The TFDS metadata files ({"dataset_info.json": ..., "features.json": ..., the class names'
    ``image.class.label.labels.txt``}) that let ``tfds.builder_from_directory(VERSION_FOLDER)`` read
    a published version, by file name.

    Returns ``{}`` when TFDS could not read the version, most often because it is gzip-compressed:
    TFDS opens every tfrecord shard with ``tf.data.TFRecordDataset(filename)`` and no compression
    type (``file_adapters.TfRecordFileAdapter``), and nothing in its metadata can change that. Also
    ``{}`` for shard names other than those TFDS derives from the template (100,000 shards or more:
    TFDS pads the index to the count's width), split names without a letter or digit, and record
    keys TFDS could not parse (no image or label, not scalar).
    Splits without shards are left out (TFDS cannot read an empty split).
    """
    schema = _schema(manifest)
    if schema is None or not _readable(manifest):
        return {}
    classes = [str(name) for name in manifest["classes"]]
    dataset, version = manifest["dataset"], manifest["version"]
    note = f"image-tfrecords version {version} of dataset {dataset}"
    info = {
        "description": f"{note}: {manifest['num_records']} images in {len(classes)} classes. "
                       f"Version {TFDS_VERSION} is a placeholder: TFDS needs X.Y.Z.",
        "fileFormat": "tfrecord",
        "name": dataset,
        "releaseNotes": {TFDS_VERSION: note},
        "splits": [_split_info(name, split) for name, split in manifest["splits"].items() if split["shards"]],
        "supervisedKeys": {"tuple": {"items": [{"featureKey": IMAGE_KEY}, {"featureKey": LABEL_KEY}]}},
        "version": TFDS_VERSION,
    }
    files = {"dataset_info.json": json.dumps(info, indent=2, sort_keys=True).encode(),
             "features.json": json.dumps(features_json(schema, len(classes)), indent=4, sort_keys=True).encode()}
    # TFDS reads names back one a line, stripped, blank lines dropped: only names that survive that.
    if all(name and name == name.strip() and "\n" not in name for name in classes):
        files[LABELS_FILE] = ("\n".join(classes) + "\n").encode()
    return files
