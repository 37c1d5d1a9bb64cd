"""Image-quality signals and flags (``images.quality``) on images made to have them, and the option."""

from __future__ import annotations

import io
import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFilter

from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import ConfigError
from image_tfrecords.images.probe import inspect_image
from image_tfrecords.images.quality import FLAGS, Quality, measure, signals
from image_tfrecords.images.thumbnail import thumbnail


def noise(width: int = 128, height: int = 96, seed: int = 0, grey: bool = False) -> Image.Image:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 1 if grey else 3), dtype=np.uint8)
    image = Image.fromarray(pixels[:, :, 0] if grey else pixels)
    return image.convert("RGB") if grey else image


def flags_of(image: Image.Image) -> tuple[str, ...]:
    return measure(image, image.width, image.height, len(image.getbands())).flags


@pytest.mark.parametrize(("image", "expected"), [
    (noise(), ()),
    (Image.new("RGB", (128, 96), (5, 5, 5)), ("dark", "flat", "grey_as_colour")),
    (Image.new("RGB", (128, 96), (250, 250, 250)), ("bright", "flat", "grey_as_colour")),
    (Image.new("RGB", (128, 96), (200, 40, 40)), ("flat",)),
    (noise(grey=True), ("grey_as_colour",)),
    (Image.fromarray(np.uint8(128 + 100 * np.sin(np.arange(128) / 10)[None, :, None] * [[[1, 0.5, -1]]]
                              * np.ones((96, 1, 1)))), ("blurry",)),  # contrast, colour, no fine detail
    (noise(20, 20), ("tiny",)),
    (noise(400, 100), ("odd_aspect",)),
])
def test_flags(image: Image.Image, expected: tuple[str, ...]) -> None:
    assert flags_of(image) == expected


def test_a_grey_image_stored_as_grey_is_not_grey_as_colour() -> None:
    image = noise(grey=True).convert("L")
    assert measure(image, 128, 96, 1).flags == ()
    assert measure(image, 128, 96, 1).colourfulness == 0


def test_signals_are_scale_free_enough_to_take_from_a_thumbnail() -> None:
    """A photo-like image and its 1/4 thumbnail give about the same brightness, contrast and colour."""
    big = noise(512, 384, seed=3).filter(ImageFilter.GaussianBlur(4)).point(lambda v: max(0, min(255, v * 6 - 640)))
    a, b = measure(big, 512, 384, 3), measure(big.reduce(4), 512, 384, 3)
    assert abs(a.brightness - b.brightness) < 2 and abs(a.colourfulness - b.colourfulness) < 10
    assert a.flags == b.flags == ()


@pytest.mark.parametrize("mode", ["RGB", "L", "RGBA", "P"])
def test_thumbnail_numbers_are_the_direct_ones(mode: str) -> None:
    """The exact sums give what the definitions say: grey within rounding of Pillow's mode L, the colourfulness
    the mean of max - min over R, G, B, the moments those of the grey levels and of their Laplacian."""
    image = noise(90, 70, seed=7).convert(mode)
    thumb = thumbnail(image)
    rgb = np.asarray(image.convert("RGB"), dtype=np.float64)
    grey = np.asarray(image.convert("L"), dtype=np.float64) if mode == "L" else rgb @ [0.299, 0.587, 0.114]
    assert (thumb.width, thumb.height) == (90, 70)
    assert np.abs(grey - np.asarray(image.convert("RGB").convert("L"), dtype=np.float64)).max() < 0.51
    expected = 0.0 if mode == "L" else float((rgb.max(axis=2) - rgb.min(axis=2)).mean())
    laplacian = 4 * grey[1:-1, 1:-1] - grey[:-2, 1:-1] - grey[2:, 1:-1] - grey[1:-1, :-2] - grey[1:-1, 2:]
    quality = signals(thumb, 90, 70, 3)
    assert quality.colourfulness == pytest.approx(expected, abs=1e-9)
    assert quality.brightness == pytest.approx(float(grey.mean()), abs=1e-9)
    assert quality.contrast == pytest.approx(float(grey.std()), abs=1e-9)
    assert quality.sharpness == pytest.approx(float(laplacian.var()) / (float(grey.var()) + 1), rel=1e-9)


