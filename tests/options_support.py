"""Helpers for the image and feature option tests: sources made with Pillow, builds through the
command line and the DAG, and a reader that checks every record against the manifest's own
feature spec with TensorFlow (tf.data.TFRecordDataset, tf.io.parse_single_example)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import run_cli

ROOT = Path(__file__).resolve().parent.parent
AIRFLOW = str(Path(sys.executable).with_name("airflow"))


# -- sources ------------------------------------------------------------------------------------------
def image(size: tuple[int, int], seed: int = 0, mode: str = "RGB") -> Any:
    """A photo-like PIL image: smooth gradients, a soft disc and mild noise (no wrap-around edges), so
    lossy re-encoding stays close to the source; the same bytes every run."""
    import numpy as np
    from PIL import Image

    width, height = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float64)
    fx, fy = x / max(1, width - 1), y / max(1, height - 1)
    cx, cy, r = rng.uniform(0.3, 0.7), rng.uniform(0.3, 0.7), rng.uniform(0.15, 0.3)
    disc = np.clip(1.5 - np.hypot(fx - cx, fy - cy) / r, 0, 1)  # soft-edged
    rgb = np.stack([30 + 180 * fx, 30 + 180 * fy, 60 + 120 * (1 - fx) * fy], axis=-1)
    rgb = rgb * (1 - 0.6 * disc[..., None]) + rng.normal(0, 3, (height, width, 3))
    img = Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8), "RGB")
    if mode == "RGBA":  # a real alpha channel: opaque on the left, 40% transparent on the right
        img.putalpha(Image.fromarray((255 - 100 * fx).astype(np.uint8), "L"))
    return img.convert(mode)


def encode(img: Any, fmt: str, orientation: int | None = None, **options: Any) -> bytes:
    from PIL import Image

    if orientation is not None:
        exif = Image.Exif()
        exif[0x0112] = orientation
        options["exif"] = exif
    if fmt == "JPEG":
        options.setdefault("quality", 90)
    buf = io.BytesIO()
    img.save(buf, fmt, **options)
    return buf.getvalue()


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def write_labels_csv(source: Path, header: list[str], rows: list[list[str]]) -> None:
    with open(source / "labels.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)


# -- the size rules of the spec, computed independently ------------------------------------------------
def expected_size(size: tuple[int, int], resize: str, fit: str = "crop", upscale: bool = False) -> tuple[int, int]:
    """(width, height) of the stored image for a source of ``size``, as the spec's rules give it."""
    w, h = size
    if resize == "none":
        return w, h
    if resize.startswith(("longest:", "shortest:")):
        kind, n = resize.split(":")
        scale = int(n) / (max(w, h) if kind == "longest" else min(w, h))
        if not upscale:
            scale = min(scale, 1.0)
        return max(1, round(w * scale)), max(1, round(h * scale))
    tw, th = (int(x) for x in resize.split("x"))
    if fit == "pad":
        return tw, th
    if fit == "stretch":
        return (tw, th) if upscale else (min(tw, w), min(th, h))
    scale = max(tw / w, th / h)  # crop: scale to cover, then centre crop
    if not upscale:
        scale = min(scale, 1.0)
    return min(tw, max(1, round(w * scale))), min(th, max(1, round(h * scale)))


def scaled_size(size: tuple[int, int], resize: str, upscale: bool = False) -> tuple[int, int]:
    """The size of the resized picture inside a pad canvas (scale to fit)."""
    w, h = size
    tw, th = (int(x) for x in resize.split("x"))
    scale = min(tw / w, th / h)
    if not upscale:
        scale = min(scale, 1.0)
    return max(1, round(w * scale)), max(1, round(h * scale))


