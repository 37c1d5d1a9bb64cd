"""Issue 14's image options (resize, fit, upscale, encoding, jpeg_quality, channels), written from the
design: built through the command line and the DAG, read back with TensorFlow."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.options_support import (
    build,
    dags_test,
    encode,
    expected_size,
    fitted_reference,
    image,
    is_jpeg,
    is_png,
    jpeg_luma_table,
    pillow_luma_table,
    pixels,
    read_back,
    reference,
    run_cli,
    scaled_size,
    shard_digests,
    write,
)

ROOT = Path(__file__).resolve().parents[2]
OPTION_PARAMS = ("resize", "fit", "upscale", "encoding", "jpeg_quality", "channels", "columns", "label_separator")
SECTION = "Images and features"

# Sources for the size rules: landscape, portrait, wide and smaller than every target.
SHAPES = {"a/big.jpg": ((300, 200), "JPEG"), "a/tall.png": ((120, 260), "PNG"),
          "b/wide.png": ((260, 90), "PNG"), "b/small.jpg": ((50, 40), "JPEG")}


@pytest.fixture(scope="module")
def shapes_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("shapes")
    for seed, (name, (size, fmt)) in enumerate(SHAPES.items()):
        write(source / name, encode(image(size, seed), fmt))
    return source


def mean_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


# -- resize: the output size rules ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("resize", "fit", "upscale"),
    [
        ("longest:100", "crop", False),
        ("longest:100", "crop", True),
        ("shortest:100", "crop", False),
        ("shortest:80", "crop", True),
        ("160x100", "crop", False),
        ("160x100", "crop", True),
        ("160x100", "pad", False),
        ("160x100", "pad", True),
        ("160x100", "stretch", False),
        ("160x100", "stretch", True),
    ],
)
def test_resize_gives_the_sizes_of_the_rules(shapes_source: Path, tmp_path: Path, resize: str, fit: str,
                                             upscale: bool) -> None:
    options = ["--resize", resize, "--splits", "train=1"]
    if "x" in resize:
        options += ["--fit", fit]
    if upscale:
        options.append("--upscale")
    if fit in ("pad", "stretch"):
        options += ["--encoding", "png"]  # lossless: the padding reads back as exact zeros
    manifest, records, labels = read_back(build(shapes_source, tmp_path, *options))
    assert set(records) == set(SHAPES)
    assert manifest["image"]["resize"] == resize and manifest["image"]["upscale"] is upscale
    assert manifest["image"]["filter"] == "lanczos"
    for name, (size, fmt) in SHAPES.items():
        record, data = records[name], (shapes_source / name).read_bytes()
        width, height = expected_size(size, resize, fit, upscale)
        got = pixels(record)
        assert got.shape[:2] == (height, width), (name, resize, fit, upscale, got.shape)
        assert (record["image/width"], record["image/height"]) == (width, height)
        assert (int(labels[name]["width"]), int(labels[name]["height"])) == (width, height)
        if not upscale and fit != "pad":  # never enlarged
            assert width <= size[0] and height <= size[1], name
        assert record["image/sha256"].decode() == hashlib.sha256(data).hexdigest()  # always the source file's
        # the pixels: upright, LANCZOS, the crop from the centre, the picture centred in the padding
        want = fitted_reference(data, resize, fit, upscale)
        assert mean_abs_diff(got, want) < 2.5, (name, mean_abs_diff(got, want))
        if fit in ("pad", "stretch"):
            assert record["image/format"] == b"png" and is_png(record["image/encoded"])
            if fit == "pad":
                _assert_padded(got, scaled_size(size, resize, upscale), name)
        elif (width, height) == size:  # nothing to do: encoding "original" stores the file byte for byte
            assert record["image/encoded"] == data, name
        else:  # resized: re-encoded in its stored format
            stored = b"jpeg" if fmt == "JPEG" else b"png"
            assert record["image/format"] == stored, name
            assert (is_jpeg if fmt == "JPEG" else is_png)(record["image/encoded"]), name


def _assert_padded(got: np.ndarray, picture: tuple[int, int], name: str) -> None:
    """The picture is centred (either rounding of the offset) and everything around it is zero (black)."""
    height, width = got.shape[:2]
    pw, ph = picture
    outside = np.ones((height, width), dtype=bool)
    inside = np.ones((height, width), dtype=bool)
    for x0 in {(width - pw) // 2, (width - pw + 1) // 2}:
        for y0 in {(height - ph) // 2, (height - ph + 1) // 2}:
            region = np.zeros((height, width), dtype=bool)
            region[y0:y0 + ph, x0:x0 + pw] = True
            outside &= ~region
            inside &= region
    assert not got[outside].any(), f"{name}: padding is not black"
    assert got[inside].mean() > 20, f"{name}: the picture is not in the centre"


def test_resize_makes_exif_rotated_jpeg_upright(tmp_path: Path) -> None:
    """Orientation 6 (rotate 90 clockwise to view): stored 240x160, upright 160x240, resized to 80x120."""
    from PIL import Image

    source = tmp_path / "src"
    stored = image((240, 160), seed=5)
    data = write(source / "a" / "rot.jpg", encode(stored, "JPEG", orientation=6, quality=95)).read_bytes()
    write(source / "a" / "plain.jpg", encode(image((200, 100), seed=6), "JPEG"))
    _, records, _ = read_back(build(source, tmp_path / "out", "--resize", "longest:120", "--splits", "train=1"))
    got = pixels(records["a/rot.jpg"])
    assert got.shape == (120, 80, 3)
    want = reference(data, (80, 120))
    assert mean_abs_diff(got, want) < 5
    flipped = np.asarray(Image.fromarray(want).transpose(Image.Transpose.ROTATE_180))
    assert mean_abs_diff(got, flipped) > 3 * mean_abs_diff(got, want), "rotated the wrong way"
    assert records["a/rot.jpg"]["image/format"] == b"jpeg"
    assert pixels(records["a/plain.jpg"]).shape == (60, 120, 3)


# -- encodings ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mixed_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """JPEG and PNG sources: RGB, grayscale, RGBA; big and small."""
    source = tmp_path_factory.mktemp("mixed")
    write(source / "a" / "rgb.jpg", encode(image((220, 150), 1), "JPEG"))
    write(source / "a" / "small.jpg", encode(image((60, 45), 2), "JPEG"))
    write(source / "a" / "grey.png", encode(image((130, 170), 3, "L"), "PNG"))
    write(source / "b" / "rgb.png", encode(image((190, 140), 4), "PNG"))
    write(source / "b" / "alpha.png", encode(image((150, 110), 5, "RGBA"), "PNG"))
    write(source / "b" / "grey.jpg", encode(image((160, 120), 6, "L"), "JPEG"))
    return source


def test_jpeg_encoding_uses_the_quality(mixed_source: Path, tmp_path: Path) -> None:
    manifest, records, _ = read_back(build(mixed_source, tmp_path, "--encoding", "jpeg", "--jpeg-quality", "60",
                                           "--splits", "train=1"))
    assert manifest["image"]["encoding"] == "jpeg" and manifest["image"]["jpeg_quality"] == 60
    table = pillow_luma_table(60)
    assert table != pillow_luma_table(95)
    for name, record in records.items():
        data = record["image/encoded"]
        assert record["image/format"] == b"jpeg" and is_jpeg(data), name
        assert jpeg_luma_table(data) == table, f"{name}: not encoded at quality 60"
        got = pixels(record)
        source = (mixed_source / name).read_bytes()
        want_channels = 1 if "grey" in name else 3  # channels 0: as decoded, alpha dropped for JPEG
        assert got.shape[2] == want_channels, name
        want = reference(source, None, "L" if want_channels == 1 else "RGB")
        assert mean_abs_diff(got, want) < 8, name


def test_png_encoding_is_lossless(mixed_source: Path, tmp_path: Path) -> None:
    _, records, _ = read_back(build(mixed_source, tmp_path, "--encoding", "png", "--splits", "train=1"))
    for name, record in records.items():
        assert record["image/format"] == b"png" and is_png(record["image/encoded"]), name
        source = (mixed_source / name).read_bytes()
        got = pixels(record)
        mode = {"grey.png": "L", "grey.jpg": "L", "alpha.png": "RGBA"}.get(name.split("/")[1], "RGB")
        want = reference(source, None, mode)
        assert got.shape == want.shape, name
        if name.endswith(".png"):
            assert np.array_equal(got, want), name
        else:  # the JPEG's pixels as Pillow decodes them, whichever libjpeg decoded them
            assert np.abs(got.astype(int) - want.astype(int)).max() <= 2, name


def test_original_encoding_keeps_files_unless_resized(mixed_source: Path, tmp_path: Path) -> None:
    _, kept, _ = read_back(build(mixed_source, tmp_path / "kept", "--encoding", "original", "--splits", "train=1"))
    for name, record in kept.items():
        data = (mixed_source / name).read_bytes()
        assert record["image/encoded"] == data, name
        assert record["image/sha256"].decode() == hashlib.sha256(data).hexdigest(), name

    manifest, resized, _ = read_back(build(mixed_source, tmp_path / "resized", "--encoding", "original",
                                           "--resize", "longest:100", "--splits", "train=1"))
    assert manifest["image"]["encoding"] == "original"
    quality95 = pillow_luma_table(95)
    for name, record in resized.items():
        data = (mixed_source / name).read_bytes()
        got = pixels(record)
        assert record["image/sha256"].decode() == hashlib.sha256(data).hexdigest(), name
        if name == "a/small.jpg":  # 60x45 is below the target: kept byte for byte
            assert record["image/encoded"] == data and got.shape == (45, 60, 3)
            continue
        assert max(got.shape[:2]) == 100, name
        if name.endswith(".jpg"):
            assert record["image/format"] == b"jpeg" and is_jpeg(record["image/encoded"]), name
            assert jpeg_luma_table(record["image/encoded"]) == quality95, name  # jpeg_quality's default
        else:
            assert record["image/format"] == b"png" and is_png(record["image/encoded"]), name
            mode = {"grey.png": "L", "alpha.png": "RGBA"}.get(name.split("/")[1], "RGB")
            want = reference(data, (got.shape[1], got.shape[0]), mode)
            if mode == "RGBA":  # Pillow resizes RGBA premultiplied; compare loosely
                assert mean_abs_diff(got, want) < 2, name
            else:
                assert np.array_equal(got, want), f"{name}: PNG re-encoding must be lossless LANCZOS"


# -- raw ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def png_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PNG sources only, so the expected pixels are exact: RGB, grey, palette, EXIF-rotated, small."""
    source = tmp_path_factory.mktemp("pngs")
    write(source / "a" / "rgb.png", encode(image((200, 150), 11), "PNG"))
    write(source / "a" / "grey.png", encode(image((90, 120), 12, "L"), "PNG"))
    write(source / "b" / "palette.png", encode(image((180, 60), 13).quantize(64), "PNG"))
    write(source / "b" / "rotated.png", encode(image((160, 100), 14), "PNG", orientation=6))
    write(source / "b" / "small.png", encode(image((40, 30), 15), "PNG"))
    return source


