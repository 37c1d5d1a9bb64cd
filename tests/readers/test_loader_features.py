"""The loader on the record layouts of issue 14: raw pixels (``image/raw`` + ``image/shape``), multi-label
(variable-length ``image/class/label``) and labels.csv metadata columns; ``feature_spec`` and the plain
``tf.data`` readers (``make_batched_features_dataset``) on them.

Most versions here are written by hand (a manifest and shards from the project's own writer,
``encode_example`` and ``TFRecordWriter``), so each layout is tested on records whose every value is
known; the end-to-end tests at the bottom build them with the command line.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import subprocess
import sys
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

from image_tfrecords.published.layout import shard_file
from image_tfrecords.readers.loader import (
    ShardChecksumError,
    compression_type,
    feature_spec,
    image_shape,
    info,
    label_names,
    load_split,
    shard_files,
)
from image_tfrecords.records.example import encode_example
from image_tfrecords.records.schema import FEATURES
from image_tfrecords.records.tfrecord import TFRecordWriter

ROOT = Path(__file__).resolve().parents[2]
CLASSES = ["cat", "dog", "fox", "owl"]
CLASSIC = {key: {"dtype": dtype, "shape": []} for key, dtype in FEATURES.items()}  # the 0.x manifests' features


# -- hand-written versions --------------------------------------------------------------------------------------------
def features(*, raw: bool = False, multi_label: bool = False, columns: dict[str, str] | None = None
             ) -> dict[str, dict[str, Any]]:
    """A manifest's ``features``, as the design (issue 14) lays them out."""
    spec = {key: dict(value) for key, value in CLASSIC.items()}
    if raw:
        del spec["image/encoded"]
        spec["image/raw"] = {"dtype": "string", "shape": []}
        spec["image/shape"] = {"dtype": "int64", "shape": [3]}
    if multi_label:
        spec["image/class/label"]["shape"] = spec["image/class/text"]["shape"] = [None]
    for name, kind in (columns or {}).items():
        base = kind.removesuffix("_list")
        spec[name] = {"dtype": base, "shape": [None] if kind.endswith("_list") else []}
    return spec


def write_version(folder: Path, splits: dict[str, list[dict[str, Any]]], spec: dict[str, dict[str, Any]], *,
                  compression: str = "none", per_shard: int = 3, **manifest: Any) -> str:
    """A published version: shards of ``per_shard`` records each, ``manifest.json``, ``_SUCCESS``."""
    folder.mkdir(parents=True)
    entries = {}
    for split, records in splits.items():
        chunks = [records[i:i + per_shard] for i in range(0, len(records), per_shard)]
        shards = []
        for i, chunk in enumerate(chunks):
            name = shard_file(split, i, len(chunks), compression)
            with open(folder / name, "wb") as f, TFRecordWriter(f, compression) as writer:
                for record in chunk:
                    writer.write(encode_example(record))
            data = (folder / name).read_bytes()
            shards.append({"file": name, "num_records": len(chunk), "num_bytes": len(data),
                           "sha256": hashlib.sha256(data).hexdigest()})
        entries[split] = {"num_records": len(records), "shards": shards}
    document = {"dataset": "toy", "version": folder.name, "classes": CLASSES, "compression": compression,
                "num_records": sum(len(r) for r in splits.values()), "num_rejected": 0, "features": spec,
                "splits": entries} | manifest
    (folder / "manifest.json").write_text(json.dumps(document, indent=1))
    (folder / "_SUCCESS").write_bytes(b"")
    return str(folder)


def pixels(seed: int, height: int, width: int, channels: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), dtype=np.uint8)


def classic(i: int, image: np.ndarray, fmt: str, label: int | list[int]) -> dict[str, Any]:
    """The features every layout shares (with one class id, or a list of them)."""
    height, width, channels = image.shape
    many = isinstance(label, list)
    return {"image/format": fmt.encode(), "image/height": height, "image/width": width, "image/channels": channels,
            "image/class/label": array("q", label) if many else label,
            "image/class/text": [CLASSES[c].encode() for c in label] if many else CLASSES[label].encode(),
            "image/filename": f"img-{i:03d}.{fmt}".encode(), "image/sha256": hashlib.sha256(image).hexdigest()}


def raw_record(i: int, image: np.ndarray, label: int | list[int] = 0) -> dict[str, Any]:
    return classic(i, image, "raw", label) | {"image/raw": image.tobytes(), "image/shape": list(image.shape)}


