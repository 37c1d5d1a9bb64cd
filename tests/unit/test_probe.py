"""probe.inspect_image against Pillow-made files, with tf.io.decode_image as the reference decoder."""

from __future__ import annotations

import hashlib
import io
import random
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.images.probe import (
    MAX_PIXELS,
    ImageFacts,
    RejectedImage,
    inspect_image,
    prepare_image,
    sniff_format,
)

SIZE = (37, 23)  # odd sizes: width and height cannot be swapped unnoticed


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


def _noise(mode: str, size: tuple[int, int] = SIZE, seed: int = 0) -> Any:
    from PIL import Image

    rng = random.Random(seed)
    if mode == "P":
        return _noise("RGB", size, seed).quantize(colors=16)
    if mode == "1":
        return _noise("L", size, seed).convert("1")
    bytes_per_pixel = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4, "I;16": 2, "CMYK": 4}[mode]
    return Image.frombytes(mode, size, rng.randbytes(size[0] * size[1] * bytes_per_pixel))


def _encode(mode: str, fmt: str, size: tuple[int, int] = SIZE, **options: Any) -> bytes:
    buf = io.BytesIO()
    _noise(mode, size).save(buf, fmt, **options)
    return buf.getvalue()


IMAGES = {
    "jpeg_rgb": ("RGB", "JPEG", {"quality": 90}),
    "jpeg_rgb_progressive": ("RGB", "JPEG", {"progressive": True}),
    "jpeg_gray": ("L", "JPEG", {}),
    "png_rgb": ("RGB", "PNG", {}),
    "png_rgba": ("RGBA", "PNG", {}),
    "png_l": ("L", "PNG", {}),
    "png_la": ("LA", "PNG", {}),
    "png_p": ("P", "PNG", {}),
    "png_p_transparent": ("P", "PNG", {"transparency": 0}),
    "png_i16": ("I;16", "PNG", {}),
    "png_1bit": ("1", "PNG", {}),
    "png_l_trns": ("L", "PNG", {"transparency": 5}),
    "png_rgb_trns": ("RGB", "PNG", {"transparency": (1, 2, 3)}),
    "png_interlaced": ("RGB", "PNG", {"interlace": 1}),
}


def _image(name: str) -> bytes:
    mode, fmt, options = IMAGES[name]
    return _encode(mode, fmt, **options)


@pytest.mark.parametrize("name", list(IMAGES))
def test_facts_match_tensorflow(tf: Any, name: str) -> None:
    data = _image(name)
    facts = inspect_image(data)
    decoded = tf.io.decode_image(data)
    assert facts == ImageFacts(
        sha256=hashlib.sha256(data).hexdigest(),
        num_bytes=len(data),
        format=IMAGES[name][1].lower(),
        width=int(decoded.shape[1]),
        height=int(decoded.shape[0]),
        channels=int(decoded.shape[2]),
        source_format=IMAGES[name][1].lower(),
        transform="",
        encoded_sha256=hashlib.sha256(data).hexdigest(),
        encoded_bytes=len(data),
        phash=facts.phash,
        **{name: getattr(facts, name) for name in ("brightness", "contrast", "sharpness", "colourfulness",
                                                   "quality")},
    )
    assert (facts.width, facts.height) == SIZE
    assert len(facts.phash) == 16 and int(facts.phash, 16) < 1 << 63  # the perceptual hash of what it decoded
    assert 0 <= float(facts.brightness) <= 255 and float(facts.contrast) >= 0  # the signals of what it decoded