def test_sixteen_bit_grey_is_scaled_not_clipped() -> None:
    """A 16-bit grey PNG (Pillow's I;16, kept as it is) is measured on 0-255 like any other: a ramp over the
    whole range is mid-grey with contrast, not 'bright' and 'flat' from clipping at 255."""
    ramp = np.tile(np.linspace(0, 65535, 200).astype(np.uint16), (100, 1))
    buffer = io.BytesIO()
    Image.fromarray(ramp).save(buffer, "PNG")
    image = Image.open(io.BytesIO(buffer.getvalue()))
    assert image.mode.startswith("I")
    quality = measure(image, 200, 100, 1)
    assert quality.brightness == pytest.approx(127.5, abs=1) and quality.contrast > 60
    assert quality.flags == ("blurry",)  # a smooth ramp has no fine detail: that much is right
    assert measure(image.resize((400, 200)), 400, 200, 1).brightness == pytest.approx(127.5, abs=1)  # resized


def test_a_flat_bright_image_has_no_variance_from_rounding() -> None:
    """E[x^2] - E[x]^2 in float32 would give a grey level of 250 a contrast of several levels."""
    quality = measure(Image.new("RGB", (256, 256), (250, 250, 250)), 256, 256, 3)
    assert quality.contrast is not None and quality.contrast < 1e-3
    assert quality.sharpness == 0


def test_inspection_records_the_columns() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (3, 3, 3)).save(buffer, "JPEG", quality=90)
    facts = inspect_image(buffer.getvalue())
    assert facts.quality == "dark|flat|grey_as_colour"
    assert float(facts.brightness) < 10 and float(facts.contrast) < 1
    assert Quality().columns() == {"brightness": "", "contrast": "", "sharpness": "", "colourfulness": "",
                                   "quality": ""}
    assert Quality(1.0, 2.5, 0.1234, 0.0, ("flat",)).columns() == {
        "brightness": "1", "contrast": "2.5", "sharpness": "0.123", "colourfulness": "0", "quality": "flat"}


def test_quality_reject_takes_known_flags_in_normal_form() -> None:
    def config(value: object) -> BuildConfig:
        return BuildConfig("/data/in", "/data/out", "d", "v1", quality_reject=value)  # type: ignore[arg-type]

    assert config(" blurry, dark ,dark").quality_reject == "dark,blurry"
    assert config("").quality_reject == ""
    assert set(config(",".join(FLAGS)).quality_reject.split(",")) == set(FLAGS)
    with pytest.raises(ConfigError, match="unknown flag fuzzy"):
        config("dark,fuzzy")
    assert "quality_reject" not in config("").fingerprint_params


def test_a_png_is_measured_only_when_asked() -> None:
    """A PNG is checked without decoding its pixels; they are decoded for the hash and signals on request."""
    buffer = io.BytesIO()
    noise(64, 48).save(buffer, "PNG")
    quiet, measured = inspect_image(buffer.getvalue(), png_pixels=False), inspect_image(buffer.getvalue())
    assert (quiet.phash, quiet.brightness, quiet.quality) == ("", "", "")
    assert len(measured.phash) == 16 and measured.brightness and measured.quality == ""
    assert BuildConfig("/in", "/out", "d", "v1", near_duplicate_bits=0).png_pixels is False
    assert BuildConfig("/in", "/out", "d", "v1").png_pixels is True  # the near-duplicate search is on by default
    assert BuildConfig("/in", "/out", "d", "v1", near_duplicate_bits=0, quality_reject="tiny").png_pixels is True


BLAS_SCRIPT = """
import hashlib, io
import numpy as np
from PIL import Image
from image_tfrecords.images.probe import inspect_image
rng = np.random.default_rng(1)
facts = []
for _ in range(60):  # almost flat images: their DCT coefficients sit close together, near the median
    pixels = np.clip(int(rng.integers(20, 240)) + rng.normal(0, 0.6, (480, 640, 3)), 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, "JPEG", quality=int(rng.integers(60, 95)))
    f = inspect_image(buffer.getvalue())
    facts.append((f.phash, f.brightness, f.contrast, f.sharpness, f.colourfulness, f.quality))
print(hashlib.sha256(repr(facts).encode()).hexdigest())
"""


def _has_avx2() -> bool:
    try:
        return platform.machine() == "x86_64" and " avx2" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not _has_avx2(), reason="needs an x86-64 CPU with AVX2 to run OpenBLAS's Haswell kernels")
def test_the_numbers_do_not_depend_on_the_cpus_blas_kernels() -> None:
    """The same image gives the same hash and signals on every CPU: OpenBLAS's kernels for two CPU
    generations round differently (a float32 matrix product moved hash bits of these images), and
    inspections are reused across machines."""
    outputs = {subprocess.run([sys.executable, "-c", BLAS_SCRIPT], capture_output=True, text=True, check=True,
                              env={**os.environ, "OPENBLAS_CORETYPE": kernel}).stdout
               for kernel in ("Haswell", "Prescott")}
    assert len(outputs) == 1, outputs
