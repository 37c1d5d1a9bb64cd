"""The tf.data loader against datasets the CLI published into a real SeaweedFS server (and a local copy)."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
import subprocess
import sys
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.readers.loader import NotPublishedError, info, label_names, load_split
from image_tfrecords.readers.loader import labels as labels_frame
from image_tfrecords.storage import Storage, join
from tests.support import run_cli
from tools.seaweedfs import S3Server

SPLITS = ("train", "validation", "test")


@pytest.fixture(scope="module")
def module_s3_env(s3_server: S3Server) -> Iterator[dict[str, str]]:
    """boto3's standard environment pointed at the test server, for the whole module."""
    env = s3_server.env()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env


@pytest.fixture(scope="module")
def published(s3_server: S3Server, sample_dir: Path, module_s3_env: dict[str, str]) -> str:
    """``s3://BUCKET``: dataset ``shapes`` (v1, then v2 with another salt: latest) and ``shapes-gz`` (g1, gzip)."""
    bucket = f"loader-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(bucket)
    env = {**os.environ, **module_s3_env}
    builds = [("shapes", "v1", "one", "none"), ("shapes", "v2", "two", "none"), ("shapes-gz", "g1", "one", "gzip")]
    for dataset, version, salt, compression in builds:
        result = run_cli("build", "--source", str(sample_dir), "--destination", f"s3://{bucket}", "--dataset", dataset,
                         "--version", version, "--salt", salt, "--compression", compression, "--shard-size-mb", "0.05",
                         "--workers", "2", "--no-progress", env=env)
        assert result.returncode == 0, result.stderr
    return f"s3://{bucket}"


def labels(version_uri: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(Storage().read_text(join(version_uri, "labels.csv")))))


def expected_encoded(version_uri: str, split: str) -> Counter[tuple[str, int]]:
    return Counter((r["encoded_sha256"], int(r["label_id"])) for r in labels(version_uri) if r["split"] == split)


def expected_shapes(version_uri: str, split: str) -> Counter[tuple[tuple[int, int, int], int]]:
    return Counter(((int(r["height"]), int(r["width"]), int(r["channels"])), int(r["label_id"]))
                   for r in labels(version_uri) if r["split"] == split)


def encoded_pairs(ds: Any) -> Counter[tuple[str, int]]:
    return Counter((hashlib.sha256(image.numpy()).hexdigest(), int(label)) for image, label in ds)


def copy_tree(src: str, dst: str, skip: tuple[str, ...] = ()) -> None:
    storage = Storage()
    for item in storage.iter_files(src):
        if item.key not in skip:
            storage.copy(join(src, item.key), join(dst, item.key))


def test_every_split_yields_its_records_encoded(published: str) -> None:
    version = f"{published}/shapes/v1"
    manifest = info(version)
    assert len(manifest["splits"]["train"]["shards"]) > 1, "the interleave needs several shards"
    for split in SPLITS:
        ds = load_split(version, split, decode=False, cycle_length=2)
        pairs = encoded_pairs(ds)
        assert sum(pairs.values()) == manifest["splits"][split]["num_records"]
        assert pairs == expected_encoded(version, split)


def test_decoded_images_have_the_labelled_shapes(published: str) -> None:
    import tensorflow as tf

    version = f"{published}/shapes/v1"
    for split in SPLITS:
        ds = load_split(version, split, shuffle_files=True, seed=7)
        assert ds.element_spec[0].dtype == tf.uint8 and ds.element_spec[1].dtype == tf.int64
        got = Counter((tuple(image.shape), int(label)) for image, label in ds)
        assert got == expected_shapes(version, split)


def test_gzip_dataset(published: str) -> None:
    version = f"{published}/shapes-gz/g1"
    manifest = info(version)
    assert manifest["compression"] == "gzip"
    assert all(s["file"].endswith(".tfrecord.gz") for i in manifest["splits"].values() for s in i["shards"])
    for split in SPLITS:
        assert encoded_pairs(load_split(version, split, decode=False)) == expected_encoded(version, split)
    shapes = Counter((tuple(image.shape), int(label)) for image, label in load_split(version, "train"))
    assert shapes == expected_shapes(version, "train")


