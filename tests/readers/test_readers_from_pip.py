"""The readers of docs/readers.md read our output, from a plain ``pip install``.

One module fixture makes a fresh virtual environment (from the base interpreter, not the dev
venv) and installs into it, in one pip call, the project with its ``loader``, ``torch`` and ``grain``
extras (not editable), ``tensorflow-datasets``, ``tfrecord``, a CPU build of ``torch`` and ``grain``,
constrained to the pins of requirements-dev.txt (``tools/reader_venv.py``, shared with the bench).
The installed console script builds a dataset from generated images; then each reader runs in that
environment:

* Keras trains an epoch on ``load_split`` (the ``keras`` snippet of docs/readers.md);
* TFDS reads every split through ``builder_from_directory`` (``tfds``);
* PyTorch reads the train split with ``tfrecord`` + ``DataLoader(num_workers=2)`` (``pytorch``);
* plain ``tf.data`` (``tf-data``);
* PyTorch through ``RecordSource`` + ``ImageDataset``: ``DataLoader(shuffle=True, num_workers=2)`` sees
  each record once per epoch in a shuffled order, ``DistributedSampler`` splits it between two ranks
  without overlap, and ``collate_bytes`` batches (the stored bytes from the workers' shared buffers) hold
  each record's exact bytes once per epoch (``random-access-torch``);
* Grain reads ``RecordSource`` through ``grain.MapDataset`` with a global shuffle (``random-access-grain``);
* ``load_split`` still reads a version whose manifest has its old name, ``dataset_info.json``.

Substitution rule: the snippets of docs/readers.md run as they are shown, except for the line
``DEST = "/data/image-tfrecords"``, which each holds once and which is rewritten to the test's
destination; the test's checks are appended after the snippet. A failed install (no network
included) fails the tests: it never skips them. ``-s`` shows how long the install took.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import random
import re
import shutil
import subprocess
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

from tools.reader_venv import GRAIN, INSTALL_TIMEOUT, LOCK, TORCH, Venv, make_venv, plain_constraints, snapshot_project
from tools.reader_venv import tail as _tail

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "readers.md"
DEST_PLACEHOLDER = "/data/image-tfrecords"
DEST_LINE = f'DEST = "{DEST_PLACEHOLDER}"'
CLASSES = ("daisy", "rose", "tulip")
PER_CLASS = 12
SHARD_SIZE_MB = "0.05"  # a few shards per split (train: 3) from ~240 kB of images

# The install runs during the first test's setup: give it its 15 minutes on top of pyproject's limit.
pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT + 600)


# -- the fresh environment ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    tmp = tmp_path_factory.mktemp("readers")
    root = tmp / "venv"
    venv = make_venv(root, tmp / "work")
    project = snapshot_project(tmp / "project")
    requirements = [f"{project}[loader,torch,grain]", "tensorflow-datasets", "tfrecord", TORCH, GRAIN]
    start = time.monotonic()
    try:
        proc = venv.pip_install(requirements, plain_constraints(LOCK, tmp / "constraints.txt"))
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip install took more than {INSTALL_TIMEOUT} s: {' '.join(requirements)}", pytrace=False)
    took = time.monotonic() - start
    print(f"\n[readers] pip install into a fresh venv took {took:.0f} s: {' '.join(requirements)}")
    if proc.returncode:  # no network included: CI has the registry, so this is a failure, not a skip
        pytest.fail(f"pip install failed (exit {proc.returncode}) after {took:.0f} s: {' '.join(requirements)}\n"
                    f"{_tail(proc)}", pytrace=False)

    check = venv.run([venv.python, "-c", textwrap.dedent("""
        import json, sys
        from importlib.metadata import version
        import grain, image_tfrecords, tfrecord, torch
        names = ["image-tfrecords", "tensorflow-cpu", "tensorflow-datasets", "tfrecord", "torch", "grain", "pandas",
                 "keras"]
        print(json.dumps({"file": image_tfrecords.__file__, "prefix": sys.prefix, "cuda": torch.version.cuda,
                          **{name: version(name) for name in names}}))
    """)])
    assert check.returncode == 0, _tail(check)
    installed = json.loads(check.stdout.splitlines()[-1])
    print(f"[readers] installed: {installed}")
    assert installed["file"].startswith(str(root)), "image_tfrecords must come from the fresh venv"
    assert installed["cuda"] is None, "torch should be a CPU build"
    yield venv
    shutil.rmtree(root, ignore_errors=True)  # ~2.8 GB; pytest keeps its last three temporary folders


# -- the dataset ------------------------------------------------------------------------------
def make_corpus(root: Path) -> None:
    """36 images in 3 class folders: grey, RGB and RGBA; PNG and JPEG; odd sizes; noise (so they have some bulk)."""
    rng = random.Random(20240607)
    for cls in CLASSES:
        (root / cls).mkdir(parents=True)
        for i in range(PER_CLASS):
            mode = ("L", "RGB", "RGBA")[i % 3]
            fmt = "PNG" if mode == "RGBA" or i % 2 == 0 else "JPEG"
            width, height = rng.randrange(17, 71, 2), rng.randrange(13, 59, 2)
            image = Image.frombytes(mode, (width, height), rng.randbytes(width * height * len(mode)))
            image.save(root / cls / f"{cls}-{i:02d}.{'png' if fmt == 'PNG' else 'jpg'}", fmt)


@dataclass(frozen=True)
class Published:
    dest: Path
    version: Path  # DEST/flowers/v1
    manifest: dict[str, Any]
    labels: list[dict[str, str]]  # labels.csv
    build: subprocess.CompletedProcess[str]

    def rows(self, split: str) -> list[dict[str, str]]:
        return [row for row in self.labels if row["split"] == split]


@pytest.fixture(scope="module")
def published(venv: Venv, tmp_path_factory: pytest.TempPathFactory) -> Published:
    """``flowers`` version ``v1``, built by the installed console script."""
    tmp = tmp_path_factory.mktemp("flowers")
    source, dest = tmp / "src", tmp / "dest"
    make_corpus(source)
    build = venv.run([str(venv.root / "bin" / "image-tfrecords"), "build", "--source", str(source),
                      "--destination", str(dest), "--dataset", "flowers", "--version", "v1", "--workers", "1",
                      "--no-progress", "--shard-size-mb", SHARD_SIZE_MB])
    if build.returncode:
        pytest.fail(f"image-tfrecords build failed (exit {build.returncode}):\n{_tail(build)}", pytrace=False)
    version = dest / "flowers" / "v1"
    manifest = json.loads((version / "manifest.json").read_text())
    with open(version / "labels.csv", newline="") as f:
        labels = list(csv.DictReader(f))
    return Published(dest, version, manifest, labels, build)


@pytest.fixture(scope="module")
def tf_reference(venv: Venv, published: Published) -> dict[str, list[list[Any]]]:
    """TensorFlow's read of every shard: {shard file: [[filename, label], ...]} in file order."""
    code = textwrap.dedent("""
        import json, sys
        import tensorflow as tf
        out = {}
        for path in sys.argv[1:]:
            rows = out[path.rsplit("/", 1)[1]] = []
            for raw in tf.data.TFRecordDataset(path):
                feature = tf.train.Example.FromString(raw.numpy()).features.feature
                rows.append([feature["image/filename"].bytes_list.value[0].decode(),
                             feature["image/class/label"].int64_list.value[0]])
        print(json.dumps(out))
    """)
    shards = [str(published.version / s["file"]) for split in published.manifest["splits"].values()
              for s in split["shards"]]
    proc = venv.run([venv.python, "-c", code, *shards])
    assert proc.returncode == 0, _tail(proc)
    return json.loads(proc.stdout.splitlines()[-1])