def reference(data: bytes, size: tuple[int, int] | None, mode: str = "RGB", convert_first: bool = True) -> Any:
    """The source decoded with Pillow, made upright, converted to ``mode`` and resized (LANCZOS) to
    ``size`` (None: not resized), as a uint8 HWC array."""
    import numpy as np
    from PIL import Image, ImageOps

    img = ImageOps.exif_transpose(Image.open(io.BytesIO(data)))
    if convert_first:
        img = img.convert(mode)
    if size is not None and img.size != size:
        img = img.resize(size, Image.Resampling.LANCZOS)
    if not convert_first:
        img = img.convert(mode)
    out = np.asarray(img, dtype=np.uint8)
    return out[:, :, None] if out.ndim == 2 else out


def fitted_reference(data: bytes, resize: str, fit: str = "crop", upscale: bool = False) -> Any:
    """The source made upright and resized by the spec's rules with Pillow (LANCZOS), RGB: crop scales
    to cover and takes the centre, pad scales to fit and centres the picture on black."""
    import numpy as np
    from PIL import Image, ImageOps

    img = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    if resize == "none" or not resize[0].isdigit() or fit == "stretch":
        size = expected_size(img.size, resize, fit, upscale)
        return np.asarray(img.resize(size, Image.Resampling.LANCZOS) if size != img.size else img)
    tw, th = (int(x) for x in resize.split("x"))
    if fit == "pad":
        pw, ph = scaled_size(img.size, resize, upscale)
        canvas = Image.new("RGB", (tw, th))
        canvas.paste(img.resize((pw, ph), Image.Resampling.LANCZOS), ((tw - pw) // 2, (th - ph) // 2))
        return np.asarray(canvas)
    w, h = img.size
    scale = max(tw / w, th / h)
    if not upscale:
        scale = min(scale, 1.0)
    cw, ch = max(1, round(w * scale)), max(1, round(h * scale))
    if (cw, ch) != img.size:
        img = img.resize((cw, ch), Image.Resampling.LANCZOS)
    ow, oh = min(tw, cw), min(th, ch)
    x0, y0 = (cw - ow) // 2, (ch - oh) // 2
    return np.asarray(img.crop((x0, y0, x0 + ow, y0 + oh)))


# -- building -----------------------------------------------------------------------------------------
def build(source: Path, destination: Path, *options: str, dataset: str = "d", version: str = "v",
          workers: int = 1) -> Path:
    """Build through the CLI (must succeed); the published version's folder."""
    result = run_cli("build", "--source", str(source), "--destination", str(destination), "--dataset", dataset,
                     "--version", version, "--salt", "options", "--workers", str(workers), "--no-progress",
                     *options)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return destination / dataset / version


def dags_test(airflow_env: dict[str, str], logical_date: str, conf: dict) -> subprocess.CompletedProcess[str]:
    """`airflow dags test image_tfrecords` with local folders (no S3 involved)."""
    env = dict(airflow_env)
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        env.pop(key, None)
    return subprocess.run([AIRFLOW, "dags", "test", "image_tfrecords", logical_date, "-c", json.dumps(conf)],
                          env=env, capture_output=True, text=True, timeout=900)


def shard_digests(manifest: dict) -> dict[str, list[tuple[str, str]]]:
    return {s: [(x["file"], x["sha256"]) for x in i["shards"]] for s, i in manifest["splits"].items()}


# -- reading back -------------------------------------------------------------------------------------
def tf_spec(features: dict[str, dict]) -> dict[str, Any]:
    """The manifest's "features" as a tf.io.parse_single_example spec: shape [] -> FixedLenFeature([]),
    [null] -> VarLenFeature, [n] -> FixedLenFeature([n])."""
    import tensorflow as tf

    dtypes = {"string": tf.string, "int64": tf.int64, "float": tf.float32}
    spec: dict[str, Any] = {}
    for key, feature in features.items():
        dtype, shape = dtypes[feature["dtype"]], feature["shape"]
        if None in shape:
            assert shape == [None], (key, shape)
            spec[key] = tf.io.VarLenFeature(dtype)
        else:
            spec[key] = tf.io.FixedLenFeature(shape, dtype)
    return spec


def _value(tensor: Any) -> Any:
    import tensorflow as tf

    if isinstance(tensor, tf.SparseTensor):
        return tf.sparse.to_dense(tensor).numpy().tolist()
    value = tensor.numpy()
    if isinstance(value, bytes):
        return value
    return value.tolist() if value.ndim else value.item()


def pixels(record: dict[str, Any]) -> Any:
    """The stored image as a uint8 HWC array: image/raw reshaped to image/shape, or image/encoded decoded."""
    import numpy as np
    import tensorflow as tf

    if record["image/format"] == b"raw":
        return np.frombuffer(record["image/raw"], dtype=np.uint8).reshape(record["image/shape"])
    return tf.io.decode_image(record["image/encoded"], expand_animations=False).numpy()


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def rejects(version: Path) -> dict[str, tuple[str, str]]:
    return {r["filename"]: (r["reason"], r["detail"]) for r in read_csv(version / "rejects.csv")[1]}


def read_back(version: Path) -> tuple[dict, dict[str, dict[str, Any]], dict[str, dict[str, str]]]:
    """(manifest, {filename: record}, {filename: labels.csv row}) of a published local version.

    Every record of every shard is parsed with the spec the manifest declares (and must hold exactly
    its keys); each record's height/width/channels are those of its decoded image, and labels.csv agrees.
    """
    import tensorflow as tf

    manifest = json.loads((version / "manifest.json").read_text())
    spec = tf_spec(manifest["features"])
    compression = "GZIP" if manifest["compression"] == "gzip" else ""
    records: dict[str, dict[str, Any]] = {}
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            path = version / shard["file"]
            data = path.read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"] and len(data) == shard["num_bytes"]
            count = 0
            for raw in tf.data.TFRecordDataset(str(path), compression_type=compression):
                keys = set(tf.train.Example.FromString(raw.numpy()).features.feature.keys())
                assert keys == set(spec), f"{shard['file']}: record keys {sorted(keys)} != manifest {sorted(spec)}"
                example = tf.io.parse_single_example(raw, spec)
                record = {k: _value(v) for k, v in example.items()}
                record["split"], record["shard"], record["place"] = split, shard["file"], count
                filename = record["image/filename"].decode()
                assert filename not in records, filename
                records[filename] = record
                count += 1
            assert count == shard["num_records"], shard
    assert len(records) == manifest["num_records"]

    header, rows = read_csv(version / "labels.csv")
    labels = {r["filename"]: r for r in rows}
    assert set(labels) == set(records)
    assert header[-2:] == ["shard", "shard_position"]
    assert all(int(labels[name]["shard_position"]) == record["place"] for name, record in records.items())
    for filename, record in records.items():
        shape = pixels(record).shape
        assert shape == (record["image/height"], record["image/width"], record["image/channels"]), filename
        if record["image/format"] == b"raw":
            assert "image/encoded" not in record
            assert record["image/shape"] == list(shape)
            assert len(record["image/raw"]) == shape[0] * shape[1] * shape[2]
        row = labels[filename]
        assert (int(row["width"]), int(row["height"]), int(row["channels"])) == \
            (shape[1], shape[0], shape[2]), (filename, row)
        assert row["format"] == record["image/format"].decode(), (filename, row)
        assert row["split"] == record["split"] and row["shard"] == record["shard"], (filename, row)
    return manifest, records, labels


def jpeg_luma_table(data: bytes) -> list[int]:
    from PIL import Image

    return list(Image.open(io.BytesIO(data)).quantization[0])


def pillow_luma_table(quality: int) -> list[int]:
    return jpeg_luma_table(encode(image((16, 16)), "JPEG", quality=quality))


def is_jpeg(data: bytes) -> bool:
    return data[:3] == b"\xff\xd8\xff"


def is_png(data: bytes) -> bool:
    return data[:8] == b"\x89PNG\r\n\x1a\n"