def test_dataset_uri_reads_latest_version(published: str) -> None:
    dataset = f"{published}/shapes"
    assert info(dataset)["version"] == "v2"
    v1, v2 = expected_encoded(f"{dataset}/v1", "train"), expected_encoded(f"{dataset}/v2", "train")
    assert v1 != v2, "the two versions must differ for this test to mean something"
    assert encoded_pairs(load_split(dataset, "train", decode=False)) == v2


def test_label_names(published: str) -> None:
    assert label_names(f"{published}/shapes") == ["circles", "squares", "triangles"]
    assert label_names(f"{published}/shapes-gz/g1") == info(f"{published}/shapes-gz/g1")["classes"]


def test_unknown_split_names_the_available_ones(published: str) -> None:
    with pytest.raises(ValueError, match=r"unknown split 'training'.*test, train, validation"):
        load_split(f"{published}/shapes", "training")


def test_unpublished_version_and_missing_dataset_are_refused(published: str) -> None:
    copy_tree(f"{published}/shapes/v1", f"{published}/unpublished/shapes/v1", skip=("_SUCCESS",))
    with pytest.raises(NotPublishedError, match="_SUCCESS"):
        load_split(f"{published}/unpublished/shapes/v1", "train")
    with pytest.raises(NotPublishedError, match=r"latest\.json"):
        load_split(f"{published}/no-such-dataset", "train")


def test_tampered_shard_fails_naming_it(published: str, tmp_path: Path) -> None:
    import tensorflow as tf

    copy = f"{published}/tampered/shapes/v1"
    copy_tree(f"{published}/shapes/v1", copy)
    shards = info(copy)["splits"]
    victim = shards["train"]["shards"][0]["file"]
    other = shards["validation"]["shards"][0]  # valid records: only the checksum can tell
    Storage().write_bytes(join(copy, victim), Storage().read_bytes(join(copy, other["file"])))

    cache = tmp_path / "cache"
    with pytest.raises(tf.errors.OpError, match=re.escape(f"shard {copy}/{victim} does not match its sha256")):
        list(load_split(copy, "train", cache_dir=str(cache), decode=False))
    cached = [p.name for p in cache.rglob("*") if p.is_file()]
    assert victim not in cached and not [n for n in cached if n.startswith(".tmp-")]

    # verify=False reads the swapped bytes unhashed; the record count the manifest asserts still catches them
    unchecked = load_split(copy, "train", cache_dir=str(tmp_path / "unchecked"), decode=False, verify=False)
    train = shards["train"]
    read = train["num_records"] - train["shards"][0]["num_records"] + other["num_records"]
    assert read < train["num_records"], "the swapped shard must hold fewer records for this test to mean something"
    with pytest.raises(tf.errors.OpError,
                       match=f"expected to contain {train['num_records']} elements but contained only {read} "):
        list(unchecked)


def test_cache_is_reused_and_repaired(published: str, tmp_path: Path) -> None:
    version = f"{published}/shapes/v1"
    cache = tmp_path / "cache"
    expected = expected_encoded(version, "train")
    assert encoded_pairs(load_split(version, "train", cache_dir=str(cache), decode=False)) == expected
    files = sorted(cache.rglob("*.tfrecord"))
    assert [p.name for p in files] == [s["file"] for s in info(version)["splits"]["train"]["shards"]]
    stamps = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files}

    assert encoded_pairs(load_split(version, "train", cache_dir=str(cache), decode=False)) == expected
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files} == stamps, "a cached shard was fetched again"

    files[0].write_bytes(b"not the shard")  # a damaged cache copy is fetched again, not trusted
    assert encoded_pairs(load_split(version, "train", cache_dir=str(cache), decode=False)) == expected
    shard = info(version)["splits"]["train"]["shards"][0]
    assert hashlib.sha256(files[0].read_bytes()).hexdigest() == shard["sha256"]
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in files[1:]} == {p: stamps[p] for p in files[1:]}