@pytest.mark.parametrize("channels", [0, 1, 3, 4])
def test_raw_pixels_equal_pillow_lanczos(png_source: Path, tmp_path: Path, channels: int) -> None:
    from PIL import Image, ImageOps

    manifest, records, _ = read_back(build(png_source, tmp_path, "--encoding", "raw", "--channels", str(channels),
                                           "--resize", "longest:96", "--splits", "train=1"))
    assert manifest["image"]["encoding"] == "raw" and manifest["image"]["resize"] == "longest:96"
    assert manifest["features"]["image/raw"] == {"dtype": "string", "shape": []}
    assert manifest["features"]["image/shape"] == {"dtype": "int64", "shape": [3]}
    assert "image/encoded" not in manifest["features"]
    want_channels = channels or 3  # raw: 0 means 3
    mode = {1: "L", 3: "RGB", 4: "RGBA"}[want_channels]
    assert set(records) == {p.relative_to(png_source).as_posix() for p in png_source.rglob("*.png")}
    for name, record in records.items():
        data = (png_source / name).read_bytes()
        assert record["image/format"] == b"raw" and record["image/channels"] == want_channels, name
        upright = ImageOps.exif_transpose(Image.open(png_source / name)).size
        size = expected_size(upright, "longest:96")
        got = pixels(record)
        assert record["image/shape"] == [size[1], size[0], want_channels], name
        want = reference(data, size, mode)
        if mode == "L":  # the spec does not order grey conversion and resizing: either is exact
            other = reference(data, size, "RGB")[:, :, :3]
            other = np.asarray(Image.fromarray(other).convert("L"))[:, :, None]
            assert np.array_equal(got, want) or np.array_equal(got, other), \
                f"{name}: max diff {np.abs(got.astype(int) - want.astype(int)).max()}"
        else:
            assert np.array_equal(got, want), f"{name}: max diff {np.abs(got.astype(int) - want.astype(int)).max()}"


