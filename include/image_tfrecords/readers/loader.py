"""Read a published dataset as a ``tf.data.Dataset`` ready for ``model.fit`` (see docs/loader.md)::

    ds = load_split("s3://datasets/image-tfrecords/flowers", "train", image_size=(224, 224), batch_size=32)

``uri`` is a version (``DEST/DATASET/VERSION``) or a dataset (the version ``latest.json`` names),
local or ``s3://``; ``layout`` finds the version and its manifest. S3 shards are fetched into a
local cache (TensorFlow has no S3 filesystem) and checked against the manifest's SHA-256.
TensorFlow and pandas are imported inside the functions: importing this module stays cheap.

Every record layout the manifest can describe is read: encoded images (``image/encoded``) or raw
pixels (``image/raw`` + ``image/shape``), one class id or a variable-length list of them
(``"multi_label": true``), and labels.csv metadata columns (scalars or variable-length lists).
"""

from __future__ import annotations

import atexit
import io
import os
import shutil
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import NotPublishedError, ShardChecksumError
from ..published.layout import LABELS, read_manifest
from ..published.layout import resolve as _resolve
from ..published.manifest import Manifest, ShardEntry, SplitEntry, image_shape
from ..records.schema import IMAGE_KEY, LABEL_KEY, RAW_KEY, SHAPE_KEY
from ..storage import Storage, is_s3, join, sha256_file, split_s3

if TYPE_CHECKING:
    import pandas as pd
    import tensorflow as tf

__all__ = ["AUTOTUNE", "NotPublishedError", "ShardChecksumError", "compression_type", "feature_spec",
           "image_shape", "info", "label_names", "labels", "load_split", "resolve", "shard_files"]

AUTOTUNE = -1  # tf.data.AUTOTUNE, without importing TensorFlow
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


def _manifest(uri: str, storage: Storage) -> tuple[str, Manifest]:
    version = _resolve(storage, uri)
    return version, read_manifest(storage, version)


def info(uri: str, storage: Storage | None = None) -> Manifest:
    """The manifest of the published version ``uri`` resolves to (``published.manifest.Manifest``)."""
    return _manifest(uri, storage or Storage())[1]


def label_names(uri: str, storage: Storage | None = None) -> list[str]:
    """Class names, indexed by label id."""
    return list(info(uri, storage).classes)


def labels(uri: str, storage: Storage | None = None) -> pd.DataFrame:
    """The version's ``labels.csv`` (one row per record) as a pandas DataFrame; text columns stay text.

    Whole-number columns are ``int64``; ``encoded_bytes`` is a nullable ``Int64`` when some records were
    made by the writer (empty cells), and a multi-label ``label_id`` (``0|3``) stays text."""
    import pandas as pd

    storage = storage or Storage()
    frame = pd.read_csv(io.BytesIO(storage.read_bytes(join(_resolve(storage, uri), LABELS))), dtype=str,
                        keep_default_na=False)
    for column in (c for c in _INT_COLUMNS if c in frame.columns):
        numbers = frame[column].str.fullmatch(r"-?[0-9]+")
        if numbers.all():
            frame[column] = frame[column].astype("int64")
        elif (numbers | frame[column].eq("")).all():
            frame[column] = pd.to_numeric(frame[column].replace("", None)).astype("Int64")
    return frame


