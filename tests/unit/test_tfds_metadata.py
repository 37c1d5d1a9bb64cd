"""TFDS metadata (tfds_metadata.py): what TFDS itself would write, and a published version read
back with ``tfds.builder_from_directory``."""

from __future__ import annotations

import copy
import io
import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds
from google.protobuf import json_format
from PIL import Image
from tensorflow_datasets.core import dataset_info, naming
from tensorflow_datasets.core import splits as splits_lib

from image_tfrecords.readers.loader import image_shape
from image_tfrecords.records.schema import FEATURES, feature_spec
from image_tfrecords.records.tfds_metadata import IMAGE_KEY, LABEL_KEY, LABELS_FILE, TEMPLATE, tfds_metadata_files
from tests.readers import test_loader_features as layouts

CLASSES = ("circles", "squares", "triangles")
MODES = ("L", "RGB", "RGBA", "LA", "P")  # grey, RGB, RGBA, grey+alpha, palette


def _manifest(**changes: Any) -> dict[str, Any]:
    """A manifest as the build writes it (the keys tfds_metadata reads, and a few more)."""
    def shards(split: str, sizes: list[int]) -> list[dict[str, Any]]:
        return [{"file": f"{split}-{i:05d}-of-{len(sizes):05d}.tfrecord", "num_records": n,
                 "num_bytes": 1000 * n + i, "sha256": "0" * 64} for i, n in enumerate(sizes)]
    return {"dataset": "flowers", "version": "20260101T000000Z", "num_records": 120, "classes": list(CLASSES),
            "compression": "none", "features": feature_spec(), "num_rejected": 0,
            "splits": {"train": {"num_records": 96, "shards": shards("train", [48, 48])},
                       "validation": {"num_records": 12, "shards": shards("validation", [12])},
                       "test": {"num_records": 12, "shards": shards("test", [5, 4, 3])}}} | changes


def _tfds_features(classes: list[str]) -> tfds.features.FeaturesDict:
    """The feature tree, built with TFDS."""
    def feature(key: str, dtype: str) -> Any:
        if key == IMAGE_KEY:
            return tfds.features.Image(shape=(None, None, 3))
        if key == LABEL_KEY:
            return tfds.features.ClassLabel(names=classes)
        return tfds.features.Text() if dtype == "string" else np.int64
    return tfds.features.FeaturesDict({key: feature(key, dtype) for key, dtype in FEATURES.items()})


def _tfds_writes(manifest: dict[str, Any], folder: Path, description: str, notes: dict[str, str],
                 features: tfds.features.FeaturesDict | None = None, image_key: str = IMAGE_KEY) -> dict[str, bytes]:
    """What ``DatasetInfo.write_to_directory`` writes for the manifest's version (with ``features``, by
    default the classic ones)."""
    template = naming.ShardedFileTemplate(data_dir=folder, template=TEMPLATE, dataset_name=manifest["dataset"],
                                          filetype_suffix="tfrecord")
    split_dict = splits_lib.SplitDict([
        splits_lib.SplitInfo(name=name, shard_lengths=[s["num_records"] for s in split["shards"]],
                             num_bytes=sum(s["num_bytes"] for s in split["shards"]),
                             filename_template=template.replace(split=name))
        for name, split in manifest["splits"].items()])
    identity = dataset_info.DatasetIdentity(name=manifest["dataset"], version="1.0.0", data_dir=str(folder),
                                            module_name="", release_notes=notes)
    info = dataset_info.DatasetInfo(builder=identity, description=description,
                                    features=features or _tfds_features(manifest["classes"]),
                                    supervised_keys=(image_key, LABEL_KEY), split_dict=split_dict)
    info.set_file_format("tfrecord")
    info.write_to_directory(folder)
    return {path.name: path.read_bytes() for path in folder.iterdir()}


def test_files_are_what_tfds_writes(tmp_path: Path) -> None:
    manifest = _manifest()
    ours = tfds_metadata_files(manifest)
    info = json.loads(ours["dataset_info.json"])
    assert info["version"] == "1.0.0" and manifest["version"] in info["description"]
    assert info["releaseNotes"] == {"1.0.0": f"image-tfrecords version {manifest['version']} of dataset flowers"}
    assert ours == _tfds_writes(manifest, tmp_path, info["description"], info["releaseNotes"])
    features = _tfds_features(manifest["classes"])
    assert json.loads(ours["features.json"]) == json_format.MessageToDict(features.to_proto())
    assert set(features.tf_example_spec) == set(FEATURES)  # the serialized keys are our record keys
    assert ours[LABELS_FILE] == b"circles\nsquares\ntriangles\n"


