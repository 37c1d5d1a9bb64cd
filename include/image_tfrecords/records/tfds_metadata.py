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
  unless the build fixed them (``channels`` 1, 3 or 4: that many) or the size (``resize WxH``
  with ``fit pad`` or ``upscale``: shape ``(H, W, C)``), which TFDS's ``Image`` then states;
* ``image/class/label``: the class id (``int64``), ``ClassLabel`` over the manifest's ``classes``;
* ``image/height``, ``image/width``, ``image/channels`` (``int64``; the stored image's, so
  ``image/channels`` may be 1, 2 or 4 while ``image/encoded`` has 3);
* ``image/format``, ``image/class/text``, ``image/filename``, ``image/sha256``: ``tf.string``.

The other record layouts (see the manifest's ``features``):

* raw pixels (``image/raw`` + ``image/shape`` in place of ``image/encoded``): ``image/raw`` is a
  ``Tensor(shape=(H, W, C), dtype=uint8, encoding="bytes")``, which TFDS reads as our bytes with
  ``tf.io.decode_raw`` and a reshape to that *fixed* shape; ``image/shape`` a ``Tensor((3,), int64)``.
  Only when the build made every image one size (``resize WxH`` with ``fit pad``, or with
  ``upscale``; channels are always fixed for raw): a ``Tensor`` of varying size is, to TFDS, a
  nested ``{"shape", "value"}`` pair of features (``image/raw/shape``, ``image/raw/value``), which
  our records do not have, and ``Image`` wants encoded bytes. Raw versions of varying size get no
  TFDS metadata.
* multi-label (``image/class/label`` and ``image/class/text`` of shape ``[null]``):
  ``Sequence(ClassLabel)`` and ``Sequence(Text)``; TFDS parses them with
  ``FixedLenSequenceFeature(allow_missing=True)``, so ``as_supervised`` gives the list of ids.
* metadata columns: ``string`` -> ``Text``, ``int64``/``float`` -> ``Tensor`` (``int64``/``float32``),
  ``*_list`` -> ``Sequence`` of those.

Anything else (a feature of another shape or dtype, no image or label feature) gets no metadata:
none rather than metadata TFDS would read wrongly.

``as_supervised=True`` yields ``(image, label)``: supervised keys ``("image/encoded",
"image/class/label")`` (``"image/raw"`` for raw versions). TFDS wants an ``X.Y.Z`` version, so the
metadata says ``1.0.0`` and names our version in the description and release notes. The split
files are read through ``filepathTemplate`` ``{SPLIT}-{SHARD_X_OF_Y}.tfrecord`` (TFDS pads index
and count to at least 5 digits) with ``shardLengths`` from the manifest's shards.
"""

from __future__ import annotations

import json
from typing import Any

from ..published.manifest import Manifest, SplitEntry, as_manifest, image_shape
from .schema import FEATURES, IMAGE_KEY, LABEL_KEY, RAW_KEY, SHAPE_KEY

TFDS_VERSION = "1.0.0"
LABELS_FILE = LABEL_KEY.replace("/", ".") + ".labels.txt"  # features.convert_feature_name_to_filename
TEMPLATE = "{SPLIT}-{SHARD_X_OF_Y}.tfrecord"
_MODULE = "tensorflow_datasets.core.features."
_TENSOR_DTYPES = {"int64": "int64", "float": "float32"}
Shape = tuple[int | None, ...]


def _shape_json(shape: tuple[int, ...]) -> dict[str, Any]:
    return {"dimensions": [str(d) for d in shape]} if shape else {}


def _tensor(dtype: str, shape: tuple[int, ...] = (), encoding: str = "none") -> dict[str, Any]:
    return {"pythonClassName": _MODULE + "tensor_feature.Tensor",
            "tensor": {"dtype": dtype, "encoding": encoding, "shape": _shape_json(shape)}}


def _scalar(key: str, dtype: str, num_classes: int) -> dict[str, Any]:
    """One value of a feature (the feature itself, or the items of a ``Sequence``)."""
    if key == LABEL_KEY:
        return {"classLabel": {"numClasses": str(num_classes)},
                "pythonClassName": _MODULE + "class_label_feature.ClassLabel"}
    if dtype == "string":
        return {"pythonClassName": _MODULE + "text_feature.Text", "text": {}}
    return _tensor(_TENSOR_DTYPES[dtype])


def _feature(key: str, dtype: str, shape: Shape, num_classes: int, image: Shape = (None, None, None)
             ) -> dict[str, Any]:
    """One feature as ``json_format.MessageToDict(feature.to_proto())`` gives it (``image``: the
    (height, width, channels) every stored image has, None where they vary)."""
    if key == IMAGE_KEY:
        height, width, channels = image
        dims = [str(-1 if d is None else d) for d in (height, width, channels or 3)]
        return {"image": {"dtype": "uint8", "shape": {"dimensions": dims}},
                "pythonClassName": _MODULE + "image_feature.Image"}
    if key == RAW_KEY:
        assert None not in image
        return _tensor("uint8", tuple(int(d or 0) for d in image), "bytes")
    if shape == (None,):
        return {"pythonClassName": _MODULE + "sequence_feature.Sequence",
                "sequence": {"feature": _scalar(key, dtype, num_classes), "length": "-1"}}
    if shape:
        return _tensor(_TENSOR_DTYPES[dtype], tuple(int(d or 0) for d in shape))
    return _scalar(key, dtype, num_classes)


def features_json(schema: dict[str, str | tuple[str, Shape]], num_classes: int,
                  image: Shape = (None, None, None)) -> dict[str, Any]:
    """``features.json``'s content: a flat ``FeaturesDict`` over the record keys (``schema``: key -> dtype,
    or (dtype, shape); ``image``: the (height, width, channels) every stored image has, None where
    they vary; all three known for ``image/raw``)."""
    features = {}
    for key, value in schema.items():
        dtype, shape = (value, ()) if isinstance(value, str) else value
        features[key] = _feature(key, dtype, shape, num_classes, image)
    return {"featuresDict": {"features": features}, "pythonClassName": _MODULE + "features_dict.FeaturesDict"}


def _supported(key: str, dtype: str, shape: Shape) -> bool:
    """Whether TFDS reads feature ``key`` of that dtype and shape as it is stored."""
    if dtype not in ("string", *_TENSOR_DTYPES):
        return False
    if key in (IMAGE_KEY, RAW_KEY):
        return dtype == "string" and shape == ()
    if key == SHAPE_KEY:
        return dtype == "int64" and shape == (3,)
    if key == LABEL_KEY:
        return dtype == "int64" and shape in ((), (None,))
    if shape in ((), (None,)):
        return True
    return dtype != "string" and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)


def _schema(manifest: Manifest) -> tuple[dict[str, str | tuple[str, Shape]], Shape] | None:
    """The version's record keys with their dtypes and shapes (its manifest's ``features``), and the
    (height, width, channels) its images all have (None where they vary); None if TFDS could not
    read the records as they are."""
    spec = manifest.features or {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURES.items()}
    schema: dict[str, str | tuple[str, Shape]] = {}
    for key, value in spec.items():
        dtype, shape = value.get("dtype"), value.get("shape")
        if not isinstance(shape, list) or not _supported(key, dtype, tuple(shape)):
            return None
        schema[key] = dtype if not shape else (dtype, tuple(shape))
    if LABEL_KEY not in schema or (IMAGE_KEY in schema) == (RAW_KEY in schema):
        return None
    try:
        image = image_shape(manifest)
    except (TypeError, ValueError, AttributeError):
        return None
    if IMAGE_KEY in schema:
        return schema, image
    if SHAPE_KEY not in schema or None in image:
        return None  # raw images of varying size: TFDS has no feature for them under our keys
    return schema, image


def _shard_name(split: str, index: int, count: int) -> str:
    """The name TFDS reads shard ``index`` of ``count`` under (``naming.ShardedFileTemplate``)."""
    width = max(len(str(count)), 5)
    return f"{split}-{index:0{width}d}-of-{count:0{width}d}.tfrecord"


def _split_info(name: str, split: SplitEntry) -> dict[str, Any]:
    return {"filepathTemplate": TEMPLATE, "name": name, "numBytes": str(split.num_bytes),
            "shardLengths": [str(s.num_records) for s in split.shards]}


def _readable(manifest: Manifest) -> bool:
    """Whether TFDS can read the version's shards as the manifest lists them."""
    if manifest.compression != "none":
        return False
    for name, split in manifest.splits.items():
        shards = split.shards
        if not any(c.isalnum() for c in name) or any(
                s.file != _shard_name(name, i, len(shards)) for i, s in enumerate(shards)):
            return False
    return True