def test_expected_channels_per_mode() -> None:
    # The numbers TensorFlow gives (checked above); spelled out so a wrong table is obvious.
    expected = {"jpeg_rgb": 3, "jpeg_gray": 1, "png_rgb": 3, "png_rgba": 4, "png_l": 1, "png_la": 2,
                "png_p": 3, "png_p_transparent": 4, "png_i16": 1, "png_1bit": 1}
    assert {name: inspect_image(_image(name)).channels for name in expected} == expected


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
@pytest.mark.parametrize("orientation", [2, 3, 4, 5, 6, 7, 8])
def test_exif_orientation_is_applied_to_the_pixels(tf: Any, fmt: str, orientation: int) -> None:
    from PIL import Image, ImageOps

    exif = Image.Exif()
    exif[0x0112] = orientation
    source = _noise("RGB")
    buf = io.BytesIO()
    source.save(buf, fmt, exif=exif.tobytes())
    facts, stored = prepare_image(buf.getvalue())
    upright = ImageOps.exif_transpose(Image.open(io.BytesIO(buf.getvalue())))
    decoded = tf.io.decode_image(stored)
    assert (facts.width, facts.height) == upright.size == (decoded.shape[1], decoded.shape[0])
    assert facts.transform == "exif_rotate" and facts.format == fmt.lower()
    assert facts.encoded_sha256 == hashlib.sha256(stored).hexdigest() != facts.sha256
    assert Image.open(io.BytesIO(stored)).getexif().get(0x0112, 1) == 1  # no tag left to apply twice
    if fmt == "PNG":  # lossless: exactly the upright pixels
        assert decoded.numpy().tobytes() == upright.convert("RGB").tobytes()


@pytest.mark.parametrize("orientation", [0, 1])
def test_upright_exif_is_stored_as_is(orientation: int) -> None:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = orientation
    data = _encode("RGB", "JPEG", exif=exif.tobytes())
    facts, stored = prepare_image(data)
    assert stored == data and facts.transform == ""


def test_jpeg_with_png_name_is_jpeg(tmp_path: Path) -> None:
    path = tmp_path / "photo.png"
    _noise("RGB").save(path, "JPEG")
    facts = inspect_image(path.read_bytes())
    assert facts.format == "jpeg"
    assert (facts.width, facts.height, facts.channels) == (*SIZE, 3)


def test_png_with_jpg_name_is_png(tmp_path: Path) -> None:
    path = tmp_path / "photo.jpg"
    _noise("RGBA").save(path, "PNG")
    facts = inspect_image(path.read_bytes())
    assert (facts.format, facts.channels) == ("png", 4)


def test_cmyk_jpeg_becomes_rgb_jpeg(tf: Any) -> None:
    facts, stored = prepare_image(_encode("CMYK", "JPEG"))
    assert (facts.format, facts.source_format, facts.transform, facts.channels) == ("jpeg", "jpeg", "cmyk_to_rgb", 3)
    assert tuple(tf.io.decode_image(stored).shape) == (SIZE[1], SIZE[0], 3)


# -- truncation and damage -------------------------------------------------------------------------
def _reason(data: bytes, **kwargs: Any) -> str:
    with pytest.raises(RejectedImage) as info:
        inspect_image(data, **kwargs)
    return info.value.reason