def test_module_does_not_import_tensorflow() -> None:
    code = "import sys, image_tfrecords.records.tfds_metadata; sys.exit('tensorflow' in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("change", [
    {"compression": "gzip"},
    {"splits": {"-": {"num_records": 1, "shards": [{"file": "--00000-of-00001.tfrecord", "num_records": 1,
                                                    "num_bytes": 10, "sha256": "0" * 64}]}}},
    {"splits": {"train": {"num_records": 1, "shards": [{"file": "train-00000-of-00002.tfrecord", "num_records": 1,
                                                        "num_bytes": 10, "sha256": "0" * 64}]}}},
    {"features": {k: v for k, v in feature_spec().items() if k != LABEL_KEY}},
], ids=["gzip", "split-name", "shard-names", "no-label"])
def test_versions_tfds_cannot_read_get_nothing(change: dict[str, Any]) -> None:
    assert tfds_metadata_files(_manifest(**change)) == {}


def test_empty_splits_and_unsafe_class_names() -> None:
    manifest = _manifest(classes=["circles", " squares", "triangles"])
    manifest["splits"]["extra"] = {"num_records": 0, "shards": []}
    files = tfds_metadata_files(manifest)
    assert [s["name"] for s in json.loads(files["dataset_info.json"])["splits"]] == ["train", "validation", "test"]
    assert LABELS_FILE not in files  # TFDS would strip " squares": better class ids as names than wrong names


# -- a real build, read with TFDS ----------------------------------------------------------------
@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """42 noisy images of odd sizes in 3 class folders: grey, RGB, RGBA, grey+alpha and palette; PNG and JPEG."""
    root = tmp_path_factory.mktemp("tfds_source")
    rng = random.Random(7)
    for c, name in enumerate(CLASSES):
        (root / name).mkdir()
        for i in range(14):
            mode = MODES[(i + c) % len(MODES)]
            size = (13 + 7 * i + c, 9 + 5 * i)
            image = Image.frombytes("RGBA", size, rng.randbytes(size[0] * size[1] * 4)).convert(mode)
            jpeg = i % 2 == 1 and mode in ("L", "RGB")
            image.save(root / name / f"{i:02d}.{'jpg' if jpeg else 'png'}")
    return root


def _build(source: Path, destination: Path, compression: str) -> tuple[Path, dict[str, Any]]:
    """Build with the CLI; (the version folder, our manifest), the manifest as ``manifest.json``."""
    subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(source),
                    "--destination", str(destination), "--dataset", "flowers", "--version", "v1",
                    "--workers", "1", "--no-progress", "--shard-size-mb", "0.05", "--compression", compression],
                   check=True, capture_output=True, timeout=600)
    version = destination / "flowers" / "v1"
    path = version / "manifest.json"
    if not path.exists():  # before the rename, our manifest is dataset_info.json: move it aside for TFDS's
        legacy = version / "dataset_info.json"
        assert "classes" in json.loads(legacy.read_text())
        legacy.rename(path)
    return version, json.loads(path.read_text())


def _records(version: Path, split: dict[str, Any]) -> list[dict[str, Any]]:
    """The split's records in shard order, parsed with plain TensorFlow."""
    spec = {k: tf.io.FixedLenFeature([], tf.string if d == "string" else tf.int64) for k, d in FEATURES.items()}
    files = [str(version / shard["file"]) for shard in split["shards"]]
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(raw, spec).items()}
            for raw in tf.data.TFRecordDataset(files)]


def _rgb(record: dict[str, Any]) -> np.ndarray:
    image = Image.open(io.BytesIO(record["image/encoded"]))
    return np.asarray((image.convert("RGBA") if image.mode == "P" else image).convert("RGB"))


def test_tfds_reads_a_published_version(source: Path, tmp_path: Path) -> None:
    version, manifest = _build(source, tmp_path, "none")
    assert len(manifest["splits"]["train"]["shards"]) > 1
    files = tfds_metadata_files(manifest)
    assert set(files) == {"dataset_info.json", "features.json", LABELS_FILE}
    for name, data in files.items():
        (version / name).write_bytes(data)

    builder = tfds.builder_from_directory(str(version))
    assert builder.info.features[LABEL_KEY].names == manifest["classes"]
    assert builder.info.supervised_keys == (IMAGE_KEY, LABEL_KEY)
    assert set(builder.info.splits) == set(manifest["splits"])
    channels = set()
    for name, split in manifest["splits"].items():
        info = builder.info.splits[name]
        assert (info.num_examples, info.num_shards) == (split["num_records"], len(split["shards"]))
        dataset = builder.as_dataset(split=name, as_supervised=True, shuffle_files=False,
                                     read_config=tfds.ReadConfig(interleave_cycle_length=1))
        pairs = [(image.numpy(), label.numpy()) for image, label in dataset]
        records = _records(version, split)
        assert len(pairs) == len(records) == split["num_records"]
        for (image, label), record in zip(pairs, records, strict=True):
            channels.add(record["image/channels"])
            assert label == record["image/class/label"]
            assert image.dtype == np.uint8
            assert image.shape == (record["image/height"], record["image/width"], 3)
            expected = _rgb(record).astype(int)
            tolerance = 0 if record["image/format"] == b"png" else 3  # JPEG decoders differ slightly
            assert np.abs(image.astype(int) - expected).mean() <= tolerance, record["image/filename"]
    assert {1, 3, 4} <= channels

    everything = builder.as_dataset()  # all splits, full feature dicts
    example = next(iter(everything["train"]))
    assert set(example) == set(FEATURES)
    assert example["image/class/text"].numpy().decode() == manifest["classes"][example[LABEL_KEY].numpy()]