def test_local_folder_dataset(published: str, tmp_path: Path) -> None:
    import tensorflow as tf

    storage = Storage()
    local = tmp_path / "shapes"
    for item in storage.iter_files(f"{published}/shapes"):
        (local / item.key).parent.mkdir(parents=True, exist_ok=True)
        storage.download(f"{published}/shapes/{item.key}", str(local / item.key))
    for split in SPLITS:
        assert encoded_pairs(load_split(str(local), split, decode=False)) == expected_encoded(str(local / "v2"), split)
    assert label_names(str(local)) == ["circles", "squares", "triangles"]

    shard = info(str(local))["splits"]["test"]["shards"][0]["file"]
    (local / "v2" / shard).write_bytes((local / "v1" / shard).read_bytes())  # other salt: other records
    with pytest.raises(tf.errors.OpError, match=re.escape(f"shard {local}/v2/{shard} does not match")):
        list(load_split(str(local), "test", decode=False))


def test_explicit_storage_without_environment(published: str, s3_server: S3Server,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(key)
    storage = Storage(s3_server.client)
    version = f"{published}/shapes/v1"
    ds = load_split(f"{published}/shapes", "validation", decode=False, storage=storage)
    assert info(f"{published}/shapes", storage)["version"] == "v2"
    assert sum(1 for _ in ds) == info(f"{published}/shapes", storage)["splits"]["validation"]["num_records"]
    assert label_names(version, storage) == ["circles", "squares", "triangles"]


def test_importing_the_loader_does_not_import_tensorflow() -> None:
    code = "import sys, image_tfrecords.readers.loader; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                            capture_output=True, text=True, timeout=60)
    assert result.stdout.strip() == "False", result.stderr


# -- image options, batching, cardinality, Keras: a local dataset of mixed grey, RGB and RGBA images ----------------
FLOWERS = ("daisy", "rose", "tulip")
SIZES = ((17, 23), (64, 48), (100, 31))  # (width, height): odd, and different in every class
KINDS = (("L", "png"), ("RGB", "png"), ("RGBA", "png"), ("L", "jpg"), ("RGB", "jpg"))


def publish_flowers(root: Path) -> str:
    """Build ``root/dest/flowers/v1`` with the CLI from 45 PNGs and JPEGs (grey, RGB, RGBA; three sizes)."""
    from PIL import Image

    src = root / "src"
    for c, name in enumerate(FLOWERS):
        (src / name).mkdir(parents=True)
        for i in range(15):
            mode, ext = KINDS[i % len(KINDS)]
            color = (40 * c + 3 * i, 200 - 5 * i, 17 * i % 256, 128 + i)[: len(mode)]
            image = Image.new(mode, SIZES[(i // 5 + c) % 3], color if len(mode) > 1 else color[0])
            image.save(src / name / f"{i:02d}.{ext}")
    subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(src), "--destination",
                    str(root / "dest"), "--dataset", "flowers", "--version", "v1", "--workers", "1", "--no-progress"],
                   check=True, capture_output=True, timeout=300)
    return str(root / "dest" / "flowers")


@pytest.fixture(scope="module")
def flowers(tmp_path_factory: pytest.TempPathFactory) -> str:
    """``DEST/flowers`` (version v1), a local dataset whose splits mix channel counts and sizes."""
    return publish_flowers(tmp_path_factory.mktemp("flowers"))


def num_records(uri: str, split: str) -> int:
    return int(info(uri)["splits"][split]["num_records"])


def test_the_corpus_mixes_channels_and_sizes(flowers: str) -> None:
    rows = labels(f"{flowers}/v1")
    assert {r["channels"] for r in rows} == {"1", "3", "4"} and {r["format"] for r in rows} == {"png", "jpeg"}
    assert len({(r["width"], r["height"]) for r in rows if r["split"] == "train"}) == 3
    assert {(int(r["height"]), int(r["width"])) for r in rows} == {(h, w) for w, h in SIZES}


def test_batches_of_mixed_images(flowers: str) -> None:
    import tensorflow as tf

    ds = load_split(flowers, "train", image_size=(32, 24), batch_size=8)  # channels default to 3
    assert ds.element_spec[0] == tf.TensorSpec([None, 32, 24, 3], tf.uint8)
    assert ds.element_spec[1] == tf.TensorSpec([None], tf.int64)
    batches = list(ds)
    assert [int(images.shape[0]) for images, _ in batches] == [8] * 5
    got = Counter(int(label) for _, batch in batches for label in batch)
    assert got == Counter(int(r["label_id"]) for r in labels(f"{flowers}/v1") if r["split"] == "train")
    images = tf.concat([images for images, _ in batches], 0)
    assert int(tf.reduce_max(images)) > 0, "images decode to pixels, not zeros"


@pytest.mark.parametrize("channels", [1, 3, 4])
def test_channels_convert_every_image(flowers: str, channels: int) -> None:
    ds = load_split(flowers, "train", channels=channels)
    assert ds.element_spec[0].shape.as_list() == [None, None, channels]
    got = Counter((tuple(image.shape), int(label)) for image, label in ds)
    stored = expected_shapes(f"{flowers}/v1", "train").elements()
    assert got == Counter(((h, w, channels), label) for (h, w, _), label in stored)
    batched = load_split(flowers, "test", image_size=(5, 7), channels=channels, batch_size=2)
    assert batched.element_spec[0].shape.as_list() == [None, 5, 7, channels]
    assert sum(int(images.shape[0]) for images, _ in batched) == num_records(flowers, "test")


def test_cardinality_comes_from_the_manifest(flowers: str) -> None:
    for split in SPLITS:
        n = num_records(flowers, split)
        assert int(load_split(flowers, split).cardinality()) == n
        assert int(load_split(flowers, split, decode=False, shuffle=True, seed=1).cardinality()) == n
        ds = load_split(flowers, split, image_size=(8, 8), batch_size=3)
        assert int(ds.cardinality()) == -(-n // 3) == sum(1 for _ in ds)
        ds = load_split(flowers, split, image_size=(8, 8), batch_size=3, drop_remainder=True)
        assert int(ds.cardinality()) == n // 3 == sum(1 for _ in ds)


def test_shuffle_is_repeatable_with_a_seed(flowers: str) -> None:
    def order(ds: Any) -> list[str]:
        return [hashlib.sha256(image.numpy()).hexdigest() for image, _ in ds]

    plain = order(load_split(flowers, "train", decode=False))
    first = order(load_split(flowers, "train", decode=False, shuffle=True, seed=3))
    assert first == order(load_split(flowers, "train", decode=False, shuffle=True, seed=3))
    assert first != plain and sorted(first) == sorted(plain)
    assert sorted(order(load_split(flowers, "train", decode=False, shuffle=10))) == sorted(plain)


def test_keras_fit_knows_the_steps(flowers: str) -> None:
    import warnings

    import keras

    steps: list[int | None] = []

    class Steps(keras.callbacks.Callback):
        def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
            steps.append(self.params["steps"])

    train = load_split(flowers, "train", image_size=(16, 16), channels=3, batch_size=16, shuffle=True, seed=0)
    val = load_split(flowers, "validation", image_size=(16, 16), channels=3, batch_size=16)
    model = keras.Sequential([keras.Input((16, 16, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(len(FLOWERS))])
    model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(train, validation_data=val, epochs=2, verbose=0, callbacks=[Steps()])
    assert steps == [3], "steps_per_epoch is ceil(40 / 16), from the manifest"
    assert len(history.history["loss"]) == 2 and "val_loss" in history.history
    assert not [w for w in caught if "ran out of data" in str(w.message)]


def test_as_dict_holds_every_feature(flowers: str) -> None:
    import tensorflow as tf

    features = set(info(flowers)["features"])
    ds = load_split(flowers, "validation", as_dict=True, image_size=(10, 12), batch_size=2)
    assert set(ds.element_spec) == features - {"image/encoded"} | {"image"}
    assert ds.element_spec["image"] == tf.TensorSpec([None, 10, 12, 3], tf.uint8)
    assert int(ds.cardinality()) == -(-num_records(flowers, "validation") // 2)
    rows = {r["filename"]: r for r in labels(f"{flowers}/v1") if r["split"] == "validation"}
    for record in load_split(flowers, "validation", as_dict=True):
        row = rows.pop(record["image/filename"].numpy().decode())
        assert record["image"].shape == (int(row["height"]), int(row["width"]), int(row["channels"]))
        assert record["image/class/text"].numpy().decode() == row["label"]
        assert int(record["image/class/label"]) == int(row["label_id"])
    assert not rows
    raw = load_split(flowers, "test", as_dict=True, decode=False)
    assert set(raw.element_spec) == features and raw.element_spec["image/encoded"].dtype == tf.string


def test_labels_data_frame(flowers: str) -> None:
    df = labels_frame(flowers)
    assert len(df) == info(flowers)["num_records"] == 45
    assert df["label_id"].dtype == "int64" and df["channels"].dtype == "int64"
    assert sorted(df["label"].unique()) == list(FLOWERS) == label_names(flowers)
    assert df.groupby("split").size().to_dict() == {s: num_records(flowers, s) for s in SPLITS}


def test_labels_keep_text_columns_text(flowers: str, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "v1"
    shutil.copytree(Path(flowers) / "v1", copy)
    text = (copy / "labels.csv").read_text()
    (copy / "labels.csv").write_text(text.replace("daisy", "007").replace("rose", "NA").replace("tulip", "null"))
    df = labels_frame(str(copy))
    assert sorted(set(df["label"])) == ["007", "NA", "null"] and df["label_id"].tolist() == sorted(df["label_id"])
    assert (df["transform"] == "").all()


def test_s3_batches_know_their_count(published: str) -> None:
    version = f"{published}/shapes-gz/g1"
    n = info(version)["splits"]["train"]["num_records"]
    ds = load_split(version, "train", image_size=(20, 20), channels=1, batch_size=7, shuffle=True)
    assert int(ds.cardinality()) == -(-n // 7) == sum(1 for _ in ds)
    assert {tuple(images.shape[1:]) for images, _ in ds} == {(20, 20, 1)}


def test_version_with_the_old_manifest_name(flowers: str, tmp_path: Path) -> None:
    import shutil

    old = tmp_path / "flowers" / "v1"
    shutil.copytree(Path(flowers) / "v1", old)
    (old / "features.json").unlink()  # a version from before 0.2: no TFDS metadata, our manifest under its old name
    (old / "manifest.json").replace(old / "dataset_info.json")
    assert not (old / "manifest.json").exists()
    assert info(str(old))["splits"] == info(flowers)["splits"]
    ds = load_split(str(old), "train", image_size=(8, 8), batch_size=4)
    assert int(ds.cardinality()) == 10 == sum(1 for _ in ds)
    assert label_names(str(old)) == list(FLOWERS) and len(labels_frame(str(old))) == 45


def test_option_errors(flowers: str) -> None:
    with pytest.raises(ValueError, match=r"batch_size needs image_size.*different sizes"):
        load_split(flowers, "train", batch_size=8)
    with pytest.raises(ValueError, match="need decode=True"):
        load_split(flowers, "train", channels=3, decode=False)
    with pytest.raises(ValueError, match="channels must be 1"):
        load_split(flowers, "train", channels=2)
    with pytest.raises(ValueError, match="image_size must be"):
        load_split(flowers, "train", image_size=224)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="shuffle must be"):
        load_split(flowers, "train", shuffle=-1)
    with pytest.raises(ValueError, match=r"unknown split 'valid'; available splits: test, train, validation"):
        load_split(flowers, "valid", image_size=(8, 8), batch_size=2)


def test_package_exports_the_loader_lazily() -> None:
    code = ("import sys, image_tfrecords as p\n"
            "heavy = ('tensorflow', 'pandas', 'numpy', 'keras', 'boto3', 'PIL')\n"
            "assert not [m for m in heavy if m in sys.modules], sorted(sys.modules)\n"
            "assert p.__version__ == '0.7.4' and set(p.__all__) >= {'load_split', 'label_names', 'labels'}\n"
            "from image_tfrecords import label_names, labels, load_split\n"
            "assert not [m for m in heavy if m in sys.modules], sorted(sys.modules)\n"
            "print(sorted(m for m in sys.modules if m.startswith('image_tfrecords')))\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    modules = {m.removeprefix("image_tfrecords").lstrip(".").split(".")[0] for m in eval(result.stdout)}
    assert modules <= {"", "readers", "published", "storage", "errors", "source", "records", "options"}, modules
