"""Read a published version back with TensorFlow, the reference reader."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from image_tfrecords.storage import Storage, join

FEATURE_KEYS = ("image/encoded", "image/format", "image/height", "image/width", "image/channels",
                "image/class/label", "image/class/text", "image/filename", "image/sha256")


def _spec() -> dict[str, Any]:
    import tensorflow as tf

    ints = ("image/height", "image/width", "image/channels", "image/class/label")
    return {k: tf.io.FixedLenFeature([], tf.int64 if k in ints else tf.string) for k in FEATURE_KEYS}


def read_version(storage: Storage, version_uri: str) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """(manifest, {split: [record dict with decoded image shape]}) for a published version."""
    import tensorflow as tf

    manifest = json.loads(storage.read_bytes(join(version_uri, "manifest.json")))
    compression = "GZIP" if manifest["compression"] == "gzip" else ""
    out: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for split, info in manifest["splits"].items():
            records = out.setdefault(split, [])
            for shard in info["shards"]:
                path = os.path.join(tmp, shard["file"])
                storage.download(join(version_uri, shard["file"]), path)
                for raw in tf.data.TFRecordDataset(path, compression_type=compression):
                    example = tf.io.parse_single_example(raw, _spec())
                    record = {k: v.numpy() for k, v in example.items()}
                    record["decoded_shape"] = tuple(tf.io.decode_image(example["image/encoded"]).shape)
                    record["shard"] = shard["file"]
                    records.append(record)
    return manifest, out