def test_gzip_versions(source: Path, tmp_path: Path) -> None:
    """No TFDS metadata for a gzip version, because TFDS really cannot read gzip shards."""
    version, manifest = _build(source, tmp_path, "gzip")
    assert tfds_metadata_files(manifest) == {}

    # Give TFDS the metadata anyway, its template naming the .gz files: reading fails.
    plain = copy.deepcopy(manifest) | {"compression": "none"}
    for split in plain["splits"].values():
        for shard in split["shards"]:
            shard["file"] = shard["file"].removesuffix(".gz")
    files = tfds_metadata_files(plain)
    info = json.loads(files["dataset_info.json"])
    for split in info["splits"]:
        split["filepathTemplate"] += ".gz"
    files["dataset_info.json"] = json.dumps(info).encode()
    for name, data in files.items():
        (version / name).write_bytes(data)
    builder = tfds.builder_from_directory(str(version))
    with pytest.raises(tf.errors.DataLossError):
        list(builder.as_dataset(split="train"))


# -- the layouts of issue 14: raw pixels, multi-label, metadata columns ------------------------------------------------
FIXED_RAW = {"resize": "8x6", "fit": "pad", "upscale": False, "encoding": "raw", "jpeg_quality": 95, "channels": 0,
             "filter": "lanczos"}
FIXED_GREY_PNG = FIXED_RAW | {"encoding": "png", "channels": 1}
LAYOUTS = {  # name -> (features() arguments, manifest additions)
    "multi-label": ({"multi_label": True}, {"multi_label": True}),
    "columns": ({"columns": layouts.COLUMNS}, {"columns": layouts.COLUMNS}),
    "raw": ({"raw": True}, {"image": FIXED_RAW}),
    "png-grey-8x6": ({}, {"image": FIXED_GREY_PNG}),
    "png-grey": ({}, {"image": FIXED_GREY_PNG | {"resize": "none"}}),
    "all": ({"raw": True, "multi_label": True, "columns": layouts.COLUMNS},
            {"image": FIXED_RAW, "multi_label": True, "columns": layouts.COLUMNS}),
}


def _tfds_feature(key: str, entry: dict[str, Any], classes: list[str], image: tuple[int | None, ...]) -> Any:
    """The TFDS feature that reads one of our features (built with TFDS, to compare with ours)."""
    if key == IMAGE_KEY:
        return tfds.features.Image(shape=(*image[:2], image[2] or 3))
    if key == "image/raw":
        return tfds.features.Tensor(shape=image, dtype=np.uint8, encoding="bytes")
    if key == LABEL_KEY:
        one: Any = tfds.features.ClassLabel(names=classes)
    elif entry["dtype"] == "string":
        one = tfds.features.Text()
    else:
        one = tfds.features.Tensor(shape=(), dtype=np.int64 if entry["dtype"] == "int64" else np.float32)
    if entry["shape"] == [None]:
        return tfds.features.Sequence(one)
    if entry["shape"]:
        return tfds.features.Tensor(shape=tuple(entry["shape"]), dtype=np.int64)
    return one


def _layout_manifest(name: str) -> dict[str, Any]:
    args, extra = LAYOUTS[name]
    return _manifest(features=layouts.features(**args), **extra)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_new_layouts_are_what_tfds_writes(name: str, tmp_path: Path) -> None:
    manifest = _layout_manifest(name)
    ours = tfds_metadata_files(manifest)
    info = json.loads(ours["dataset_info.json"])
    raw = "image/raw" in manifest["features"]
    image = image_shape(manifest)
    features = tfds.features.FeaturesDict({
        key: _tfds_feature(key, entry, manifest["classes"], image) for key, entry in manifest["features"].items()})
    image_key = "image/raw" if raw else IMAGE_KEY
    assert ours == _tfds_writes(manifest, tmp_path, info["description"], info["releaseNotes"], features, image_key)
    assert set(features.tf_example_spec) == set(manifest["features"])  # the serialized keys are our record keys
    assert ours[LABELS_FILE] == b"circles\nsquares\ntriangles\n"


