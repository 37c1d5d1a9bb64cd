"""The four readers of docs/readers.md read our output, from a plain ``pip install``.

One module fixture makes a fresh virtual environment (from the base interpreter, not the dev
venv) and installs into it, in one pip call, the project with its ``loader`` extra (not editable),
``tensorflow-datasets``, ``tfrecord`` and a CPU build of ``torch``, constrained to the pins of
requirements-dev.txt. The installed console script builds a dataset from generated images; then
each reader runs in that environment:

* Keras trains an epoch on ``load_split`` (the ``keras`` snippet of docs/readers.md);
* TFDS reads every split through ``builder_from_directory`` (``tfds``);
* PyTorch reads the train split with ``tfrecord`` + ``DataLoader(num_workers=2)`` (``pytorch``);
* plain ``tf.data`` (``tf-data``);
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
import os
import random
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "readers.md"
LOCK = ROOT / "requirements-dev.txt"
DEST_PLACEHOLDER = "/data/image-tfrecords"
DEST_LINE = f'DEST = "{DEST_PLACEHOLDER}"'

# torch: PyPI's Linux wheel of torch is a CUDA build that pulls GBs of nvidia-* wheels. This
# machine's pip (/etc/pip.conf: find-links /opt/wheels, extra local indexes) has a CPU-only build,
# torch 2.13.0+cpu (~190 MB, no nvidia dependencies), which is what this pins. The torch 2.14.1 of
# the local index is the CUDA build: it requires cuda-toolkit, nvidia-cudnn-cu13, triton, ... and
# made the install a 7.7 GB, 4-minute affair. Elsewhere, point pip at a CPU build and set
# IMAGE_TFRECORDS_TEST_TORCH, e.g. PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu with
# IMAGE_TFRECORDS_TEST_TORCH="torch==2.13.0+cpu".
TORCH = os.environ.get("IMAGE_TFRECORDS_TEST_TORCH", "torch==2.13.0+cpu")
INSTALL_TIMEOUT = 15 * 60
RUN_TIMEOUT = 300
CLASSES = ("daisy", "rose", "tulip")
PER_CLASS = 12
SHARD_SIZE_MB = "0.05"  # a few shards per split (train: 3) from ~240 kB of images

# The install runs during the first test's setup: give it its 15 minutes on top of pyproject's limit.
pytestmark = pytest.mark.timeout(INSTALL_TIMEOUT + 600)


# -- the fresh environment ----------------------------------------------------------------------
@dataclass(frozen=True)
class Venv:
    root: Path
    python: str
    work: Path  # the working folder of every command (not the checkout: nothing imports from it)
    env: dict[str, str]

    def run(self, args: list[str], timeout: int = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.work)


def plain_constraints(lock: Path, out: Path) -> Path | None:
    """``name==version`` lines of a lock file (following its ``-r``/``-c`` files), as a constraints file.

    requirements-dev.txt carries ``--hash`` entries; pip then wants hashes for everything it
    installs, which a project directory cannot have ("Can't verify hashes for these file://
    requirements because they point to directories"). Extras go too (pip refuses them in constraints).
    """
    if not lock.exists():
        return None
    pins: list[str] = []

    def read(path: Path) -> None:
        text = re.sub(r"\\\n", " ", path.read_text())  # join continuation lines
        for line in text.splitlines():
            line = re.sub(r"(^|\s)#.*", "", line).strip()
            include = re.match(r"(?:-r|-c|--requirement|--constraint)[\s=]+(\S+)", line)
            if include:
                read(path.parent / include.group(1))
            elif line and not line.startswith("-"):
                requirement = re.split(r"\s--?\w", line)[0].strip()
                requirement = re.sub(r"^([A-Za-z0-9._-]+)\[[^\]]*\]", r"\1", requirement)
                if "==" in requirement:
                    pins.append(requirement)

    read(lock)
    out.write_text("\n".join(dict.fromkeys(pins)) + "\n")
    return out


def snapshot_project(dest: Path) -> Path:
    """The files the wheel is built from, copied: building in the checkout would leave ``build/`` and
    ``include/image_tfrecords.egg-info`` there, and a copy cannot change half way through the build."""
    shutil.copytree(ROOT / "include", dest / "include",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    for path in [ROOT / "pyproject.toml", ROOT / "README.md", *ROOT.glob("LICEN[CS]E*")]:
        shutil.copy2(path, dest / path.name)
    return dest


def _tail(proc: subprocess.CompletedProcess[str], lines: int = 60) -> str:
    noise = "is ignored: it is neither a file nor a directory"  # pip's complaint about local indexes
    out = [line for line in (proc.stdout + proc.stderr).splitlines() if noise not in line]
    return "\n".join(out[-lines:])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Venv]:
    tmp = tmp_path_factory.mktemp("readers")
    base = getattr(sys, "_base_executable", sys.executable)  # sys.executable may be the dev venv's
    root = tmp / "venv"
    subprocess.run([base, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(root),
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    (tmp / "work").mkdir()
    venv = Venv(root, str(root / "bin" / "python"), tmp / "work", env)

    project = snapshot_project(tmp / "project")
    command = [venv.python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet"]
    constraints = plain_constraints(LOCK, tmp / "constraints.txt")
    if constraints:
        command += ["-c", str(constraints)]
    command += [f"{project}[loader]", "tensorflow-datasets", "tfrecord", TORCH]
    start = time.monotonic()
    try:
        proc = venv.run(command, timeout=INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip install took more than {INSTALL_TIMEOUT} s: {' '.join(command)}", pytrace=False)
    took = time.monotonic() - start
    print(f"\n[readers] pip install into a fresh venv took {took:.0f} s: {' '.join(command[3:])}")
    if proc.returncode:  # no network included: CI has the registry, so this is a failure, not a skip
        pytest.fail(f"pip install failed (exit {proc.returncode}) after {took:.0f} s: {' '.join(command)}\n"
                    f"{_tail(proc)}", pytrace=False)

    check = venv.run([venv.python, "-c", textwrap.dedent("""
        import json, sys
        from importlib.metadata import version
        import image_tfrecords, tfrecord, torch
        names = ["image-tfrecords", "tensorflow-cpu", "tensorflow-datasets", "tfrecord", "torch", "pandas", "keras"]
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


def test_docs_have_the_four_readers() -> None:
    assert set(snippets()) == {"keras", "tfds", "pytorch", "tf-data"}


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