def png_record(i: int, image: np.ndarray, label: int | list[int] = 0) -> dict[str, Any]:
    out = io.BytesIO()
    Image.fromarray(image[..., 0] if image.shape[2] == 1 else image).save(out, "PNG")
    return classic(i, image, "png", label) | {"image/encoded": out.getvalue()}


MIXED = [pixels(i, 5 + i % 4, 3 + i % 5, 1 + i % 4) for i in range(12)]  # 1, 2, 3 and 4 channels, many sizes


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The same twelve images as raw pixels and as PNGs (two versions without image options)."""
    root = tmp_path_factory.mktemp("mixed")
    raw = write_version(root / "raw", {"train": [raw_record(i, a, i % 4) for i, a in enumerate(MIXED)]},
                        features(raw=True))
    png = write_version(root / "png", {"train": [png_record(i, a, i % 4) for i, a in enumerate(MIXED)]}, features())
    return raw, png


# -- feature_spec --------------------------------------------------------------------------------------------------
def test_feature_spec_of_the_classic_layout_is_unchanged() -> None:
    dtypes = {"string": tf.string, "int64": tf.int64}
    assert feature_spec({"features": CLASSIC}) == {k: tf.io.FixedLenFeature([], dtypes[d]) for k, d in FEATURES.items()}


def test_feature_spec_of_the_new_layouts() -> None:
    spec = feature_spec({"features": features(raw=True, multi_label=True, columns={
        "caption": "string", "weight": "float", "count": "int64", "tags": "string_list", "scores": "float_list",
        "ids": "int64_list"})})
    assert "image/encoded" not in spec
    assert spec["image/raw"] == tf.io.FixedLenFeature([], tf.string)
    assert spec["image/shape"] == tf.io.FixedLenFeature([3], tf.int64)
    assert spec["image/class/label"] == tf.io.VarLenFeature(tf.int64)
    assert spec["image/class/text"] == tf.io.VarLenFeature(tf.string)
    assert spec["caption"] == tf.io.FixedLenFeature([], tf.string)
    assert spec["weight"] == tf.io.FixedLenFeature([], tf.float32)
    assert spec["count"] == tf.io.FixedLenFeature([], tf.int64)
    assert spec["tags"] == tf.io.VarLenFeature(tf.string)
    assert spec["scores"] == tf.io.VarLenFeature(tf.float32)
    assert spec["ids"] == tf.io.VarLenFeature(tf.int64)


@pytest.mark.parametrize("shape", [[None, None], [None, 3], [-1], ["3"], [True], 3])
def test_feature_spec_refuses_shapes_it_cannot_parse(shape: Any) -> None:
    with pytest.raises((ValueError, TypeError), match="shape"):
        feature_spec({"features": {"x": {"dtype": "int64", "shape": shape}}})


def test_image_shape_from_the_build_options() -> None:
    def shape(raw: bool = False, **options: Any) -> tuple[int | None, int | None, int | None]:
        return image_shape({"features": features(raw=raw), "image": options})

    assert image_shape({"features": CLASSIC}) == (None, None, None)  # versions before the image options
    assert shape(resize="none", channels=0, encoding="original") == (None, None, None)
    assert shape(raw=True, resize="none", channels=0, encoding="raw") == (None, None, 3)  # raw: 0 means RGB
    assert shape(resize="32x24", fit="pad", upscale=False, channels=1) == (24, 32, 1)
    assert shape(resize="32x24", fit="crop", upscale=False, channels=3) == (None, None, 3)  # small ones stay small
    assert shape(resize="32x24", fit="crop", upscale=True, channels=4) == (24, 32, 4)
    assert shape(resize="32x24", fit="stretch", upscale=True, channels=0) == (24, 32, None)
    assert shape(resize="longest:32", fit="pad", upscale=True, channels=0) == (None, None, None)


# -- raw pixels ------------------------------------------------------------------------------------------------------
def test_raw_images_come_back_as_stored(mixed: tuple[str, str]) -> None:
    raw, _ = mixed
    ds = load_split(raw, "train")
    assert ds.element_spec == (tf.TensorSpec([None, None, None], tf.uint8), tf.TensorSpec([], tf.int64))
    got = [(image.numpy(), int(label)) for image, label in ds]
    assert len(got) == len(MIXED) == int(ds.cardinality())
    for i, (image, label) in enumerate(got):
        assert np.array_equal(image, MIXED[i]) and label == i % 4

    stored = [bytes(b.numpy()) for b, _ in load_split(raw, "train", decode=False)]
    assert stored == [a.tobytes() for a in MIXED]


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_raw_channels_convert_as_decode_image_does(mixed: tuple[str, str], channels: int) -> None:
    """The same conversions as ``tf.io.decode_image(channels=...)`` makes of the PNGs of the same pixels,
    but RGB to grey by ``tf.image.rgb_to_grayscale`` (ITU-R 601 luma, what the build's conversion uses)."""
    raw, png = mixed
    from_raw = [image.numpy() for image, _ in load_split(raw, "train", channels=channels)]
    from_png = [image.numpy() for image, _ in load_split(png, "train", channels=channels)]
    for stored, a, b in zip(MIXED, from_raw, from_png, strict=True):
        assert a.shape == (*stored.shape[:2], channels) == b.shape
        if channels == 1 and stored.shape[2] >= 3:
            assert np.array_equal(a, tf.image.rgb_to_grayscale(stored[..., :3]).numpy())
        else:
            assert np.array_equal(a, b), (stored.shape, channels)


def test_raw_resized_and_batched(mixed: tuple[str, str]) -> None:
    raw, png = mixed
    ds = load_split(raw, "train", image_size=(6, 4), batch_size=5)
    assert ds.element_spec[0] == tf.TensorSpec([None, 6, 4, 3], tf.uint8)  # channels default to 3
    assert int(ds.cardinality()) == 3 == len(list(ds))
    resized = np.concatenate([images.numpy() for images, _ in ds])
    same = np.concatenate([images.numpy() for images, _ in load_split(png, "train", image_size=(6, 4), batch_size=5)])
    assert np.array_equal(resized, same)


def test_raw_as_dict(mixed: tuple[str, str]) -> None:
    raw, _ = mixed
    ds = load_split(raw, "train", as_dict=True)
    assert set(ds.element_spec) == set(features(raw=True)) - {"image/raw"} | {"image"}
    for i, record in enumerate(ds):
        assert np.array_equal(record["image"].numpy(), MIXED[i])
        assert record["image/shape"].numpy().tolist() == list(MIXED[i].shape)
        assert record["image/format"].numpy() == b"raw"
    undecoded = next(iter(load_split(raw, "train", as_dict=True, decode=False)))
    assert set(undecoded) == set(features(raw=True))
    assert bytes(undecoded["image/raw"].numpy()) == MIXED[0].tobytes()


@pytest.fixture(scope="module")
def fixed_raw(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A raw version whose build made every image 8 wide, 6 high, RGB (``--resize 8x6 --fit pad``)."""
    images = [pixels(100 + i, 6, 8, 3) for i in range(7)]
    return write_version(tmp_path_factory.mktemp("fixed") / "v1",
                         {"train": [raw_record(i, a, i % 4) for i, a in enumerate(images)],
                          "test": [raw_record(7, pixels(7, 6, 8, 3), 2)]}, features(raw=True),
                         image={"resize": "8x6", "fit": "pad", "upscale": False, "encoding": "raw",
                                "jpeg_quality": 95, "channels": 0, "filter": "lanczos"})


def test_one_size_batches_without_image_size(fixed_raw: str) -> None:
    ds = load_split(fixed_raw, "train", batch_size=4)
    assert ds.element_spec == (tf.TensorSpec([None, 6, 8, 3], tf.uint8), tf.TensorSpec([None], tf.int64))
    assert [int(images.shape[0]) for images, _ in ds] == [4, 3]
    assert load_split(fixed_raw, "test").element_spec[0] == tf.TensorSpec([6, 8, 3], tf.uint8)
    grey = load_split(fixed_raw, "train", channels=1, batch_size=7)
    assert grey.element_spec[0] == tf.TensorSpec([None, 6, 8, 1], tf.uint8)


def test_a_build_that_breaks_its_promise_fails_loudly(fixed_raw: str, tmp_path: Path) -> None:
    manifest = info(fixed_raw)
    wrong = write_version(tmp_path / "v1", {"train": [raw_record(0, pixels(0, 5, 8, 3))]}, manifest["features"],
                          image=manifest["image"])
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"[Ss]hape"):
        list(load_split(wrong, "train"))


def test_batch_size_needs_image_size_when_sizes_differ(mixed: tuple[str, str]) -> None:
    with pytest.raises(ValueError, match="batch_size needs image_size"):
        load_split(mixed[0], "train", batch_size=2)


# -- multi-label -----------------------------------------------------------------------------------------------------
LABEL_SETS = [[0, 2], [1], [], [0, 1, 2, 3], [3], [2, 3], [0]]


@pytest.fixture(scope="module")
def multi(tmp_path_factory: pytest.TempPathFactory) -> str:
    records = [png_record(i, pixels(i, 4, 4, 3), ids) for i, ids in enumerate(LABEL_SETS)]
    return write_version(tmp_path_factory.mktemp("multi") / "v1", {"train": records}, features(multi_label=True),
                         multi_label=True, label_separator="|")


def test_multi_label_pairs_are_multi_hot(multi: str) -> None:
    ds = load_split(multi, "train")
    assert ds.element_spec[1] == tf.TensorSpec([len(CLASSES)], tf.float32)
    got = [label.numpy() for _, label in ds]
    want = [np.isin(np.arange(len(CLASSES)), ids).astype(np.float32) for ids in LABEL_SETS]
    assert np.array_equal(np.stack(got), np.stack(want))
    batched = load_split(multi, "train", image_size=(4, 4), batch_size=3)
    assert batched.element_spec[1] == tf.TensorSpec([None, len(CLASSES)], tf.float32)
    assert np.array_equal(np.concatenate([labels.numpy() for _, labels in batched]), np.stack(want))
    assert label_names(multi) == CLASSES


def test_multi_label_ids_without_multi_hot(multi: str) -> None:
    ds = load_split(multi, "train", multi_hot=False)
    assert ds.element_spec[1] == tf.TensorSpec([None], tf.int64)
    assert [label.numpy().tolist() for _, label in ds] == LABEL_SETS
    batched = load_split(multi, "train", multi_hot=False, image_size=(4, 4), batch_size=3)
    assert isinstance(batched.element_spec[1], tf.RaggedTensorSpec)
    assert [row for _, labels in batched for row in labels.to_list()] == LABEL_SETS
    assert int(batched.cardinality()) == 3


def test_multi_label_as_dict(multi: str) -> None:
    ds = load_split(multi, "train", as_dict=True)
    assert ds.element_spec["image/class/label"] == tf.TensorSpec([None], tf.int64)
    rows = [(r["image/class/label"].numpy().tolist(), [t.decode() for t in r["image/class/text"].numpy()])
            for r in ds]
    assert rows == [(ids, [CLASSES[i] for i in ids]) for ids in LABEL_SETS]
    with pytest.raises(ValueError, match="multi_hot applies to"):
        load_split(multi, "train", as_dict=True, multi_hot=True)


def test_one_hot_of_a_single_label_version(mixed: tuple[str, str]) -> None:
    ds = load_split(mixed[1], "train", multi_hot=True)
    assert ds.element_spec[1] == tf.TensorSpec([len(CLASSES)], tf.float32)
    assert [int(np.argmax(label)) for _, label in ds] == [i % 4 for i in range(len(MIXED))]
    assert load_split(mixed[1], "train").element_spec[1] == tf.TensorSpec([], tf.int64)  # unchanged by default
    with pytest.raises(ValueError, match="multi_hot must be"):
        load_split(mixed[1], "train", multi_hot="yes")  # type: ignore[arg-type]


def test_keras_fits_multi_hot_labels(multi: str) -> None:
    import keras

    train = load_split(multi, "train", image_size=(4, 4), batch_size=4)
    model = keras.Sequential([keras.Input((4, 4, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(len(CLASSES))])
    model.compile("adam", keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit(train, epochs=1, verbose=0)
    assert np.isfinite(history.history["loss"][0])


# -- metadata columns ----------------------------------------------------------------------------------------------
COLUMNS = {"caption": "string", "weight": "float", "count": "int64", "tags": "string_list",
           "scores": "float_list", "ids": "int64_list"}
METADATA = [
    {"caption": "a cat", "weight": 0.5, "count": 3, "tags": ["indoor", "sofa"], "scores": [0.25], "ids": [7, 8, 9]},
    {"caption": "", "weight": -2.0, "count": 0, "tags": [], "scores": [], "ids": []},
    {"caption": "ünïcode", "weight": 1e-3, "count": -5, "tags": ["x"], "scores": [1.5, 2.5], "ids": [1]},
]


def typed(column: str, value: Any) -> Any:
    """How the writer stores a list: typed, so that an empty one keeps its type."""
    kind = COLUMNS[column]
    return array({"int64_list": "q", "float_list": "f"}[kind], value) if kind in ("int64_list", "float_list") \
        else value


@pytest.fixture(scope="module")
def with_columns(tmp_path_factory: pytest.TempPathFactory) -> str:
    records = [png_record(i, pixels(i, 3, 3, 3), i % 4) | {k: typed(k, v) for k, v in row.items()}
               for i, row in enumerate(METADATA)]
    return write_version(tmp_path_factory.mktemp("columns") / "v1", {"train": records},
                         features(columns=COLUMNS), columns=COLUMNS, label_separator="|")


def as_python(record: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for column in COLUMNS:
        value = record[column].numpy()
        if isinstance(value, np.ndarray):
            value = [v.decode() if isinstance(v, bytes) else v.item() for v in value]
        elif isinstance(value, bytes):
            value = value.decode()
        out[column] = value.item() if isinstance(value, np.generic) else value
    return out


def test_metadata_columns_in_as_dict(with_columns: str) -> None:
    ds = load_split(with_columns, "train", as_dict=True)
    spec = ds.element_spec
    assert spec["caption"] == tf.TensorSpec([], tf.string) and spec["weight"] == tf.TensorSpec([], tf.float32)
    assert spec["count"] == tf.TensorSpec([], tf.int64) and spec["tags"] == tf.TensorSpec([None], tf.string)
    assert spec["scores"] == tf.TensorSpec([None], tf.float32) and spec["ids"] == tf.TensorSpec([None], tf.int64)
    got = [as_python(record) for record in ds]
    want = [row | {"weight": float(np.float32(row["weight"]))} for row in METADATA]
    assert got == want

    batched = load_split(with_columns, "train", as_dict=True, image_size=(2, 2), batch_size=2)
    assert isinstance(batched.element_spec["tags"], tf.RaggedTensorSpec)
    assert batched.element_spec["image"] == tf.TensorSpec([None, 2, 2, 3], tf.uint8)
    assert batched.element_spec["caption"] == tf.TensorSpec([None], tf.string)
    tags = [row for batch in batched for row in batch["tags"].to_list()]
    assert tags == [[t.encode() for t in row["tags"]] for row in METADATA]
    pairs = load_split(with_columns, "train")  # pairs: the columns stay out of the way
    assert pairs.element_spec == (tf.TensorSpec([None, None, None], tf.uint8), tf.TensorSpec([], tf.int64))


def test_a_column_named_image_is_refused_where_it_would_be_lost(tmp_path: Path) -> None:
    spec = features(columns={"image": "string"})
    version = write_version(tmp_path / "v1", {"train": [png_record(0, pixels(0, 2, 2, 3)) | {"image": b"x"}]}, spec)
    with pytest.raises(ValueError, match="named 'image'"):
        load_split(version, "train", as_dict=True)
    assert next(iter(load_split(version, "train", as_dict=True, decode=False)))["image"].numpy() == b"x"
    assert len(list(load_split(version, "train"))) == 1


# -- plain tf.data: feature_spec, shard_files, compression_type -------------------------------------------------------
@pytest.fixture(scope="module")
def everything_gz(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Raw, multi-label, metadata columns, gzip: every new layout in one version."""
    records = [raw_record(i, pixels(i, 2, 3, 3), LABEL_SETS[i % len(LABEL_SETS)])
               | {k: typed(k, v) for k, v in METADATA[i % len(METADATA)].items()} for i in range(10)]
    return write_version(tmp_path_factory.mktemp("gz") / "v1", {"train": records},
                         features(raw=True, multi_label=True, columns=COLUMNS), compression="gzip",
                         multi_label=True, columns=COLUMNS, label_separator="|")


def test_make_batched_features_dataset_reads_every_layout(everything_gz: str) -> None:
    manifest = info(everything_gz)
    assert compression_type(manifest) == "GZIP"
    files = shard_files(everything_gz, "train")
    assert [os.path.basename(f) for f in files] == [s["file"] for s in manifest["splits"]["train"]["shards"]]
    ds = tf.data.experimental.make_batched_features_dataset(
        file_pattern=files, batch_size=4, features=feature_spec(manifest),
        reader=lambda path: tf.data.TFRecordDataset(path, compression_type=compression_type(manifest)),
        num_epochs=1, shuffle=False)
    batches = list(ds)
    assert [int(b["image/raw"].shape[0]) for b in batches] == [4, 4, 2]
    labels = [row for b in batches for row in tf.sparse.to_dense(b["image/class/label"], -1).numpy().tolist()]
    assert Counter(tuple(x for x in row if x >= 0) for row in labels) == \
        Counter(tuple(LABEL_SETS[i % len(LABEL_SETS)]) for i in range(10))
    first = batches[0]
    assert first["image/shape"].shape == (4, 3)
    image = tf.reshape(tf.io.decode_raw(first["image/raw"][0], tf.uint8), first["image/shape"][0])
    assert image.shape == (2, 3, 3) and isinstance(first["tags"], tf.SparseTensor)


def test_everything_at_once_with_load_split(everything_gz: str) -> None:
    ds = load_split(everything_gz, "train", batch_size=5, image_size=(4, 4), shuffle=True, seed=1)
    assert ds.element_spec == (tf.TensorSpec([None, 4, 4, 3], tf.uint8), tf.TensorSpec([None, 4], tf.float32))
    assert sum(int(images.shape[0]) for images, _ in ds) == 10
    records = list(load_split(everything_gz, "train", as_dict=True))
    assert Counter(r["caption"].numpy().decode() for r in records) == \
        Counter(METADATA[i % len(METADATA)]["caption"] for i in range(10))


def test_shard_files_checks_local_shards(everything_gz: str, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "v1"
    shutil.copytree(everything_gz, copy)
    shard = copy / info(str(copy))["splits"]["train"]["shards"][0]["file"]
    data = shard.read_bytes()
    shard.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(ShardChecksumError, match=shard.name):
        shard_files(str(copy), "train")
    assert shard_files(str(copy), "train", verify=False)[0] == str(shard)
    with pytest.raises(ValueError, match="unknown split"):
        shard_files(str(copy), "validation")


def test_shard_files_fetches_s3_shards(s3_env: dict[str, str], bucket: str, everything_gz: str,
                                       tmp_path: Path) -> None:
    from image_tfrecords.storage import Storage

    storage = Storage()
    for path in Path(everything_gz).iterdir():
        storage.upload(str(path), f"s3://{bucket}/toy/v1/{path.name}")
    files = shard_files(f"s3://{bucket}/toy/v1", "train", cache_dir=str(tmp_path / "cache"))
    assert all(f.startswith(str(tmp_path / "cache")) for f in files)
    assert [Path(f).read_bytes() for f in files] == \
        [(Path(everything_gz) / Path(f).name).read_bytes() for f in files]


# -- end to end: built with the command line ---------------------------------------------------------------------------
def build(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", *args, "--workers", "1",
                             "--no-progress"], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.fixture(scope="module")
def labelled_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 images (grey, RGB, RGBA; PNG and JPEG; several sizes) in one folder, and a labels.csv with a
    multi-label ``labels`` column and metadata columns (lists empty in some rows)."""
    root = tmp_path_factory.mktemp("labelled")
    src = root / "src"
    src.mkdir()
    rows = []
    for i in range(24):
        mode, ext = (("L", "png"), ("RGB", "jpg"), ("RGBA", "png"), ("RGB", "png"))[i % 4]
        size = (20 + 7 * i, 15 + 5 * (i % 6))
        color = (10 * i % 256, 200 - 5 * i, 17 * i % 256, 255)[: len(mode)]
        Image.new(mode, size, color if len(mode) > 1 else color[0]).save(src / f"{i:02d}.{ext}")
        names = [CLASSES[c] for c in range(len(CLASSES)) if (i >> c) & 1] or [CLASSES[i % 4]]
        rows.append({"filename": f"{i:02d}.{ext}", "labels": "|".join(names), "caption": f"picture {i}",
                     "weight": str(i / 4), "tags": "|".join(f"t{j}" for j in range(i % 3)), "count": str(i - 5),
                     "ids": "|".join(str(10 * i + j) for j in range(i % 3)), "scores": "|".join(["0.5"] * (i % 2))})
    with open(src / "labels.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return src


@pytest.fixture(scope="module")
def built(labelled_source: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    dest = tmp_path_factory.mktemp("built")
    build("--source", str(labelled_source), "--destination", str(dest), "--dataset", "labelled", "--version", "v1",
          "--encoding", "raw", "--channels", "3", "--resize", "32x32", "--upscale",
          "--columns", "caption=string,weight=float,tags=string_list", "--shard-size-mb", "0.01")
    return str(dest / "labelled")


def source_rows(src: Path) -> dict[str, dict[str, str]]:
    with open(src / "labels.csv", newline="") as f:
        return {row["filename"]: row for row in csv.DictReader(f)}


def test_e2e_built_raw_multi_label_with_columns(built: str, labelled_source: Path) -> None:
    manifest = info(built)
    assert manifest["multi_label"] is True and "image/raw" in manifest["features"]
    assert image_shape(manifest) == (32, 32, 3)
    classes = label_names(built)
    rows = source_rows(labelled_source)
    seen = 0
    for split in manifest["splits"]:
        for record in load_split(built, split, as_dict=True):
            row = rows[record["image/filename"].numpy().decode()]
            assert record["image"].shape == (32, 32, 3) and record["image/shape"].numpy().tolist() == [32, 32, 3]
            names = sorted(row["labels"].split("|"))
            assert [classes[i] for i in record["image/class/label"].numpy()] == names
            assert [t.decode() for t in record["image/class/text"].numpy()] == names
            assert record["caption"].numpy().decode() == row["caption"]
            assert record["weight"].numpy() == np.float32(float(row["weight"]))
            assert [t.decode() for t in record["tags"].numpy()] == ([] if not row["tags"] else row["tags"].split("|"))
            seen += 1
    assert seen == manifest["num_records"] == len(rows)

    train = load_split(built, "train", batch_size=4, shuffle=True, seed=0)  # one size: no image_size needed
    assert train.element_spec == (tf.TensorSpec([None, 32, 32, 3], tf.uint8),
                                  tf.TensorSpec([None, len(classes)], tf.float32))
    n = manifest["splits"]["train"]["num_records"]
    assert int(train.cardinality()) == -(-n // 4) == len(list(train))
    grey = load_split(built, "train", channels=1, image_size=(8, 8), batch_size=n, multi_hot=False)
    images, ids = next(iter(grey))
    assert images.shape == (n, 8, 8, 1) and isinstance(ids, tf.RaggedTensor)


def test_e2e_make_batched_features_dataset(built: str) -> None:
    manifest = info(built)
    count = 0
    for split in manifest["splits"]:
        ds = tf.data.experimental.make_batched_features_dataset(
            file_pattern=shard_files(built, split), batch_size=5, features=feature_spec(manifest),
            reader=lambda path: tf.data.TFRecordDataset(path, compression_type=compression_type(manifest)),
            num_epochs=1, shuffle=False)
        for batch in ds:
            images = tf.reshape(tf.io.decode_raw(batch["image/raw"], tf.uint8), [-1, 32, 32, 3])
            assert images.shape[0] == batch["image/shape"].shape[0]
            assert isinstance(batch["image/class/label"], tf.SparseTensor)
            assert isinstance(batch["tags"], tf.SparseTensor)
            count += int(images.shape[0])
    assert count == manifest["num_records"]


def test_e2e_tfds_reads_the_built_version(built: str) -> None:
    import tensorflow_datasets as tfds

    version = Path(built) / "v1"
    manifest = info(built)
    builder = tfds.builder_from_directory(str(version))
    assert builder.info.supervised_keys == ("image/raw", "image/class/label")
    assert builder.info.features["image/class/label"].feature.names == manifest["classes"]
    for split in manifest["splits"]:
        tfds_records = list(builder.as_dataset(split=split, shuffle_files=False,
                                               read_config=tfds.ReadConfig(interleave_cycle_length=1)))
        ours = list(load_split(built, split, as_dict=True))
        assert len(tfds_records) == len(ours) == manifest["splits"][split]["num_records"]
        for theirs, mine in zip(tfds_records, ours, strict=True):
            assert np.array_equal(theirs["image/raw"].numpy(), mine["image"].numpy())
            assert theirs["image/class/label"].numpy().tolist() == mine["image/class/label"].numpy().tolist()
            assert theirs["tags"].numpy().tolist() == mine["tags"].numpy().tolist()
            assert theirs["weight"].numpy() == mine["weight"].numpy()


TFRECORD_READER = """
import hashlib, json, sys
import numpy as np
from tfrecord.reader import tfrecord_loader

description = {"image/raw": "byte", "image/shape": "int", "image/class/label": "int", "image/filename": "byte"}
out = []
for record in tfrecord_loader(sys.argv[1], None, description):
    image = np.frombuffer(record["image/raw"], np.uint8).reshape(record["image/shape"])
    out.append([bytes(record["image/filename"]).decode(), list(image.shape), hashlib.sha256(image).hexdigest(),
                record["image/class/label"].tolist()])
print(json.dumps(out))
"""


def test_e2e_tfrecord_package_reads_raw_multi_label(built: str) -> None:
    """docs/readers.md's notes for PyTorch's ``tfrecord`` package on a raw multi-label version (in a
    process of its own: its protos clash with TensorFlow's in one process)."""
    shard = Path(built) / "v1" / info(built)["splits"]["train"]["shards"][0]["file"]
    result = subprocess.run([sys.executable, "-c", TFRECORD_READER, str(shard)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads(result.stdout)
    ours = {r["image/filename"].numpy().decode(): r for r in load_split(built, "train", as_dict=True)}
    assert records
    for name, shape, digest, ids in records:
        assert shape == list(ours[name]["image"].shape)
        assert digest == hashlib.sha256(ours[name]["image"].numpy()).hexdigest()
        assert ids == ours[name]["image/class/label"].numpy().tolist()


ALL_COLUMNS = "caption=string,weight=float,tags=string_list,count=int64,ids=int64_list,scores=float_list"


@pytest.fixture(scope="module")
def built_encoded(labelled_source: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The same source, images kept as files (PNG and JPEG, sizes as they are), every column type."""
    dest = tmp_path_factory.mktemp("built_encoded")
    build("--source", str(labelled_source), "--destination", str(dest), "--dataset", "labelled", "--version", "v1",
          "--columns", ALL_COLUMNS)
    return str(dest / "labelled")


def test_e2e_encoded_multi_label_every_column_type(built_encoded: str, labelled_source: Path) -> None:
    import tensorflow_datasets as tfds

    manifest = info(built_encoded)
    assert manifest["multi_label"] is True and "image/encoded" in manifest["features"]
    assert image_shape(manifest) == (None, None, None)
    rows = source_rows(labelled_source)
    builder = tfds.builder_from_directory(str(Path(built_encoded) / "v1"))
    assert builder.info.supervised_keys == ("image/encoded", "image/class/label")
    read = tfds.ReadConfig(interleave_cycle_length=1)
    for split in manifest["splits"]:
        ours = list(load_split(built_encoded, split, as_dict=True, channels=3))
        theirs = list(builder.as_dataset(split=split, shuffle_files=False, read_config=read))
        assert len(ours) == len(theirs) == manifest["splits"][split]["num_records"]
        for mine, other in zip(ours, theirs, strict=True):
            row = rows[mine["image/filename"].numpy().decode()]
            assert mine["count"].numpy() == int(row["count"]) == other["count"].numpy()
            ids = [int(v) for v in row["ids"].split("|")] if row["ids"] else []
            assert mine["ids"].numpy().tolist() == ids == other["ids"].numpy().tolist()
            scores = [float(v) for v in row["scores"].split("|")] if row["scores"] else []
            assert mine["scores"].numpy().tolist() == scores == other["scores"].numpy().tolist()
            assert mine["image/class/label"].numpy().tolist() == other["image/class/label"].numpy().tolist()
            assert mine["image"].shape == other["image/encoded"].shape
            if mine["image/format"].numpy() == b"png":  # JPEG decoders may differ by a little
                assert np.array_equal(mine["image"].numpy(), other["image/encoded"].numpy())
    pairs = load_split(built_encoded, "train", image_size=(16, 16), batch_size=8)
    assert pairs.element_spec[1] == tf.TensorSpec([None, len(CLASSES)], tf.float32)
    assert sum(int(labels.shape[0]) for _, labels in pairs) == manifest["splits"]["train"]["num_records"]


def test_e2e_raw_of_varying_size(labelled_source: Path, tmp_path: Path) -> None:
    """Raw pixels without a fixed size: the loader reads them (batched with image_size), TFDS gets nothing."""
    build("--source", str(labelled_source), "--destination", str(tmp_path), "--dataset", "labelled", "--version",
          "v1", "--encoding", "raw", "--channels", "1", "--resize", "longest:24")
    version = tmp_path / "labelled" / "v1"
    assert not (version / "features.json").exists() and not (version / "dataset_info.json").exists()
    manifest = info(str(version))
    assert image_shape(manifest) == (None, None, 1)
    ds = load_split(str(version), "train")
    assert ds.element_spec[0] == tf.TensorSpec([None, None, 1], tf.uint8)
    sizes = {tuple(image.shape) for image, _ in ds}
    assert len(sizes) > 1 and all(max(h, w) <= 24 and c == 1 for h, w, c in sizes)
    with pytest.raises(ValueError, match="batch_size needs image_size"):
        load_split(str(version), "train", batch_size=4)
    batched = load_split(str(version), "train", image_size=(12, 12), batch_size=4)
    assert batched.element_spec[0] == tf.TensorSpec([None, 12, 12, 1], tf.uint8)  # the build's channels
    assert sum(int(images.shape[0]) for images, _ in batched) == manifest["splits"]["train"]["num_records"]