def _cut(data: bytes, where: str) -> bytes:
    return {
        "signature": data[:8],
        "header": data[:20],
        "after_header": data[:60],
        "middle": data[: len(data) // 2],
        "three_quarters": data[: len(data) * 3 // 4],
        "last_12": data[:-12],
        "last_4": data[:-4],
        "last_2": data[:-2],
        "last_1": data[:-1],
    }[where]


JPEG_CUTS = ["signature", "header", "after_header", "middle", "three_quarters", "last_12", "last_4", "last_2",
             "last_1"]


@pytest.mark.parametrize("name", ["jpeg_rgb", "jpeg_rgb_progressive", "jpeg_gray"])
@pytest.mark.parametrize("where", JPEG_CUTS)
def test_truncated_jpeg_is_corrupt(name: str, where: str) -> None:
    assert _reason(_cut(_image(name), where)) == "corrupt"


# The last three cut the IEND chunk: libpng, and so TensorFlow, reject such files.
PNG_CUTS = ["signature", "header", "after_header", "middle", "three_quarters", "last_12", "last_4", "last_1"]


@pytest.mark.parametrize("name", ["png_rgb", "png_p_transparent", "png_i16"])
@pytest.mark.parametrize("where", PNG_CUTS)
def test_truncated_png_is_corrupt(name: str, where: str) -> None:
    assert _reason(_cut(_image(name), where)) == "corrupt"


@pytest.mark.parametrize("where", ["last_12", "last_4", "last_1"])
def test_tensorflow_rejects_png_without_complete_iend(tf: Any, where: str) -> None:
    """The reference behaviour behind the IEND cuts above: TensorFlow rejects them too."""
    data = _cut(_image("png_rgb"), where)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(data)


def test_png_with_damaged_image_data_is_corrupt() -> None:
    data = _image("png_rgb")
    start = data.index(b"IDAT") + 4
    damaged = data[:start] + bytes(b ^ 0xFF for b in data[start : start + 64]) + data[start + 64 :]
    assert _reason(damaged) == "corrupt"


def test_empty_file() -> None:
    assert _reason(b"") == "empty_file"


@pytest.mark.parametrize("data", [
    random.Random(7).randbytes(5000),
    b"hello, this is a text file\n" * 20,
    b"\xff\xd8",  # half a JPEG signature
    b"\x89PNG\r\n",  # part of the PNG signature
    b"<svg xmlns='http://www.w3.org/2000/svg'/>",
    b"\x00" * 100,
])
def test_not_an_image(data: bytes) -> None:
    assert sniff_format(data) is None
    assert _reason(data) == "not_an_image"


@pytest.mark.parametrize(("mode", "fmt", "options"), [
    ("RGB", "GIF", {}), ("P", "GIF", {"transparency": 0}), ("RGB", "BMP", {}), ("L", "BMP", {}),
    ("RGB", "WEBP", {"lossless": True}), ("RGBA", "WEBP", {"lossless": True}), ("RGB", "TIFF", {}),
    ("RGB", "TIFF", {"compression": "tiff_lzw"}), ("I;16", "TIFF", {}), ("CMYK", "TIFF", {}),
])
def test_other_formats_become_lossless_png(tf: Any, mode: str, fmt: str, options: dict[str, Any]) -> None:
    from PIL import Image

    data = _encode(mode, fmt, **options)
    facts, stored = prepare_image(data)
    assert (facts.format, facts.source_format, facts.transform) == ("png", fmt.lower(), "to_png")
    assert facts.sha256 == hashlib.sha256(data).hexdigest()
    assert facts.encoded_sha256 == hashlib.sha256(stored).hexdigest()
    decoded = tf.io.decode_image(stored)  # one 3-D image, not a stack of frames
    assert decoded.shape == (SIZE[1], SIZE[0], facts.channels)
    original, converted = Image.open(io.BytesIO(data)), Image.open(io.BytesIO(stored))
    target = "RGBA" if "A" in original.mode or "transparency" in original.info else "RGB"
    if original.mode not in ("I;16", "CMYK"):  # lossless: the same pixels
        assert converted.convert(target).tobytes() == original.convert(target).tobytes()


@pytest.mark.parametrize("fmt", ["GIF", "WEBP", "PNG", "TIFF"])
def test_animations_and_multi_page_files_are_rejected(fmt: str) -> None:
    frames = [_noise("RGB", seed=i) for i in range(3)]
    buf = io.BytesIO()
    frames[0].save(buf, fmt, save_all=True, append_images=frames[1:], **({"lossless": True} if fmt == "WEBP" else {}))
    with pytest.raises(RejectedImage) as info:
        prepare_image(buf.getvalue())
    assert info.value.reason == "multi_frame"
    assert "more than one frame" in info.value.detail


def test_float_tiff_is_unsupported() -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("F", SIZE, 0.5).save(buf, "TIFF")
    with pytest.raises(RejectedImage) as info:
        prepare_image(buf.getvalue())
    assert info.value.reason == "unsupported_format" and "F" in info.value.detail


# -- pixel limits ----------------------------------------------------------------------------------
def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG that declares ``width`` x ``height`` RGB pixels but holds almost no data."""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + _chunk(b"IEND", b""))


@pytest.mark.parametrize("width,height", [(100_000, 100_000), (10_000, 10_000), (65_535, 2_000)])
def test_huge_declared_png_is_too_many_pixels(width: int, height: int) -> None:
    assert width * height > MAX_PIXELS
    assert _reason(_png_header_only(width, height)) == "too_many_pixels"


def test_declared_size_over_small_limit_is_too_many_pixels() -> None:
    assert _reason(_png_header_only(5_000, 5_000), max_pixels=1_000_000) == "too_many_pixels"


def test_small_limit_boundary() -> None:
    data = _image("png_rgb")  # 37 x 23 = 851 pixels
    assert inspect_image(data, max_pixels=851).width == SIZE[0]
    with pytest.raises(RejectedImage) as info:
        inspect_image(data, max_pixels=850)
    assert info.value.reason == "too_many_pixels"
    assert _reason(_image("jpeg_rgb"), max_pixels=850) == "too_many_pixels"


def test_under_limit_header_only_png_is_corrupt_not_too_big() -> None:
    assert _reason(_png_header_only(2_000, 2_000)) == "corrupt"


def test_raised_pixel_limit_is_honoured() -> None:
    assert _reason(_png_header_only(10_000, 10_000), max_pixels=200_000_000) == "corrupt"


# -- sniff_format ----------------------------------------------------------------------------------
@pytest.mark.parametrize("data,expected", [
    (b"\xff\xd8\xff\xe0\x00\x10JFIF", "jpeg"),
    (b"\xff\xd8\xff\xdb", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"\x89PNG\r\n\x1a", None),
    (b"\x89PNG\n\r\x1a\n", None),
    (b"GIF87a...", "gif"),
    (b"GIF89a...", "gif"),
    (b"GIF90a...", None),
    (b"BM\x00\x00", "bmp"),
    (b"RIFF\x00\x00\x00\x00WEBPVP8 ", "webp"),
    (b"RIFF\x00\x00\x00\x00WAVEfmt ", None),
    (b"II*\x00\x08\x00", "tiff"),
    (b"MM\x00*\x00\x00", "tiff"),
    (b"II+\x00", None),
    (b"", None),
    (b"\xff", None),
    (b"%PDF-1.7", None),
])
def test_sniff_format(data: bytes, expected: str | None) -> None:
    assert sniff_format(data) == expected


@pytest.mark.parametrize("name", ["jpeg_rgb", "png_rgba"])
def test_sniff_format_of_real_files(name: str) -> None:
    assert sniff_format(_image(name)) == IMAGES[name][1].lower()


def test_rejected_image_message() -> None:
    error = RejectedImage("corrupt", "broken scan")
    assert (error.reason, error.detail, str(error)) == ("corrupt", "broken scan", "corrupt: broken scan")
    assert str(RejectedImage("empty_file")) == "empty_file"


def _png_rows(idat: bytes, width: int = 8, height: int = 4) -> bytes:
    """An RGB PNG of ``width`` x ``height`` whose IDAT is ``idat`` (CRCs right)."""
    return (b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + _chunk(b"IDAT", idat) + _chunk(b"IEND", b""))


_ROWS = b"".join(b"\x00" + bytes(range(24)) for _ in range(4))  # 4 rows of 8 RGB pixels, filter 0


@pytest.mark.parametrize(("name", "idat", "decodes"), [
    ("exact", zlib.compress(_ROWS), True),
    ("data_past_the_last_row", zlib.compress(_ROWS + b"\x00" + bytes(24)), True),  # libpng ignores it
    ("zlib_stream_cut", zlib.compress(_ROWS)[:-4], False),  # rows complete, Adler-32 missing
    ("bad_adler32", zlib.compress(_ROWS)[:-4] + b"\x00\x00\x00\x00", False),
    ("too_few_rows", zlib.compress(_ROWS[:-25]), False),
    ("bad_filter_type", zlib.compress(b"\x07" + _ROWS[1:]), False),
])
def test_png_stream_check_agrees_with_tensorflow(tf: Any, name: str, idat: bytes, decodes: bool) -> None:
    data = _png_rows(idat)
    try:
        tf.io.decode_image(data)
        tf_decodes = True
    except Exception:  # InvalidArgumentError and friends
        tf_decodes = False
    assert tf_decodes is decodes, name
    if decodes:
        assert inspect_image(data).channels == 3
    else:
        assert _reason(data) == "corrupt"