def feature_spec(manifest: Manifest | Mapping[str, Any]) -> dict[str, tf.io.FixedLenFeature | tf.io.VarLenFeature]:
    """``tf.io.parse_example`` features for every key the manifest (a ``Manifest`` or its JSON) lists.

    A shape ``[]`` is one value (``FixedLenFeature([])``), a fixed shape such as ``image/shape``'s
    ``[3]`` that many (``FixedLenFeature([3])``), and ``[null]`` any number: ``VarLenFeature``, which
    parses to a ``tf.SparseTensor``.
    """
    import tensorflow as tf

    dtypes = {"string": tf.string, "int64": tf.int64, "float": tf.float32}
    spec: dict[str, tf.io.FixedLenFeature | tf.io.VarLenFeature] = {}
    for key, feature in _features(manifest).items():
        if feature["dtype"] not in dtypes:
            raise ValueError(f"feature {key!r} has an unknown dtype {feature['dtype']!r}")
        shape = feature.get("shape", [])
        if not isinstance(shape, list | tuple):
            raise ValueError(f"feature {key!r} has an invalid shape {shape!r}")
        shape = list(shape)
        if None in shape:
            if shape != [None]:
                raise ValueError(f"feature {key!r} has a shape {shape!r}: only [null] can be of variable length")
            spec[key] = tf.io.VarLenFeature(dtypes[feature["dtype"]])
        elif all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            spec[key] = tf.io.FixedLenFeature(shape, dtypes[feature["dtype"]])
        else:
            raise ValueError(f"feature {key!r} has an invalid shape {shape!r}")
    return spec


def compression_type(manifest: Manifest | Mapping[str, Any]) -> str:
    """The version's shard compression as ``tf.data.TFRecordDataset``'s ``compression_type``: ``""`` or ``"GZIP"``."""
    stored = manifest.compression if isinstance(manifest, Manifest) else manifest.get("compression", "none")
    compression = _COMPRESSION.get(stored)
    if compression is None:
        raise ValueError(f"unknown compression {stored!r}")
    return compression


def _features(manifest: Manifest | Mapping[str, Any]) -> Mapping[str, Any]:
    """The manifest's ``features`` (a ``Manifest``, or its JSON as in ``feature_spec``)."""
    features = manifest.features if isinstance(manifest, Manifest) else manifest.get("features")
    if features is None:
        raise ValueError("the manifest lists no features (a version made before they were listed): rebuild it")
    return features


def _image_key(manifest: Manifest) -> str:
    """``image/encoded``, or ``image/raw`` for a version of raw pixels."""
    features = _features(manifest)
    if IMAGE_KEY in features:
        return IMAGE_KEY
    if RAW_KEY in features and SHAPE_KEY in features:
        return RAW_KEY
    raise ValueError(f"the manifest lists no {IMAGE_KEY} feature (nor {RAW_KEY} and {SHAPE_KEY})")


def _is_multi_label(manifest: Manifest) -> bool:
    label = _features(manifest).get(LABEL_KEY, {})
    return manifest.multi_label or None in label.get("shape", [])


def _split(manifest: Manifest, split: str) -> SplitEntry:
    splits = manifest.splits
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


def _shards(version: str, entries: Sequence[ShardEntry], cache_dir: str | None) -> list[_Shard]:
    out = []
    for entry in entries:
        uri = join(version, entry.file)
        path = _cache_path(cache_dir or _default_cache_dir(), uri) if is_s3(uri) else uri
        out.append(_Shard(uri, path, entry.sha256, entry.num_bytes))
    return out


def shard_files(uri: str, split: str, *, cache_dir: str | None = None, verify: bool = True,
                storage: Storage | None = None) -> list[str]:
    """Local paths of a split's shards, in manifest order, for readers that take file names
    (``tf.data.TFRecordDataset``, ``tf.data.experimental.make_batched_features_dataset``).

    Local shards are where they are; ``s3://`` shards are downloaded into ``cache_dir`` (default: a
    temporary folder of this process) as ``load_split`` does. With ``verify`` each is checked
    against the manifest's SHA-256 (``ShardChecksumError`` names a mismatch). Read them with
    ``compression_type(info(uri))``.
    """
    storage = storage or Storage()
    version, manifest = _manifest(uri, storage)
    paths = []
    for shard in _shards(version, _split(manifest, split).shards, cache_dir):
        if is_s3(shard.uri):
            paths.append(_fetch(storage, shard, verify))
        else:
            if verify:
                _check(shard, shard.path)
            paths.append(shard.path)
    return paths