def test_16_bit_grey_png_becomes_8_bit_raw(tmp_path: Path) -> None:
    from PIL import Image

    x = np.mgrid[0:40, 0:256][1]
    values = (x * 257 + (x % 7) * 13).astype(np.uint16)  # low byte noise that must not leak into 8 bits
    source = tmp_path / "src"
    (source / "a").mkdir(parents=True)
    Image.fromarray(values).save(source / "a" / "g16.png")
    assert Image.open(source / "a" / "g16.png").mode.startswith("I")
    _, records, _ = read_back(build(source, tmp_path / "out", "--encoding", "raw", "--channels", "1",
                                    "--splits", "train=1"))
    got = pixels(records["a/g16.png"])[:, :, 0].astype(int)
    assert got.shape == (40, 256)
    assert np.abs(got - np.round(values / 257)).max() <= 1


# -- determinism and the manifest's feature spec ----------------------------------------------------------
COMBOS = {
    "resize-jpeg": ["--resize", "longest:80", "--encoding", "jpeg", "--jpeg-quality", "85"],
    "crop-png-grey": ["--resize", "64x64", "--fit", "crop", "--encoding", "png", "--channels", "1"],
    "pad-raw-gzip": ["--resize", "72x48", "--fit", "pad", "--encoding", "raw", "--compression", "gzip"],
    "stretch-original": ["--resize", "90x90", "--fit", "stretch", "--upscale"],
}