@pytest.mark.parametrize("change", [
    {"image": FIXED_RAW | {"fit": "crop"}},  # smaller images stay smaller: sizes vary
    {"image": FIXED_RAW | {"resize": "longest:8", "upscale": True}},
    {"image": FIXED_RAW | {"resize": "none"}},
    {"image": None},
    {"features": layouts.features(raw=True) | {"image/encoded": {"dtype": "string", "shape": []}}},
    {"features": layouts.features(raw=True) | {"image/shape": {"dtype": "int64", "shape": [None]}}},
    {"features": layouts.features() | {"grid": {"dtype": "float", "shape": [2, None]}}},
    {"features": layouts.features() | {"names": {"dtype": "string", "shape": [2]}}},
    {"features": layouts.features() | {"blob": {"dtype": "bytes", "shape": []}}},
    {"features": layouts.features() | {IMAGE_KEY: {"dtype": "string", "shape": [None]}}},
], ids=["raw-crop", "raw-longest", "raw-no-resize", "raw-no-options", "raw-and-encoded", "var-shape", "2d-list",
        "fixed-strings", "unknown-dtype", "image-list"])
def test_layouts_tfds_cannot_read_get_nothing(change: dict[str, Any]) -> None:
    manifest = _layout_manifest("raw") | change
    assert tfds_metadata_files(manifest) == {}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_tfds_reads_new_layouts(name: str, tmp_path: Path) -> None:
    """Hand-written versions of each layout (records of known values) read back with TFDS."""
    args, extra = LAYOUTS[name]
    raw, grey = args.get("raw", False), name.startswith("png-grey")
    many, columns = args.get("multi_label", False), args.get("columns", {})
    records = []
    for i in range(9):
        image = layouts.pixels(i, 6, 8, 1 if grey else 3) if raw or grey else \
            layouts.pixels(i, 3 + i, 5 + i % 3, 1 + i % 4)
        label = layouts.LABEL_SETS[i % len(layouts.LABEL_SETS)] if many else i % 4
        record = layouts.raw_record(i, image, label) if raw else layouts.png_record(i, image, label)
        row = layouts.METADATA[i % len(layouts.METADATA)]
        records.append((image, label, row, record | {k: layouts.typed(k, row[k]) for k in columns}))
    version = Path(layouts.write_version(tmp_path / "v1", {"train": [r for *_, r in records[:6]],
                                                           "test": [r for *_, r in records[6:]]},
                                         layouts.features(**args), per_shard=2, **extra))
    manifest = json.loads((version / "manifest.json").read_text())
    files = tfds_metadata_files(manifest)
    assert set(files) == {"dataset_info.json", "features.json", LABELS_FILE}
    for file, data in files.items():
        (version / file).write_bytes(data)

    builder = tfds.builder_from_directory(str(version))
    label_feature = builder.info.features[LABEL_KEY]
    assert (label_feature.feature if many else label_feature).names == layouts.CLASSES
    image_key = "image/raw" if raw else IMAGE_KEY
    assert builder.info.supervised_keys == (image_key, LABEL_KEY)
    read = tfds.ReadConfig(interleave_cycle_length=1)
    got = [*builder.as_dataset(split="train", shuffle_files=False, read_config=read),
           *builder.as_dataset(split="test", shuffle_files=False, read_config=read)]
    assert len(got) == len(records)
    for example, (image, label, row, _) in zip(got, records, strict=True):
        expected = image if raw or grey else np.repeat(image, 3, 2) if image.shape[2] < 3 else image[..., :3]
        if not raw and image.shape[2] == 2:
            expected = np.repeat(image[..., :1], 3, 2)
        assert np.array_equal(example[image_key].numpy(), expected)
        assert example[LABEL_KEY].numpy().tolist() == label
        if many:
            assert [t.decode() for t in example["image/class/text"].numpy()] == [layouts.CLASSES[c] for c in label]
        if raw:
            assert example["image/shape"].numpy().tolist() == [6, 8, 3]
        for column in columns:
            value = example[column].numpy()
            want = row[column]
            if isinstance(want, list):
                assert [v.decode() if isinstance(v, bytes) else v for v in value.tolist()] == \
                    [np.float32(v) if isinstance(v, float) else v for v in want]
            elif isinstance(want, str):
                assert value.decode() == want
            else:
                assert value == np.float32(want) if isinstance(want, float) else value == want
    pairs = builder.as_dataset(split="test", as_supervised=True, shuffle_files=False, read_config=read)
    assert [label.numpy().tolist() for _, label in pairs] == [label for _, label, _, _ in records[6:]]
    stated = {"png-grey-8x6": [6, 8, 1], "png-grey": [None, None, 1], "raw": [6, 8, 3], "all": [6, 8, 3]}
    assert pairs.element_spec[0].shape.as_list() == stated.get(name, [None, None, 3])
