"""Read a published dataset as a ``tf.data.Dataset`` ready for ``model.fit`` (see docs/loader.md)::

    ds = load_split("s3://datasets/image-tfrecords/flowers", "train", image_size=(224, 224), batch_size=32)

``uri`` is a version (``DEST/DATASET/VERSION``) or a dataset (the version ``latest.json`` names),
local or ``s3://``; ``layout`` finds the version and its manifest. S3 shards are fetched into a
local cache (TensorFlow has no S3 filesystem) and checked against the manifest's SHA-256.
TensorFlow and pandas are imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .errors import NotPublishedError, ShardChecksumError
from .layout import LABELS, read_manifest
from .layout import resolve as _resolve
from .storage import Storage, is_s3, join, sha256_file, split_s3

if TYPE_CHECKING:
    import pandas as pd
    import tensorflow as tf

__all__ = ["AUTOTUNE", "NotPublishedError", "ShardChecksumError", "feature_spec", "info", "label_names", "labels",
           "load_split", "resolve"]

AUTOTUNE = -1  # tf.data.AUTOTUNE, without importing TensorFlow
IMAGE_KEY, LABEL_KEY = "image/encoded", "image/class/label"
DECODED_KEY = "image"  # the decoded image in ``as_dict`` mode (in place of the encoded bytes)
SHUFFLE_MEMORY = 256 * 2**20  # shuffle=True: a buffer of as many encoded records as fit in this...
MIN_SHUFFLE = 1_000  # ...but at least this many (or the whole split)
_COMPRESSION = {"none": "", "gzip": "GZIP"}
_INT_COLUMNS = ("label_id", "width", "height", "channels", "num_bytes", "encoded_bytes")


@dataclass(frozen=True)
class _Shard:
    uri: str  # where the manifest says it is
    path: str  # the local file TensorFlow reads (the cache copy for S3 shards)
    sha256: str | None
    num_bytes: int | None


# -- manifest ---------------------------------------------------------------------------------
def resolve(uri: str, storage: Storage | None = None) -> str:
    """The published version URI for ``uri`` (a version, or a dataset resolved through ``latest.json``)."""
    return _resolve(storage or Storage(), uri)


def _manifest(uri: str, storage: Storage) -> tuple[str, dict[str, Any]]:
    version = _resolve(storage, uri)
    return version, read_manifest(storage, version)


def info(uri: str, storage: Storage | None = None) -> dict[str, Any]:
    """The manifest of the published version ``uri`` resolves to."""
    return _manifest(uri, storage or Storage())[1]


def label_names(uri: str, storage: Storage | None = None) -> list[str]:
    """Class names, indexed by label id."""
    return list(info(uri, storage)["classes"])


def labels(uri: str, storage: Storage | None = None) -> pd.DataFrame:
    """The version's ``labels.csv`` (one row per record) as a pandas DataFrame; text columns stay text."""
    import pandas as pd

    storage = storage or Storage()
    frame = pd.read_csv(io.BytesIO(storage.read_bytes(join(_resolve(storage, uri), LABELS))), dtype=str,
                        keep_default_na=False)
    ints = [c for c in _INT_COLUMNS if c in frame.columns]
    return frame.astype(dict.fromkeys(ints, "int64"))


def feature_spec(manifest: dict[str, Any]) -> dict[str, tf.io.FixedLenFeature]:
    """``tf.io.parse_single_example`` features for every key the manifest lists."""
    import tensorflow as tf

    dtypes = {"string": tf.string, "int64": tf.int64, "float": tf.float32}
    spec = {}
    for key, feature in manifest["features"].items():
        if feature["dtype"] not in dtypes:
            raise ValueError(f"feature {key!r} has an unknown dtype {feature['dtype']!r}")
        spec[key] = tf.io.FixedLenFeature(feature.get("shape", []), dtypes[feature["dtype"]])
    return spec


def _split(manifest: dict[str, Any], split: str) -> dict[str, Any]:
    splits = manifest["splits"]
    if split not in splits:
        raise ValueError(f"unknown split {split!r}; available splits: {', '.join(sorted(splits))}")
    return splits[split]


# -- shard files ------------------------------------------------------------------------------
_default_cache: tuple[int, str] | None = None
_verified: dict[str, tuple[int, int, str]] = {}  # local path -> (size, mtime_ns, sha256) already hashed
_lock = threading.Lock()


def _default_cache_dir() -> str:
    """A temporary folder for this process, deleted when it exits."""
    global _default_cache
    with _lock:
        if _default_cache is None or _default_cache[0] != os.getpid():
            path = tempfile.mkdtemp(prefix="image-tfrecords-cache-")
            atexit.register(shutil.rmtree, path, True)
            _default_cache = (os.getpid(), path)
        return _default_cache[1]


def _cache_path(cache_dir: str, uri: str) -> str:
    """``cache_dir/bucket/key``, with path parts that could escape the folder made harmless."""
    bucket, key = split_s3(uri)
    parts = [bucket, *key.split("/")]
    return os.path.join(cache_dir, *[p if p not in ("", ".", "..") else f"%{len(p)}" for p in parts])