@pytest.fixture(scope="module")
def many_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """18 images in three classes, enough for several shards in every split."""
    source = tmp_path_factory.mktemp("many")
    for i in range(18):
        size = (64 + (i * 37) % 220, 64 + (i * 53) % 200)
        cls = "abc"[i % 3]
        if i % 4 == 3:
            write(source / cls / f"img{i:02d}.png", encode(image(size, 100 + i, "RGBA" if i % 8 == 7 else "RGB"),
                                                           "PNG"))
        else:
            write(source / cls / f"img{i:02d}.jpg", encode(image(size, 100 + i), "JPEG"))
    return source


@pytest.mark.parametrize("combo", sorted(COMBOS))
def test_builds_are_deterministic_and_the_feature_spec_parses_every_record(many_source: Path, tmp_path: Path,
                                                                          combo: str) -> None:
    options = [*COMBOS[combo], "--shard-size-mb", "0.005"]
    first = build(many_source, tmp_path / "one", *options, workers=1)
    second = build(many_source, tmp_path / "two", *options, workers=2)
    manifest, records, _ = read_back(first)  # every record of every shard, with the manifest's spec
    manifest2, _, _ = read_back(second)
    assert len(records) == 18
    rgba = {p.relative_to(many_source).as_posix().encode() for p in many_source.rglob("*.png")
            if int(p.stem[3:]) % 8 == 7}
    assert sum(len(s["shards"]) for s in manifest["splits"].values()) > 3, "several shards expected"
    assert shard_digests(manifest) == shard_digests(manifest2)
    for name in ("labels.csv",):
        assert (first / name).read_bytes() == (second / name).read_bytes()
    for record in records.values():
        got = pixels(record)
        if combo == "crop-png-grey":
            assert got.shape[2] == 1 and got.shape[:2] == (64, 64)
        if combo == "pad-raw-gzip":
            assert got.shape == (48, 72, 3)
        if combo == "stretch-original":
            assert got.shape[:2] == (90, 90)
            assert got.shape[2] == (4 if record["image/filename"] in rgba else 3)


# -- bad option values ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--resize", "0x10"], ("resize", "0x10")),
        (["--resize", "banana"], ("resize", "banana")),
        (["--fit", "sideways"], ("fit", "sideways")),
        (["--encoding", "webp"], ("encoding", "webp")),
        (["--channels", "2"], ("channels",)),
        (["--jpeg-quality", "0"], ("quality",)),
        (["--channels", "4", "--encoding", "jpeg"], ("channels", "jpeg")),
        (["--columns", "weight=complex"], ("weight", "complex")),
        (["--resize", "longest:0"], ("resize",)),
        (["--resize", "224x"], ("resize", "224x")),
        (["--jpeg-quality", "101"], ("quality",)),
        (["--label-separator", ""], ("separator",)),
        (["--columns", "{not json"], ("columns",)),
        (["--columns", "label=string"], ("label",)),  # would clash with labels.csv's own column
    ],
)
def test_bad_option_values_are_one_clear_line(shapes_source: Path, tmp_path: Path, args: list[str],
                                              words: tuple[str, ...]) -> None:
    result = run_cli("build", "--source", str(shapes_source), "--destination", str(tmp_path), "--dataset", "d",
                     "--version", "v", "--no-progress", *args)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    assert any(word in errors[0].lower() for word in words), f"{errors[0]!r} names none of {words}"
    assert not (tmp_path / "d" / "v" / "_SUCCESS").exists()