# -- the snippets of docs/readers.md ----------------------------------------------------------
def snippets() -> dict[str, str]:
    """``{name: code}`` for every ``<!-- reader: NAME -->`` + ```python block of docs/readers.md."""
    return dict(re.findall(r"^<!-- reader: ([\w-]+) -->\n```python\n(.*?)^```$", DOC.read_text(), re.S | re.M))


def run_snippet(venv: Venv, name: str, dest: Path, checks: str, tmp_path: Path) -> dict[str, Any]:
    """Run the snippet, its DEST line rewritten, with ``checks`` appended; the checks' ``RESULT`` JSON."""
    code = snippets()[name]
    assert code.count(DEST_LINE) == 1 and code.count(DEST_PLACEHOLDER) == 1, f"{name}: DEST must be named once"
    script = tmp_path / f"{name.replace('-', '_')}_snippet.py"
    script.write_text(code.replace(DEST_LINE, f"DEST = {str(dest)!r}") + "\n\n# -- the test's checks --\n"
                      + textwrap.dedent(checks))
    proc = venv.run([venv.python, str(script)])
    assert proc.returncode == 0, f"{name} snippet failed (exit {proc.returncode}):\n{_tail(proc)}"
    results = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert results, f"{name}: no RESULT line\n{_tail(proc)}"
    return json.loads(results[-1].removeprefix("RESULT "))