def _has_sha256(path: str, expected: str) -> bool:
    """Whether ``path`` hashes to ``expected``; a file hashed before and unchanged since is not re-read."""
    st = os.stat(path)
    stamp = (st.st_size, st.st_mtime_ns)
    with _lock:
        known = _verified.get(path)
    if known and known[:2] == stamp:
        return known[2] == expected
    actual = sha256_file(path)
    with _lock:
        _verified[path] = (*stamp, actual)
    return actual == expected


def _check(shard: _Shard, path: str) -> None:
    if shard.sha256 and not _has_sha256(path, shard.sha256):
        raise ShardChecksumError(f"shard {shard.uri} does not match its sha256 in the manifest ({shard.sha256}): "
                                 "it is corrupt or was changed after publishing")


def _cached(shard: _Shard, verify: bool) -> bool:
    """Whether the cache already holds this shard's bytes."""
    if not os.path.isfile(shard.path):
        return False
    if verify and shard.sha256:
        return _has_sha256(shard.path, shard.sha256)
    return shard.num_bytes is None or os.path.getsize(shard.path) == shard.num_bytes


def _fetch(storage: Storage, shard: _Shard, verify: bool) -> str:
    """The local path of ``shard``: downloaded (to a temporary name, checked, renamed) unless cached."""
    if _cached(shard, verify):
        return shard.path
    folder, name = os.path.split(shard.path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix="-" + name)
    os.close(fd)
    try:
        storage.download(shard.uri, tmp)
        if verify:
            _check(shard, tmp)
        os.replace(tmp, shard.path)
    finally:
        with _lock:  # a verified hash now belongs to the renamed file (same inode, same mtime)
            known = _verified.pop(tmp, None)
            if known and not os.path.exists(tmp):
                _verified[shard.path] = known
        if os.path.exists(tmp):
            os.unlink(tmp)
    return shard.path


def _shards(version: str, entries: list[dict[str, Any]], cache_dir: str | None) -> list[_Shard]:
    out = []
    for entry in entries:
        uri = join(version, entry["file"])
        path = _cache_path(cache_dir or _default_cache_dir(), uri) if is_s3(uri) else uri
        out.append(_Shard(uri, path, entry.get("sha256"), entry.get("num_bytes")))
    return out


# -- the dataset ------------------------------------------------------------------------------
def _options(image_size: tuple[int, int] | None, channels: int | None, batch_size: int | None,
             shuffle: bool | int, decode: bool) -> int | None:
    """Check the image and batching options; returns the channel count images are converted to."""
    if image_size is not None and not (isinstance(image_size, tuple | list) and len(image_size) == 2
                                       and all(isinstance(s, int) and s > 0 for s in image_size)):
        raise ValueError(f"image_size must be (height, width), two positive ints, not {image_size!r}")
    if channels not in (None, 1, 3, 4):
        raise ValueError(f"channels must be 1 (grey), 3 (RGB) or 4 (RGBA), not {channels!r}")
    if batch_size is not None and (not isinstance(batch_size, int) or batch_size < 1):
        raise ValueError(f"batch_size must be a positive int, not {batch_size!r}")
    if not isinstance(shuffle, int) or shuffle < 0:  # True and False are ints
        raise ValueError(f"shuffle must be True, False or a buffer size (an int >= 0), not {shuffle!r}")
    if not decode and (image_size is not None or channels is not None):
        raise ValueError("image_size and channels need decode=True: encoded bytes cannot be resized or converted")
    if decode and batch_size is not None and image_size is None:
        raise ValueError("batch_size needs image_size: the images of a split have different sizes and a batch is "
                         "one tensor of one shape; pass image_size=(height, width) to resize them all, or batch "
                         "yourself (padded_batch, ragged_batch)")
    return 3 if channels is None and image_size is not None else channels  # None: as stored


def _shuffle_buffer(shuffle: bool | int, entry: dict[str, Any], count: int) -> int:
    """``True``: the records that fit in SHUFFLE_MEMORY (the whole split, or at least MIN_SHUFFLE)."""
    if shuffle is not True:
        return int(shuffle)
    size = sum(shard.get("num_bytes") or 0 for shard in entry["shards"])
    fit = count if size <= SHUFFLE_MEMORY else count * SHUFFLE_MEMORY // size
    return max(1, min(count, max(fit, MIN_SHUFFLE)))


def _decoder(channels: int | None, image_size: tuple[int, int] | None) -> Any:
    """``encoded -> uint8 [height, width, channels]``, converted to ``channels`` and resized to ``image_size``."""
    import tensorflow as tf

    def decode(encoded: tf.Tensor, c: int) -> tf.Tensor:
        return tf.io.decode_image(encoded, channels=c, dtype=tf.uint8, expand_animations=False)

    def image(encoded: tf.Tensor) -> tf.Tensor:
        if channels == 4:  # JPEG has no alpha: decode RGB, add an opaque one
            out = tf.cond(tf.io.is_jpeg(encoded),
                          lambda: tf.pad(decode(encoded, 3), [[0, 0], [0, 0], [0, 1]], constant_values=255),
                          lambda: decode(encoded, 4))
        else:
            out = decode(encoded, channels or 0)
        if image_size is not None:
            out = tf.saturate_cast(tf.round(tf.image.resize(out, image_size)), tf.uint8)
        return out

    return image