# -- the dataset ------------------------------------------------------------------------------
def _options(image_size: tuple[int, int] | None, channels: int | None, batch_size: int | None,
             shuffle: bool | int, decode: bool, multi_hot: bool | None, as_dict: bool) -> None:
    """Check the image, label and batching options (before anything is read)."""
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
    if multi_hot not in (None, True, False):
        raise ValueError(f"multi_hot must be True, False or None (from the manifest), not {multi_hot!r}")
    if multi_hot is not None and as_dict:
        raise ValueError("multi_hot applies to (image, label) pairs; with as_dict, image/class/label is the "
                         "stored class id (a list of ids for a multi-label dataset)")


def _image_shape(manifest: Manifest, image_size: tuple[int, int] | None, channels: int | None,
                 batch_size: int | None, decode: bool) -> tuple[int | None, int | None, int | None]:
    """The ``(height, width, channels)`` decoded images come out with (None: as stored, differing)."""
    height, width, stored = image_shape(manifest)
    if image_size is not None:
        height, width = image_size
    if decode and batch_size is not None and (height is None or width is None):
        raise ValueError("batch_size needs image_size: the images of a split have different sizes and a batch is "
                         "one tensor of one shape; pass image_size=(height, width) to resize them all, or batch "
                         "yourself (padded_batch, ragged_batch)")
    if channels is None and (image_size is not None or batch_size is not None):
        channels = stored or 3  # one channel count to batch: the build's, else RGB
    return height, width, channels or stored


def _shuffle_buffer(shuffle: bool | int, entry: SplitEntry, count: int) -> int:
    """``True``: the records that fit in SHUFFLE_MEMORY (the whole split, or at least MIN_SHUFFLE)."""
    if shuffle is not True:
        return int(shuffle)
    size = entry.num_bytes
    fit = count if size <= SHUFFLE_MEMORY else count * SHUFFLE_MEMORY // size
    return max(1, min(count, max(fit, MIN_SHUFFLE)))


def _convert_channels(image: tf.Tensor, channels: int) -> tf.Tensor:
    """``uint8 [h, w, c]`` (c from 1 to 4) to ``channels`` as ``tf.io.decode_image(channels=...)`` converts:
    grey repeated to RGB, RGB made grey (``tf.image.rgb_to_grayscale``), alpha dropped or added opaque."""
    import tensorflow as tf

    def grey() -> tf.Tensor:  # from 1 or 2 channels
        return image[..., :1]

    def rgb_of_grey() -> tf.Tensor:
        return tf.tile(image[..., :1], [1, 1, 3])

    def rgb() -> tf.Tensor:  # from 3 or 4 channels
        return image[..., :3]

    def opaque(part: Any) -> Any:
        return lambda: tf.pad(part(), [[0, 0], [0, 0], [0, 1]], constant_values=255)

    def grey_of_rgb() -> tf.Tensor:
        return tf.image.rgb_to_grayscale(image[..., :3])

    def with_alpha(part: Any) -> Any:
        return lambda: tf.concat([part(), image[..., -1:]], -1)

    def same() -> tf.Tensor:
        return image

    branches = {1: [same, grey, grey_of_rgb, grey_of_rgb],
                3: [rgb_of_grey, rgb_of_grey, same, rgb],
                4: [opaque(rgb_of_grey), with_alpha(rgb_of_grey), opaque(rgb), same]}[channels]
    stored = tf.shape(image, out_type=tf.int32)[-1]
    check = tf.debugging.assert_equal(tf.logical_and(stored >= 1, stored <= 4), True,
                                      message="an image/shape whose channel count is not 1 to 4")
    with tf.control_dependencies([check]):
        return tf.switch_case(stored - 1, branches)