def tfds_metadata_files(manifest: Manifest | dict[str, Any]) -> dict[str, bytes]:
    """The TFDS metadata files ({"dataset_info.json": ..., "features.json": ..., the class names'
    ``image.class.label.labels.txt``}) that let ``tfds.builder_from_directory(VERSION_FOLDER)`` read
    a published version, by file name.

    Returns ``{}`` when TFDS could not read the version, most often because it is gzip-compressed:
    TFDS opens every tfrecord shard with ``tf.data.TFRecordDataset(filename)`` and no compression
    type (``file_adapters.TfRecordFileAdapter``), and nothing in its metadata can change that. Also
    ``{}`` for shard names other than those TFDS derives from the template (100,000 shards or more:
    TFDS pads the index to the count's width), split names without a letter or digit, and record
    keys TFDS could not parse (no image or label, shapes it has no feature for, raw images of
    varying size: see the module's docstring).
    Splits without shards are left out (TFDS cannot read an empty split).
    """
    manifest = as_manifest(manifest)
    found = _schema(manifest)
    if found is None or not _readable(manifest):
        return {}
    schema, image = found
    image_key = IMAGE_KEY if IMAGE_KEY in schema else RAW_KEY
    classes = list(manifest.classes)
    dataset, version = manifest.dataset, manifest.version
    note = f"image-tfrecords version {version} of dataset {dataset}"
    info = {
        "description": f"{note}: {manifest.num_records} images in {len(classes)} classes. "
                       f"Version {TFDS_VERSION} is a placeholder: TFDS needs X.Y.Z.",
        "fileFormat": "tfrecord",
        "name": dataset,
        "releaseNotes": {TFDS_VERSION: note},
        "splits": [_split_info(name, split) for name, split in manifest.splits.items() if split.shards],
        "supervisedKeys": {"tuple": {"items": [{"featureKey": image_key}, {"featureKey": LABEL_KEY}]}},
        "version": TFDS_VERSION,
    }
    features = features_json(schema, len(classes), image)
    files = {"dataset_info.json": json.dumps(info, indent=2, sort_keys=True).encode(),
             "features.json": json.dumps(features, indent=4, sort_keys=True).encode()}
    # TFDS reads names back one a line, stripped, blank lines dropped: only names that survive that.
    if all(name and name == name.strip() and "\n" not in name for name in classes):
        files[LABELS_FILE] = ("\n".join(classes) + "\n").encode()
    return files