def load_split(uri: str, split: str, *, image_size: tuple[int, int] | None = None, channels: int | None = None,
               batch_size: int | None = None, shuffle: bool | int = False, seed: int | None = None,
               drop_remainder: bool = False, as_dict: bool = False, decode: bool = True,
               shuffle_files: bool = False, cycle_length: int | None = None, num_parallel_calls: int = AUTOTUNE,
               cache_dir: str | None = None, verify: bool = True, storage: Storage | None = None) -> tf.data.Dataset:
    """One split of a published dataset: ``(image, label)`` pairs, or dicts of every feature with ``as_dict``.

    ``image`` is always ``uint8 [height, width, channels]``: channels as stored (1, 2, 3 or 4) unless
    ``channels`` (1, 3 or 4) converts every image; ``image_size=(h, w)`` resizes (bilinear, rounded
    back to uint8) and defaults ``channels`` to 3. ``decode=False`` gives the encoded bytes instead.
    ``label`` is an ``int64`` class id (``label_names(uri)[label]``). ``as_dict`` gives every feature
    in the manifest, the decoded image under ``"image"`` in place of ``"image/encoded"``.

    The dataset knows its cardinality (the manifest's record count; after ``batch_size``, the batch
    count, rounded down with ``drop_remainder``). ``shuffle`` shuffles shard order and records
    (``True``: a buffer of the whole split, up to 256 MiB of encoded records and at least 1,000;
    an int: that buffer size), reshuffled every epoch, repeatable with ``seed``.
    ``batch_size`` needs ``image_size``. Shards are read ``cycle_length`` at a time; S3 shards are
    cached in ``cache_dir`` (default: a temporary folder of this process) and, with ``verify``,
    checked against the manifest's SHA-256 (a mismatch fails iteration naming the shard).
    """
    import tensorflow as tf

    channels = _options(image_size, channels, batch_size, shuffle, decode)
    storage = storage or Storage()
    version, manifest = _manifest(uri, storage)
    entry = _split(manifest, split)
    shards = _shards(version, list(entry["shards"]), cache_dir)
    count = int(entry.get("num_records", sum(s["num_records"] for s in entry["shards"])))
    compression = _COMPRESSION.get(manifest.get("compression", "none"))
    if compression is None:
        raise ValueError(f"{version}: unknown compression {manifest['compression']!r}")
    spec = feature_spec(manifest)
    if missing := {IMAGE_KEY, LABEL_KEY} - spec.keys():
        raise ValueError(f"{version}: the manifest lists no {', '.join(sorted(missing))} feature")
    if not as_dict:
        spec = {IMAGE_KEY: spec[IMAGE_KEY], LABEL_KEY: spec[LABEL_KEY]}
    by_uri = {shard.uri: shard for shard in shards}
    remote = any(is_s3(shard.uri) for shard in shards)
    if remote:
        _ = storage.s3  # make the client here: creating boto3 clients from TensorFlow's threads is not safe

    def local_file(shard_uri: bytes) -> bytes:
        shard = by_uri[shard_uri.decode()]
        if is_s3(shard.uri):
            return _fetch(storage, shard, verify).encode()
        if verify:
            _check(shard, shard.path)
        return shard.path.encode()

    def open_shard(shard_uri: tf.Tensor) -> tf.data.Dataset:
        path = shard_uri
        if remote or verify:
            path = tf.numpy_function(local_file, [shard_uri], tf.string, stateful=True, name="fetch_shard")
            path = tf.ensure_shape(path, [])
        return tf.data.TFRecordDataset(path, compression_type=compression)

    image = _decoder(channels, image_size) if decode else tf.identity

    def parse(raw: tf.Tensor) -> Any:
        example = tf.io.parse_single_example(raw, spec)
        if not as_dict:
            return image(example[IMAGE_KEY]), example[LABEL_KEY]
        if decode:
            example[DECODED_KEY] = image(example.pop(IMAGE_KEY))
        return example

    shuffle_files = shuffle_files or bool(shuffle)
    files = tf.data.Dataset.from_tensor_slices(tf.constant([shard.uri for shard in shards], dtype=tf.string))
    if shuffle_files:
        files = files.shuffle(max(1, len(shards)), seed=seed)
    ds = files.interleave(open_shard, cycle_length=cycle_length, num_parallel_calls=num_parallel_calls,
                          deterministic=not shuffle_files or seed is not None)
    ds = ds.apply(tf.data.experimental.assert_cardinality(count))
    if shuffle:
        ds = ds.shuffle(_shuffle_buffer(shuffle, entry, count), seed=seed)  # encoded records: small
    ds = ds.map(parse, num_parallel_calls=num_parallel_calls)
    if batch_size is not None:
        ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)