def _decoder(image_key: str, channels: int | None, image_size: tuple[int, int] | None,
             shape: tuple[int | None, int | None, int | None]) -> Any:
    """``features -> uint8 [height, width, channels]``: the record's image (encoded, or raw pixels with
    their ``image/shape``), converted to ``channels`` and resized to ``image_size``; ``shape`` is what
    the manifest says every output has (None: unknown)."""
    import tensorflow as tf

    def decode(encoded: tf.Tensor, c: int) -> tf.Tensor:
        return tf.io.decode_image(encoded, channels=c, dtype=tf.uint8, expand_animations=False)

    def encoded_image(encoded: tf.Tensor) -> tf.Tensor:
        if channels == 4:  # JPEG has no alpha: decode RGB, add an opaque one
            return tf.cond(tf.io.is_jpeg(encoded),
                           lambda: tf.pad(decode(encoded, 3), [[0, 0], [0, 0], [0, 1]], constant_values=255),
                           lambda: decode(encoded, 4))
        return decode(encoded, channels or 0)

    def raw_image(raw: tf.Tensor, stored: tf.Tensor) -> tf.Tensor:
        out = tf.reshape(tf.io.decode_raw(raw, tf.uint8), stored)
        return out if channels is None else _convert_channels(out, channels)

    def image(features: dict[str, tf.Tensor]) -> tf.Tensor:
        if image_key == RAW_KEY:
            out = raw_image(features[RAW_KEY], features[SHAPE_KEY])
        else:
            out = encoded_image(features[IMAGE_KEY])
        if image_size is not None:
            out = tf.saturate_cast(tf.round(tf.image.resize(out, image_size)), tf.uint8)
        if shape != (None, None, None):  # what the build promises, checked
            out = tf.ensure_shape(out, shape)
        return out

    return image


def _multi_hot(ids: tf.Tensor, num_classes: int) -> tf.Tensor:
    """``float32 [num_classes]``: 1 at each id (one id: one-hot; an empty list: all zeros)."""
    import tensorflow as tf

    hot = tf.one_hot(ids, num_classes, dtype=tf.float32)
    return hot if ids.shape.rank == 0 else tf.minimum(tf.reduce_sum(hot, 0), 1.0)


def _dense(value: Any) -> Any:
    """A variable-length feature as a 1-D tensor (empty when the record has none)."""
    import tensorflow as tf

    return tf.sparse.to_dense(value) if isinstance(value, tf.SparseTensor) else value


def _has_unknown_dims(spec: Any) -> bool:
    import tensorflow as tf

    return any(s.shape.rank is None or None in s.shape.as_list() for s in tf.nest.flatten(spec))