# -- the DAG --------------------------------------------------------------------------------------------
def test_dag_params_have_a_section_of_their_own(airflow_env: dict[str, str]) -> None:
    from tests.airflow.test_dag import INSPECT

    result = subprocess.run([sys.executable, "-c", INSPECT, str(ROOT / "dags")], env=airflow_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    params = json.loads(result.stdout.split("RESULT", 1)[1])["params"]
    assert set(OPTION_PARAMS) <= set(params)
    for name in OPTION_PARAMS:
        assert params[name]["schema"].get("section") == SECTION, name
        assert params[name]["schema"].get("title") and params[name]["description"], name
    others = {params[k]["schema"].get("section") for k in params if k not in OPTION_PARAMS}
    assert SECTION not in others, "the image options share their section with other params"
    defaults = {k: params[k]["value"] for k in OPTION_PARAMS}
    assert defaults == {"resize": "none", "fit": "crop", "upscale": False, "encoding": "original",
                        "jpeg_quality": 95, "channels": 0, "columns": {}, "label_separator": "|"}


def test_dag_builds_resized_jpeg_like_the_cli(airflow_env: dict[str, str], mixed_source: Path,
                                              tmp_path: Path) -> None:
    options = {"resize": "longest:64", "encoding": "jpeg", "jpeg_quality": 80, "channels": 3}
    conf = {"source": str(mixed_source), "destination": str(tmp_path / "dag"), "dataset": "opts",
            "version": "dag1", "salt": "options", "shard_size_mb": 0.002, "splits": {"train": 1.0}, **options}
    run = dags_test(airflow_env, "2027-01-05T02:00:00+00:00", conf)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    version = tmp_path / "dag" / "opts" / "dag1"
    assert (version / "_SUCCESS").exists()
    manifest, records, _ = read_back(version)
    assert len(records) == 6
    assert {k: manifest["image"][k] for k in ("resize", "encoding", "jpeg_quality", "channels")} == options
    table = pillow_luma_table(80)
    for name, record in records.items():
        assert record["image/format"] == b"jpeg" and jpeg_luma_table(record["image/encoded"]) == table, name
        from PIL import Image

        with Image.open(mixed_source / name) as img:
            width, height = expected_size(img.size, "longest:64")
        assert pixels(record).shape == (height, width, 3), name  # channels 3: grey sources too

    cli = build(mixed_source, tmp_path / "cli", "--resize", "longest:64", "--encoding", "jpeg", "--jpeg-quality",
                "80", "--channels", "3", "--shard-size-mb", "0.002", "--splits", "train=1", dataset="opts",
                version="dag1")
    cli_manifest, _, _ = read_back(cli)
    assert shard_digests(cli_manifest) == shard_digests(manifest), "the DAG and the CLI must write the same bytes"


def test_changing_image_options_rebuilds_instead_of_reusing(mixed_source: Path, tmp_path: Path) -> None:
    """A new version with other image options is built (not skipped as unchanged) and reuses neither
    the previous version's shards nor its inspections: every record has the new options."""
    build(mixed_source, tmp_path, "--splits", "train=1", version="v1")
    steps = [("v2", ["--resize", "longest:50", "--encoding", "png"], 3),
             ("v3", ["--resize", "longest:50", "--encoding", "png", "--channels", "1"], 1),
             ("v4", ["--resize", "longest:40", "--encoding", "png", "--channels", "1"], 1)]
    for version, options, channels in steps:
        manifest, records, _ = read_back(build(mixed_source, tmp_path, "--splits", "train=1", *options,
                                               version=version))
        assert manifest["build"]["shards_reused"] == 0, manifest["build"]
        assert manifest["previous_version"] is not None
        longest = int(options[1].split(":")[1])
        for name, record in records.items():
            got = pixels(record)
            assert record["image/format"] == b"png" and max(got.shape[:2]) == longest, (version, name, got.shape)
            if channels == 1:
                assert got.shape[2] == 1, (version, name)
        params = manifest["params"]
        assert params["resize"] == options[1] and params["encoding"] == "png", params
        assert {"fit", "upscale", "jpeg_quality", "channels", "columns", "label_separator"} <= set(params)