def test_docs_have_the_six_readers() -> None:
    assert set(snippets()) == {"keras", "tfds", "pytorch", "tf-data", "random-access-torch", "random-access-grain"}


# -- 1. the console script --------------------------------------------------------------------
def test_console_script_builds(venv: Venv, published: Published) -> None:
    assert published.build.returncode == 0
    assert "published flowers version v1" in published.build.stdout.lower()
    for command in ([str(venv.root / "bin" / "image-tfrecords"), "--help"],
                    [venv.python, "-m", "image_tfrecords", "--help"]):
        proc = venv.run(command)
        assert proc.returncode == 0, _tail(proc)
        assert "build" in proc.stdout
    names = {path.name for path in published.version.iterdir()}
    assert {"_SUCCESS", "manifest.json", "labels.csv", "dataset_info.json", "features.json"} <= names
    assert published.manifest["num_records"] == len(published.labels) == len(CLASSES) * PER_CLASS
    assert len(published.manifest["splits"]["train"]["shards"]) >= 2  # MultiTFRecordDataset reads several


def test_index_files_cover_each_shard(published: Published) -> None:
    """Each shard has ``NAME.tfindex`` beside it: ``start length`` lines, contiguous from 0 to its last byte."""
    for split in published.manifest["splits"].values():
        for shard in split["shards"]:
            path = published.version / shard["file"]
            index = path.with_name(shard["file"].removesuffix(".tfrecord") + ".tfindex")
            entries = [tuple(map(int, line.split())) for line in index.read_text().splitlines()]
            assert all(len(entry) == 2 for entry in entries), index
            assert len(entries) == shard["num_records"]
            assert [start for start, _ in entries] == [0, *(s + n for s, n in entries[:-1])], index
            assert entries[-1][0] + entries[-1][1] == path.stat().st_size == shard["num_bytes"]


# -- 2. Keras, through load_split -------------------------------------------------------------
def test_keras_trains_on_load_split(venv: Venv, published: Published, tmp_path: Path) -> None:
    result = run_snippet(venv, "keras", published.dest, """
        import json
        batches = [int(labels.shape[0]) for _, labels in train]
        spec = train.element_spec
        print("RESULT " + json.dumps({
            "cardinality": int(train.cardinality()), "batches": batches, "classes": classes,
            "losses": history.history["loss"], "image": [spec[0].shape.as_list(), spec[0].dtype.name],
            "label": spec[1].dtype.name}))
    """, tmp_path)
    num_train = published.manifest["splits"]["train"]["num_records"]
    assert result["cardinality"] == math.ceil(num_train / 8) == len(result["batches"])
    assert sum(result["batches"]) == num_train
    assert result["classes"] == published.manifest["classes"] == list(CLASSES)
    assert result["image"] == [[None, 32, 32, 3], "uint8"] and result["label"] == "int64"
    assert len(result["losses"]) == 1 and math.isfinite(result["losses"][0])