def load_split(uri: str, split: str, *, image_size: tuple[int, int] | None = None, channels: int | None = None,
               batch_size: int | None = None, shuffle: bool | int = False, seed: int | None = None,
               drop_remainder: bool = False, as_dict: bool = False, decode: bool = True,
               multi_hot: bool | None = None, shuffle_files: bool = False, cycle_length: int | None = None,
               num_parallel_calls: int = AUTOTUNE, cache_dir: str | None = None, verify: bool = True,
               storage: Storage | None = None) -> tf.data.Dataset:
    """One split of a published dataset: ``(image, label)`` pairs, or dicts of every feature with ``as_dict``.

    ``image`` is always ``uint8 [height, width, channels]``, decoded from ``image/encoded`` (JPEG or
    PNG) or, for a raw version, ``image/raw`` reshaped to ``image/shape``: channels as stored unless
    ``channels`` (1, 3 or 4) converts every image; ``image_size=(h, w)`` resizes (bilinear, rounded
    back to uint8) and defaults ``channels`` to the build's fixed channel count, else 3.
    ``decode=False`` gives the stored bytes instead (encoded, or the raw pixels).
    ``label`` is an ``int64`` class id (``label_names(uri)[label]``); for a multi-label version
    (manifest ``"multi_label": true``) it is a ``float32 [len(classes)]`` multi-hot vector, or with
    ``multi_hot=False`` the ``int64`` list of ids (``multi_hot=True`` also makes one-hot vectors of a
    single-label version). ``as_dict`` gives every feature in the manifest (metadata columns
    included), the decoded image under ``"image"`` in place of ``"image/encoded"`` or ``"image/raw"``;
    variable-length features are 1-D tensors, batched as ``tf.RaggedTensor``.

    The dataset knows its cardinality (the manifest's record count; after ``batch_size``, the batch
    count, rounded down with ``drop_remainder``). ``shuffle`` shuffles shard order and records
    (``True``: a buffer of the whole split, up to 256 MiB of stored records and at least 1,000;
    an int: that buffer size), reshuffled every epoch, repeatable with ``seed``.
    ``batch_size`` needs ``image_size`` unless the build made every image one size. Shards are read
    ``cycle_length`` at a time; S3 shards are cached in ``cache_dir`` (default: a temporary folder of
    this process) and, with ``verify``, checked against the manifest's SHA-256 (a mismatch fails
    iteration naming the shard).
    """
    import tensorflow as tf

    _options(image_size, channels, batch_size, shuffle, decode, multi_hot, as_dict)
    storage = storage or Storage()
    version, manifest = _manifest(uri, storage)
    entry = _split(manifest, split)
    shards = _shards(version, entry.shards, cache_dir)
    count = entry.num_records
    try:
        compression = compression_type(manifest)
        image_key = _image_key(manifest)
    except ValueError as exc:
        raise ValueError(f"{version}: {exc}") from None
    spec = feature_spec(manifest)
    if LABEL_KEY not in spec:
        raise ValueError(f"{version}: the manifest lists no {LABEL_KEY} feature")
    if as_dict and decode and DECODED_KEY in spec:
        raise ValueError(f"{version}: a feature is named {DECODED_KEY!r}, the key of the decoded image with "
                         "as_dict; read it with decode=False")
    shape = _image_shape(manifest, image_size, channels, batch_size, decode)
    channels = shape[2]  # asked for, else the one the build gave every image (decoded as such), else as stored
    image_keys = [image_key, SHAPE_KEY] if image_key == RAW_KEY and decode else [image_key]
    if not as_dict:
        spec = {key: spec[key] for key in (*image_keys, LABEL_KEY)}
    if multi_hot is None:
        multi_hot = _is_multi_label(manifest)
    num_classes = len(manifest.classes)
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

    image = _decoder(image_key, channels, image_size, shape)

    def parse(raw: tf.Tensor) -> Any:
        example = {key: _dense(value) for key, value in tf.io.parse_single_example(raw, spec).items()}
        if not as_dict:
            label = example[LABEL_KEY]
            if multi_hot:
                label = _multi_hot(label, num_classes)
            return (image(example) if decode else example[image_key]), label
        if decode:
            example[DECODED_KEY] = image(example)
            del example[image_key]
        return example

    shuffle_files = shuffle_files or bool(shuffle)
    files = tf.data.Dataset.from_tensor_slices(tf.constant([shard.uri for shard in shards], dtype=tf.string))
    if shuffle_files:
        files = files.shuffle(max(1, len(shards)), seed=seed)
    ds = files.interleave(open_shard, cycle_length=cycle_length, num_parallel_calls=num_parallel_calls,
                          deterministic=not shuffle_files or seed is not None)
    ds = ds.apply(tf.data.experimental.assert_cardinality(count))
    if shuffle:
        ds = ds.shuffle(_shuffle_buffer(shuffle, entry, count), seed=seed)  # stored records: small
    ds = ds.map(parse, num_parallel_calls=num_parallel_calls)
    if batch_size is not None:
        if _has_unknown_dims(ds.element_spec):  # variable-length lists: tf.RaggedTensor [batch, None]
            ds = ds.ragged_batch(batch_size, drop_remainder=drop_remainder)
        else:
            ds = ds.batch(batch_size, drop_remainder=drop_remainder)
    return ds.prefetch(tf.data.AUTOTUNE)
