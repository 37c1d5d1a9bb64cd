"""Read a published dataset as a ``tf.data.Dataset`` of ``(image, label)`` pairs.

The manifest (``dataset_info.json``) says which shards make up a split, how they are compressed and
which features a record holds, so nothing here hard-codes a dataset::

    from image_tfrecords.loader import label_names, load_split

    def resize(image, label):
        return tf.image.resize(image, [224, 224]) / 255.0, label

    ds = load_split("s3://datasets/image-tfrecords/flowers", "train").shuffle(1000).map(resize).batch(32)
    names = label_names("s3://datasets/image-tfrecords/flowers")   # names[label] is the class name

``uri`` is a published version (``DEST/DATASET/VERSION``) or a dataset (``DEST/DATASET``: the
version ``latest.json`` names), a local folder or ``s3://``. A version without ``_SUCCESS`` is
refused. TensorFlow has no S3 filesystem, so S3 shards are fetched into a local cache folder as the
interleave reaches them, checked against the manifest's SHA-256, and reused from there.

TensorFlow is imported inside the functions: importing this module stays cheap (the Airflow DAG
imports the package).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .documents import read_json
from .errors import NotPublishedError, ShardChecksumError
from .stages import LATEST, MANIFEST, SUCCESS
from .storage import Storage, is_s3, join, sha256_file, split_s3

if TYPE_CHECKING:
    import tensorflow as tf

IMAGE_KEY = "image/encoded"
LABEL_KEY = "image/class/label"
_COMPRESSION = {"none": "", "gzip": "GZIP"}






@dataclass(frozen=True)
class _Shard:
    uri: str  # where the manifest says it is
    path: str  # the local file TensorFlow reads (the cache copy for S3 shards)
    sha256: str | None
    num_bytes: int | None


# -- manifest ---------------------------------------------------------------------------------
def resolve(uri: str, storage: Storage | None = None) -> str:
    """The published version URI for ``uri`` (a version, or a dataset resolved through ``latest.json``)."""
    storage = storage or Storage()
    uri = uri.rstrip("/")
    version = uri
    if not storage.exists(join(uri, MANIFEST)):
        try:
            latest = read_json(storage, join(uri, LATEST))
        except FileNotFoundError:
            raise NotPublishedError(f"{uri}: no dataset_info.json (a version) nor latest.json (a dataset)") from None
        version = join(uri, str(latest["version"]))
    if not storage.exists(join(version, SUCCESS)):
        raise NotPublishedError(f"{version} has no _SUCCESS: it is not published (still being built, or failed)")
    return version


def _manifest(uri: str, storage: Storage) -> tuple[str, dict[str, Any]]:
    version = resolve(uri, storage)
    return version, read_json(storage, join(version, MANIFEST))


def info(uri: str, storage: Storage | None = None) -> dict[str, Any]:
    """The manifest (``dataset_info.json``) of the published version ``uri`` resolves to."""
    return _manifest(uri, storage or Storage())[1]


def label_names(uri: str, storage: Storage | None = None) -> list[str]:
    """Class names, indexed by label id."""
    return list(info(uri, storage)["classes"])


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


def _split_shards(manifest: dict[str, Any], split: str) -> list[dict[str, Any]]:
    splits = manifest["splits"]
    if split not in splits:
        raise ValueError(f"unknown split {split!r}; available splits: {', '.join(sorted(splits))}")
    return list(splits[split]["shards"])


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


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def _has_sha256(path: str, expected: str) -> bool:
    """Whether ``path`` hashes to ``expected``; a file hashed before and unchanged since is not re-read."""
    stamp = _stamp(path)
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


def _local_path(shard: _Shard, verify: bool) -> str:
    if verify:
        _check(shard, shard.path)
    return shard.path


def _shards(version: str, entries: list[dict[str, Any]], cache_dir: str | None) -> list[_Shard]:
    out = []
    for entry in entries:
        uri = join(version, entry["file"])
        path = _cache_path(cache_dir or _default_cache_dir(), uri) if is_s3(uri) else uri
        out.append(_Shard(uri, path, entry.get("sha256"), entry.get("num_bytes")))
    return out


# -- the dataset ------------------------------------------------------------------------------
def load_split(uri: str, split: str, *, shuffle_files: bool = False, seed: int | None = None,
               cycle_length: int | None = None, cache_dir: str | None = None, decode: bool = True,
               verify: bool = True, storage: Storage | None = None) -> tf.data.Dataset:
    """``(image, label)`` pairs of one split: image ``uint8 [height, width, channels]`` (or the encoded
    bytes with ``decode=False``), label an ``int64`` scalar.

    Shards are read in parallel (``cycle_length`` at a time, default: TensorFlow's choice), in
    manifest order unless ``shuffle_files`` (seeded by ``seed``). S3 shards are cached in
    ``cache_dir`` (default: a temporary folder of this process). With ``verify`` every shard is
    checked once against the manifest's SHA-256; a mismatch fails iteration with an error naming it.
    S3 credentials come from boto3's standard environment unless ``storage`` is given.
    """
    import tensorflow as tf

    storage = storage or Storage()
    version, manifest = _manifest(uri, storage)
    shards = _shards(version, _split_shards(manifest, split), cache_dir)
    compression = _COMPRESSION.get(manifest.get("compression", "none"))
    if compression is None:
        raise ValueError(f"{version}: unknown compression {manifest['compression']!r}")
    spec = feature_spec(manifest)
    missing = {IMAGE_KEY, LABEL_KEY} - spec.keys()
    if missing:
        raise ValueError(f"{version}: the manifest lists no {', '.join(sorted(missing))} feature")
    spec = {IMAGE_KEY: spec[IMAGE_KEY], LABEL_KEY: spec[LABEL_KEY]}
    by_uri = {shard.uri: shard for shard in shards}
    remote = any(is_s3(shard.uri) for shard in shards)
    if remote:
        _ = storage.s3  # make the client here: creating boto3 clients from TensorFlow's threads is not safe

    def local_file(shard_uri: bytes) -> bytes:
        shard = by_uri[shard_uri.decode()]
        path = _fetch(storage, shard, verify) if is_s3(shard.uri) else _local_path(shard, verify)
        return path.encode()

    def open_shard(shard_uri: tf.Tensor) -> tf.data.Dataset:
        path = shard_uri
        if remote or verify:
            path = tf.numpy_function(local_file, [shard_uri], tf.string, stateful=True, name="fetch_shard")
            path = tf.ensure_shape(path, [])
        return tf.data.TFRecordDataset(path, compression_type=compression)

    def parse(raw: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(raw, spec)
        image = example[IMAGE_KEY]
        if decode:
            image = tf.io.decode_image(image, dtype=tf.uint8, expand_animations=False)
        return image, example[LABEL_KEY]

    files = tf.data.Dataset.from_tensor_slices(tf.constant([shard.uri for shard in shards], dtype=tf.string))
    if shuffle_files:
        files = files.shuffle(len(shards), seed=seed)
    records = files.interleave(open_shard, cycle_length=cycle_length, num_parallel_calls=tf.data.AUTOTUNE,
                               deterministic=not shuffle_files)
    return records.map(parse, num_parallel_calls=tf.data.AUTOTUNE)