# -- 3. TFDS, through builder_from_directory --------------------------------------------------
def test_tfds_reads_every_split(venv: Venv, published: Published, tmp_path: Path) -> None:
    result = run_snippet(venv, "tfds", published.dest, """
        import json
        from collections import Counter

        import tensorflow as tf
        with open(f"{DEST}/flowers/v1/manifest.json") as f:
            splits = json.load(f)["splits"]
        out = {"names": classes, "splits": {}}
        for name in splits:
            shapes, labels, bad = [], Counter(), []
            for image, label in builder.as_dataset(split=name, as_supervised=True):
                shapes.append(image.shape.as_list())
                labels[int(label)] += 1
                if image.dtype != tf.uint8 or label.dtype != tf.int64:
                    bad.append([image.dtype.name, label.dtype.name])
            out["splits"][name] = {"num_examples": builder.info.splits[name].num_examples, "shapes": shapes,
                                   "labels": labels, "bad": bad}
        print("RESULT " + json.dumps(out))
    """, tmp_path)
    assert result["names"] == published.manifest["classes"]
    assert set(result["splits"]) == set(published.manifest["splits"])
    for name, split in published.manifest["splits"].items():
        got, rows = result["splits"][name], published.rows(name)
        assert got["num_examples"] == split["num_records"] == len(rows)
        assert len(got["shapes"]) == split["num_records"], name
        assert got["bad"] == []
        assert sorted(got["shapes"]) == sorted([int(r["height"]), int(r["width"]), 3] for r in rows)
        assert got["labels"] == {str(k): v for k, v in Counter(int(r["label_id"]) for r in rows).items()}


# -- 4. PyTorch, through tfrecord + DataLoader ------------------------------------------------
def test_pytorch_reads_each_record_once(venv: Venv, published: Published, tf_reference: dict[str, list[list[Any]]],
                                        tmp_path: Path) -> None:
    result = run_snippet(venv, "pytorch", published.dest, """
        seen, shapes = [], set()
        for batch in loader:  # a second epoch, read the same way
            seen += [[name, label] for name, label in zip(batch["filename"], batch["label"].tolist(), strict=True)]
            shapes.add((str(batch["image"].dtype), *batch["image"].shape[1:]))
        one = [[r["filename"], r["label"]] for r in torch.utils.data.DataLoader(one_shard, batch_size=None,
                                                                                num_workers=2)]
        no_index = TFRecordDataset(f"{VERSION}/{first}.tfrecord", None, description)
        twice = [r["image/filename"].decode()
                 for r in torch.utils.data.DataLoader(no_index, batch_size=None, num_workers=2)]
        record = next(iter(TFRecordDataset(f"{VERSION}/{first}.tfrecord", f"{VERSION}/{first}.tfindex", description)))
        image = Image.open(io.BytesIO(record["image/encoded"]))
        image.load()
        print("RESULT " + json.dumps({"train": seen, "shapes": sorted(shapes), "first": first, "one": one,
                                      "without_index": twice, "decoded": [record["image/filename"].decode(),
                                                                          image.format, image.mode, *image.size]}))
    """, tmp_path)
    train = published.manifest["splits"]["train"]
    expected = Counter((r["filename"], int(r["label_id"])) for r in published.rows("train"))
    assert Counter(map(tuple, result["train"])) == expected  # every train record, exactly once
    assert len(result["train"]) == train["num_records"]
    assert result["shapes"] == [["torch.uint8", 3, 32, 32]]

    shard = result["first"] + ".tfrecord"
    assert shard == train["shards"][0]["file"]
    assert Counter(map(tuple, result["one"])) == Counter(map(tuple, tf_reference[shard]))  # once each
    # What the index files fix: without one, each of the 2 workers reads the whole shard.
    assert Counter(result["without_index"]) == Counter({name: 2 for name, _ in tf_reference[shard]})
    filename, fmt, mode, width, height = result["decoded"]  # a record of the shard (a random one: no workers)
    row = next(r for r in published.labels if r["filename"] == filename)
    assert (fmt, width, height) == (row["format"].upper(), int(row["width"]), int(row["height"]))
    assert mode in ("L", "RGB", "RGBA")


