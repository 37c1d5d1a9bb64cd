"""Bad and odd input, end to end through the CLI: every file gets a defined outcome, nothing crashes.

One source folder holds every kind of trouble from the issue tracker at once; the published
dataset is read back with TensorFlow.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import random
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.storage import Storage
from tests.support import read_csv
from tests.tf_reader import read_version

ROOT = Path(__file__).resolve().parents[2]
TRICKY_NAMES = ["a b.jpg", 'q"uote.jpg', "com,ma.jpg", "ünï cødé.jpg", "-dash.jpg", "new\nline.jpg", "semi;colon.png"]


def _noise(mode: str = "RGB", size: tuple[int, int] = (41, 29), seed: int = 0) -> Any:
    from PIL import Image

    rng = random.Random(seed)
    channels = {"L": 1, "RGB": 3, "RGBA": 4, "CMYK": 4, "I;16": 2}[mode]
    return Image.frombytes(mode, size, rng.randbytes(size[0] * size[1] * channels))


def _save(image: Any, fmt: str, **options: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, fmt, **options)
    return buf.getvalue()


def _png_chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png_declaring(width: int, height: int) -> bytes:
    return (b"\x89PNG\r\n\x1a\n" + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _png_chunk(b"IEND", b""))


def build_zoo(root: Path, outside: Path) -> tuple[dict[str, str], dict[str, str], int]:
    """Write the zoo; return ({file: expected reject reason}, {file: expected transform}, skipped count)."""
    from PIL import Image

    files: dict[str, bytes] = {}
    jpeg = _save(_noise(seed=1), "JPEG", quality=90)
    png = _save(_noise("RGBA", seed=2), "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6
    frames = [_noise(seed=i).convert("P") for i in range(3)]
    files.update({
        "cats/ok.jpg": jpeg,
        "cats/ok-copy.jpg": jpeg,  # duplicate, same label
        "cats/alpha.png": png,
        "dogs/alpha.png": png,  # same bytes, other label: a conflict
        "cats/UPPER.JPG": _save(_noise(seed=3), "JPEG"),
        "cats/long.jpeg": _save(_noise(seed=4), "JPEG"),
        "cats/mixed.Png": _save(_noise(seed=5), "PNG"),
        "cats/really-a-jpeg.png": _save(_noise(seed=6), "JPEG"),
        "cats/gray.jpg": _save(_noise("L", seed=7), "JPEG"),
        "cats/deep16.png": _save(_noise("I;16", seed=8), "PNG"),
        "cats/palette.png": _save(_noise(seed=9).convert("P"), "PNG", transparency=0),
        "cats/rotated.jpg": _save(_noise(seed=10), "JPEG", exif=exif.tobytes()),
        "cats/cmyk.jpg": _save(_noise("CMYK", seed=11), "JPEG"),
        "cats/still.gif": _save(_noise(seed=12).convert("P"), "GIF"),
        "cats/bitmap.bmp": _save(_noise(seed=13), "BMP"),
        "cats/web.webp": _save(_noise(seed=14), "WEBP", lossless=True),
        "cats/scan.tif": _save(_noise(seed=15), "TIFF"),
        "dogs/animated.gif": _save(frames[0], "GIF", save_all=True, append_images=frames[1:]),
        "dogs/empty.jpg": b"",
        "dogs/notes.jpg": b"this is not a picture\n" * 10,
        "dogs/truncated.jpg": _save(_noise(seed=16), "JPEG")[:600],
        "dogs/truncated.png": _save(_noise(seed=17), "PNG")[:-6],
        "dogs/zero-width.png": _png_declaring(0, 10),
        "dogs/bomb.png": _png_declaring(20_000, 20_000),
        "root-image.jpg": _save(_noise(seed=18), "JPEG"),
        ".DS_Store": b"\x00\x00\x00\x01Bud1",
        "dogs/Thumbs.db": b"\xd0\xcf\x11\xe0",
        "dogs/readme.txt": b"hello",
        ".hidden/sneaky.jpg": _save(_noise(seed=19), "JPEG"),
    })
    for i, name in enumerate(TRICKY_NAMES):
        files[f"dogs/{name}"] = _save(_noise(seed=100 + i), "PNG" if name.endswith(".png") else "JPEG")
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "secret.jpg").write_bytes(_save(_noise(seed=20), "JPEG"))
    (root / "cats" / "link-out.jpg").symlink_to(outside / "secret.jpg")
    (root / "linked-class").symlink_to(outside, target_is_directory=True)

    rejects = {
        "cats/ok.jpg": "duplicate",  # ok-copy.jpg sorts first and is kept
        "cats/alpha.png": "label_conflict", "dogs/alpha.png": "label_conflict",
        "dogs/animated.gif": "multi_frame", "dogs/empty.jpg": "empty_file", "dogs/notes.jpg": "not_an_image",
        "dogs/truncated.jpg": "corrupt", "dogs/truncated.png": "corrupt", "dogs/zero-width.png": "corrupt",
        "dogs/bomb.png": "too_many_pixels", "root-image.jpg": "no_label",
    }
    transforms = {"cats/rotated.jpg": "exif_rotate", "cats/cmyk.jpg": "cmyk_to_rgb", "cats/still.gif": "to_png",
                  "cats/bitmap.bmp": "to_png", "cats/web.webp": "to_png", "cats/scan.tif": "to_png"}
    skipped = 6  # .DS_Store, Thumbs.db, readme.txt, .hidden/sneaky.jpg; two symlinks (counted, never followed)
    return rejects, transforms, skipped


def run_build(source: Path, dest: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(source),
                           "--destination", str(dest), "--dataset", "zoo", "--version", "v1", *extra],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_every_kind_of_bad_input_gets_a_defined_outcome(tmp_path: Path) -> None:
    source = tmp_path / "src"
    expected_rejects, transforms, skipped = build_zoo(source, tmp_path / "outside")
    result = run_build(source, tmp_path / "out", "--max-reject-fraction", "1", "--workers", "2")
    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / "zoo" / "v1"

    rejects = {row["filename"]: row["reason"] for row in read_csv(version / "rejects.csv")}
    assert rejects == expected_rejects
    manifest, splits = read_version(Storage(), str(version))
    assert manifest["num_skipped"] == skipped
    assert manifest["skipped_by_kind"] == {"not_an_image_name": 4, "symlink": 2}
    assert manifest["classes"] == ["cats", "dogs"]

    labels = {row["filename"]: row for row in read_csv(version / "labels.csv")}
    on_disk = {p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file() and not p.is_symlink()}
    expected_records = {f for f in on_disk if f not in expected_rejects and not f.startswith(".hidden")
                        and f.rsplit(".", 1)[-1] not in ("txt", "db") and f != ".DS_Store"}
    assert set(labels) == expected_records
    assert not any("secret" in f or f.startswith("linked-class") for f in labels), "symlinks are never followed"
    for name in TRICKY_NAMES:
        assert f"dogs/{name}" in labels, name

    records = [r for split in splits.values() for r in split]
    assert len(records) == len(expected_records) == manifest["num_records"]
    for record in records:
        filename = record["image/filename"].decode()
        row = labels[filename]
        source_bytes = (source / filename).read_bytes()
        assert record["image/sha256"].decode() == hashlib.sha256(source_bytes).hexdigest() == row["sha256"]
        height, width, channels = record["decoded_shape"]  # tf.io.decode_image: one 3-D image each
        assert (height, width, channels) == (record["image/height"], record["image/width"], record["image/channels"])
        assert record["image/format"].decode() in ("jpeg", "png")
        assert row["transform"] == transforms.get(filename, "")
        if row["transform"]:
            assert hashlib.sha256(record["image/encoded"]).hexdigest() == row["encoded_sha256"]
        else:
            assert record["image/encoded"] == source_bytes
    by_name = {r["image/filename"].decode(): r for r in records}
    assert by_name["cats/really-a-jpeg.png"]["image/format"] == b"jpeg"
    assert by_name["cats/rotated.jpg"]["decoded_shape"][:2] == (41, 29)  # upright: was 41 wide, 29 high
    assert by_name["cats/deep16.png"]["image/encoded"] == (source / "cats/deep16.png").read_bytes()


def test_outcomes_are_reproducible(tmp_path: Path) -> None:
    source = tmp_path / "src"
    build_zoo(source, tmp_path / "outside")
    outputs = []
    for dest in ("a", "b"):
        assert run_build(source, tmp_path / dest, "--max-reject-fraction", "1").returncode == 0
        version = tmp_path / dest / "zoo" / "v1"
        here = str(tmp_path / dest).encode()  # the card names where the version was published: the one difference
        outputs.append({p.relative_to(version).as_posix(): p.read_bytes().replace(here, b"DEST") if p.name in (
            "card.md", "card.html") else p.read_bytes() for p in version.rglob("*") if p.is_file()})
    assert "card.html" in outputs[0] and "card/records.png" in outputs[0]  # the card is reproducible too
    assert outputs[0] == outputs[1]
    assert b" at 0x" not in outputs[0]["rejects.csv"]


def test_too_many_rejects_fail_before_publishing(tmp_path: Path) -> None:
    source = tmp_path / "src"
    build_zoo(source, tmp_path / "outside")
    result = run_build(source, tmp_path / "out", "--max-reject-fraction", "0.1")
    assert result.returncode == 1
    assert "more than max_reject_fraction 0.1" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "out" / "zoo" / "v1").exists()
    assert not (tmp_path / "out" / "zoo" / "latest.json").exists()


def test_labels_file_source_with_bad_rows_and_tricky_names(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "imgs").mkdir(parents=True)
    for i, name in enumerate(TRICKY_NAMES):
        (source / "imgs" / name).write_bytes(_save(_noise(seed=200 + i), "JPEG"))
    (tmp_path / "outside.jpg").write_bytes(_save(_noise(seed=300), "JPEG"))
    rows = [{"filename": f"imgs/{n}", "label": "odd, name" if i % 2 else "plain", "note": "x"}
            for i, n in enumerate(TRICKY_NAMES)]
    rows += [{"filename": "../outside.jpg", "label": "plain", "note": ""},
             {"filename": "imgs/missing.jpg", "label": "plain", "note": ""},
             {"filename": "/etc/passwd", "label": "plain", "note": ""}]
    with open(source / "labels.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=["filename", "label", "note"])
        writer.writeheader()
        writer.writerows(rows)
    result = run_build(source, tmp_path / "out", "--max-reject-fraction", "0.5")
    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / "zoo" / "v1"
    assert {r["filename"]: r["reason"] for r in read_csv(version / "rejects.csv")} == {
        "../outside.jpg": "bad_path", "imgs/missing.jpg": "missing_file", "/etc/passwd": "bad_path"}
    labels = {r["filename"]: r["label"] for r in read_csv(version / "labels.csv")}
    assert labels == {f"imgs/{n}": ("odd, name" if i % 2 else "plain") for i, n in enumerate(TRICKY_NAMES)}
    manifest, splits = read_version(Storage(), str(version))
    assert manifest["classes"] == ["odd, name", "plain"]
    assert sorted(r["image/filename"].decode() for s in splits.values() for r in s) == sorted(labels)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_no_valid_images_fails_clearly(where: str, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    source = tmp_path / "src"
    (source / "cats").mkdir(parents=True)
    (source / "cats" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really")
    (source / "cats" / "empty.png").write_bytes(b"")
    env = dict(os.environ)
    dest = str(tmp_path / "out")
    if where == "s3":
        env.update(request.getfixturevalue("s3_env"))
        dest = f"s3://{request.getfixturevalue('bucket')}/out"
    result = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(source),
                             "--destination", dest, "--dataset", "zoo", "--version", "v1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 1
    assert "no valid images to publish: all 2 files were rejected (corrupt: 1, empty_file: 1)" in result.stderr
    storage = Storage()
    if where == "s3":
        assert not storage.exists(f"{dest}/zoo/v1/_SUCCESS") and not storage.exists(f"{dest}/zoo/latest.json")
    else:
        assert not (tmp_path / "out" / "zoo" / "v1").exists()