# -- plain tf.data ------------------------------------------------------------------------------
def test_plain_tf_data(venv: Venv, published: Published, tmp_path: Path) -> None:
    result = run_snippet(venv, "tf-data", published.dest, """
        records = [[*image.shape.as_list(), image.dtype.name, int(label)] for image, label in train]
        print("RESULT " + json.dumps(records))
    """, tmp_path)
    rows = published.rows("train")
    assert len(result) == published.manifest["splits"]["train"]["num_records"] == len(rows)
    assert sorted(result) == sorted([int(r["height"]), int(r["width"]), 3, "uint8", int(r["label_id"])] for r in rows)


# -- random access: RecordSource through PyTorch and Grain ----------------------------------------
def file_order(published: Published, split: str) -> list[str]:
    """The split's filenames in shard order, then record order (labels.csv's shard and place in it)."""
    shards = [s["file"] for s in published.manifest["splits"][split]["shards"]]
    rows = sorted(published.rows(split), key=lambda r: (shards.index(r["shard"]), int(r["shard_position"])))
    return [r["filename"] for r in rows]


def test_random_access_torch_reads_each_record_once_per_epoch(venv: Venv, published: Published,
                                                              tmp_path: Path) -> None:
    result = run_snippet(venv, "random-access-torch", published.dest, """
        import json
        epochs = [[name for batch in loader for name in batch["filename"]] for _ in range(2)]
        shapes = sorted({(str(b["image"].dtype), *b["image"].shape[1:], str(b["label"].dtype)) for b in loader})
        ranks = []
        for rank in range(2):
            sampler = torch.utils.data.DistributedSampler(train, num_replicas=2, rank=rank, shuffle=True, seed=0)
            sampler.set_epoch(1)
            ranks.append([name for batch in torch.utils.data.DataLoader(train, batch_size=8, sampler=sampler,
                                                                        num_workers=2)
                          for name in batch["filename"]])
        print("RESULT " + json.dumps({"epochs": epochs, "shapes": shapes, "ranks": ranks, "classes": classes,
                                      "in_order": [source[i]["filename"] for i in range(len(source))],
                                      "source": repr(source)}))
    """, tmp_path)
    order = file_order(published, "train")
    assert result["in_order"] == order  # source[i]: shards in manifest order, records in file order
    for epoch in result["epochs"]:  # DataLoader(shuffle=True, num_workers=2): each record exactly once...
        assert Counter(epoch) == Counter(order) and len(epoch) == len(order)
        assert epoch != order  # ...in a shuffled order
    assert result["epochs"][0] != result["epochs"][1]  # another one each epoch
    assert result["shapes"] == [["torch.uint8", 3, 32, 32, "torch.int64"]]
    assert result["classes"] == list(CLASSES)
    assert result["source"].startswith(f"RecordSource({str(published.version)!r}, 'train', records={len(order)}")
    rank0, rank1 = result["ranks"]  # DistributedSampler: two shares that do not overlap and cover the split
    padding = len(order) % 2  # an odd split: one record repeated so that the ranks have equal shares
    assert len(rank0) == len(rank1) == (len(order) + padding) // 2
    assert set(rank0) | set(rank1) == set(order)
    assert len(set(rank0) & set(rank1)) == padding and len(set(rank0)) == len(rank0)


def test_random_access_torch_packed_bytes_once_per_epoch(venv: Venv, published: Published, tmp_path: Path) -> None:
    """``ImageDataset(decode=False)`` + ``collate_fn=collate_bytes`` with 2 workers and ``shuffle=True``: each
    epoch, every record's stored bytes exactly once (their SHA-256 as labels.csv lists them), through the
    workers' shared buffers, which are gone once the process ends."""
    result = run_snippet(venv, "random-access-torch", published.dest, """
        import glob, hashlib, json, os
        mine = f"/dev/shm/image-tfrecords-batch-{os.getpid()}-*"
        epochs, buffers, kinds = [], 0, set()
        for _ in range(2):
            seen = []
            for batch in packed:
                offsets = batch["image_offsets"].tolist()
                kinds.add((str(batch["image"].dtype), batch["image"].dim(), offsets[0] == 0,
                           offsets[-1] == batch["image"].numel(), str(batch["label"].dtype)))
                for name, label, image in zip(batch["filename"], batch["label"].tolist(), split_bytes(batch),
                                              strict=True):
                    seen.append([name, label, hashlib.sha256(image.numpy()).hexdigest()])
                buffers = max(buffers, len(glob.glob(mine)))  # the workers' buffers, while they run
            epochs.append(seen)
        print("RESULT " + json.dumps({"epochs": epochs, "kinds": sorted(kinds), "buffers": buffers,
                                      "pid": os.getpid(), "keys": sorted(batch)}))
    """, tmp_path)
    rows = published.rows("train")
    expected = Counter((r["filename"], int(r["label_id"]), r["encoded_sha256"] or r["sha256"]) for r in rows)
    assert len(expected) == len(rows)
    order = file_order(published, "train")
    for epoch in result["epochs"]:
        assert Counter(map(tuple, epoch)) == expected and len(epoch) == len(rows)  # every record's bytes, once
        assert [name for name, _, _ in epoch] != order  # shuffled
    assert result["epochs"][0] != result["epochs"][1]  # another order each epoch
    assert result["kinds"] == [["torch.uint8", 1, True, True, "torch.int64"]]
    assert result["keys"] == ["filename", "image", "image_offsets", "label"]
    if Path("/dev/shm").is_dir():
        assert result["buffers"] > 0  # the batches came through the workers' buffers, not the fallback
        assert not list(Path("/dev/shm").glob(f"image-tfrecords-batch-{result['pid']}-*"))  # removed


def test_random_access_grain_global_shuffle(venv: Venv, published: Published, tmp_path: Path) -> None:
    result = run_snippet(venv, "random-access-grain", published.dest, """
        import json
        from grain.sources import RandomAccessDataSource
        batches = list(train.to_iter_dataset())
        names = [str(name) for batch in batches for name in batch["filename"]]
        shapes = sorted({(str(b["image"].dtype), *b["image"].shape[1:], str(b["label"].dtype)) for b in batches})
        again = [str(n) for b in train.to_iter_dataset() for n in b["filename"]]
        print("RESULT " + json.dumps({"names": names, "again": again, "shapes": shapes,
                                      "protocol": isinstance(source, RandomAccessDataSource)}))
    """, tmp_path)
    order = file_order(published, "train")
    assert result["protocol"] is True
    assert Counter(result["names"]) == Counter(order) and len(result["names"]) == len(order)  # each once
    assert result["names"] != order and result["again"] == result["names"]  # shuffled, repeatably (seed)
    # a global shuffle: records of the last shard come out in the first half
    last = {name for name in order[-published.manifest["splits"]["train"]["shards"][-1]["num_records"]:]}
    assert last & set(result["names"][:len(order) // 2])
    assert result["shapes"] == [["uint8", 32, 32, 3, "int64"]]


GRAIN_PROCESSES = """
import json, os, sys

import grain

from image_tfrecords import RecordSource


def opened(record):
    return {"filename": record["filename"], "pid": os.getpid()}


if __name__ == "__main__":  # Grain starts its processes with spawn: the source is pickled to them
    source = RecordSource(sys.argv[1], "train", fields=("filename",))
    source[0]  # open in this process first: the children must open their own
    dataset = grain.MapDataset.source(source).shuffle(seed=1).map(opened).to_iter_dataset()
    out = list(dataset.mp_prefetch(grain.MultiprocessingOptions(num_workers=2)))
    print(json.dumps({"names": [r["filename"] for r in out], "pids": sorted({r["pid"] for r in out}),
                      "me": os.getpid()}))
"""


def test_grain_processes_open_their_own_files(venv: Venv, published: Published, tmp_path: Path) -> None:
    script = tmp_path / "grain_processes.py"
    script.write_text(GRAIN_PROCESSES)
    proc = venv.run([venv.python, str(script), str(published.dest / "flowers")])
    assert proc.returncode == 0, _tail(proc)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Counter(result["names"]) == Counter(file_order(published, "train"))
    assert len(result["pids"]) == 2 and result["me"] not in result["pids"]


def test_the_cards_load_snippets_run(venv: Venv, published: Published, tmp_path: Path) -> None:
    """The card's "Load this version" snippets (Keras and PyTorch), as the card shows them, with the version's URI
    in them: the PyTorch one needs torch, which only this environment has (tests/pipeline/test_card_agrees.py runs
    the Keras one in the dev venv)."""
    card = (published.version / "card.md").read_text()
    codes = re.findall(r"^```python\n(.*?)^```$", card[card.index("## Load this version"):], re.S | re.M)[:2]
    assert len(codes) == 2 and all(f"VERSION = {json.dumps(str(published.version))}\n" in code for code in codes)
    num_train = published.manifest["splits"]["train"]["num_records"]
    for name, code in zip(("keras", "pytorch"), codes, strict=True):
        script = tmp_path / f"card_{name}.py"
        script.write_text(code)
        proc = venv.run([venv.python, str(script)])
        assert proc.returncode == 0, f"the card's {name} snippet failed (exit {proc.returncode}):\n{_tail(proc)}"
        expected = (f"{math.ceil(num_train / 32)} batches per epoch; "
                    + (f"({min(32, num_train)}, 224, 224, 3) int64" if name == "keras" else
                       f"({min(32, num_train)}, 3, 224, 224) torch.int64"))
        assert expected in proc.stdout, f"{name}: {_tail(proc)}"


# -- 5. a version whose manifest has the old name ---------------------------------------------
def test_load_split_reads_the_old_manifest_name(venv: Venv, published: Published) -> None:
    """Before TFDS's metadata took ``dataset_info.json``, our manifest had that name (and no TFDS files)."""
    dataset = published.dest / "flowers2"
    old = dataset / "v0"
    shutil.copytree(published.version, old)
    for name in ("manifest.json", "dataset_info.json", "features.json", "_SUCCESS"):
        (old / name).unlink()
    for path in old.glob("*.labels.txt"):
        path.unlink()
    data = (published.version / "manifest.json").read_bytes()
    (old / "dataset_info.json").write_bytes(data)
    (old / "_SUCCESS").write_text(hashlib.sha256(data).hexdigest() + "\n")
    (dataset / "latest.json").write_text(json.dumps({"version": "v0"}) + "\n")

    proc = venv.run([venv.python, "-c", textwrap.dedent("""
        import json, sys
        from image_tfrecords import label_names, load_split
        ds = load_split(sys.argv[1], "train")
        print(json.dumps({"count": sum(1 for _ in ds), "classes": label_names(sys.argv[1])}))
    """), str(dataset)])
    assert proc.returncode == 0, _tail(proc)
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result == {"count": published.manifest["splits"]["train"]["num_records"],
                      "classes": published.manifest["classes"]}
