"""Unit tests of the image options' arithmetic and transforms (imaging) and of metadata values (metadata)."""

from __future__ import annotations

import io
from array import array

import numpy as np
import pytest
from PIL import Image

from image_tfrecords.config import parse_columns
from image_tfrecords.errors import ConfigError
from image_tfrecords.images.transform import (
    ImageOptions,
    Output,
    make_image,
    output_of,
    parse_resize,
    planned_bytes,
    planned_facts,
    resized_size,
)
from image_tfrecords.records.columns import BadValue, feature_value, label_set, normal_value
from image_tfrecords.records.example import decode_example, encode_example


@pytest.mark.parametrize(("text", "size", "fit", "upscale", "expected"), [
    ("none", (640, 480), "crop", False, (640, 480)),
    ("longest:320", (640, 480), "crop", False, (320, 240)),
    ("longest:320", (480, 640), "crop", False, (240, 320)),
    ("shortest:256", (640, 480), "crop", False, (341, 256)),
    ("shortest:256", (100, 80), "crop", False, (100, 80)),  # never enlarged...
    ("shortest:256", (100, 80), "crop", True, (320, 256)),  # ...unless asked
    ("224x224", (640, 480), "crop", False, (224, 224)),
    ("224x224", (640, 480), "pad", False, (224, 224)),
    ("224x224", (640, 480), "stretch", False, (224, 224)),
    ("224x224", (100, 300), "crop", False, (100, 224)),  # too small to cover: cut to at most WxH
    ("224x224", (100, 300), "pad", False, (224, 224)),  # pad always gives WxH
    ("224x224", (100, 300), "stretch", False, (100, 224)),  # only the long side shrinks
    ("224x224", (100, 300), "stretch", True, (224, 224)),
    ("224x224", (100, 300), "crop", True, (224, 224)),
    ("longest:1", (5000, 3), "crop", False, (1, 1)),  # at least one pixel
])
def test_resized_size_rules(text: str, size: tuple[int, int], fit: str, upscale: bool,
                            expected: tuple[int, int]) -> None:
    assert resized_size(*size, parse_resize(text), fit, upscale) == expected


@pytest.mark.parametrize("text", ["banana", "0x10", "10x0", "longest:0", "longest:", "x10", "70000x10", "10 x 10"])
def test_bad_resize_is_a_config_error(text: str) -> None:
    with pytest.raises(ConfigError, match="resize"):
        parse_resize(text)


def test_fit_needs_an_exact_size() -> None:
    from image_tfrecords.images.transform import check_options

    check_options(ImageOptions(resize=parse_resize("10x10"), fit="pad"))
    check_options(ImageOptions(resize=parse_resize("longest:10")))  # crop, the default, goes with any resize
    with pytest.raises(ConfigError, match="fit pad applies to a WxH resize only"):
        check_options(ImageOptions(resize=parse_resize("longest:10"), fit="pad"))


def test_resize_text_is_normalised() -> None:
    assert str(parse_resize(" 224X112 ")) == "224x112"
    assert str(parse_resize("Longest:64")) == "longest:64"
    assert str(parse_resize("")) == "none"


def test_output_of_decides_format_channels_and_whether_the_writer_makes_it() -> None:
    default = ImageOptions()
    assert not output_of(default, "jpeg", 64, 48, 3).made
    shrink = ImageOptions(resize=parse_resize("longest:32"))
    assert output_of(shrink, "png", 16, 12, 4) == Output(16, 12, 4, "png", False, False)  # small: as is
    assert output_of(shrink, "png", 64, 48, 4) == Output(32, 24, 4, "png", True, True)
    assert output_of(ImageOptions(encoding="jpeg"), "jpeg", 8, 8, 3).made  # jpeg re-encodes every image
    assert output_of(ImageOptions(encoding="jpeg"), "png", 8, 8, 4).channels == 3  # no alpha in JPEG
    assert not output_of(ImageOptions(encoding="png"), "png", 8, 8, 2).made  # a PNG stays byte for byte
    assert output_of(ImageOptions(encoding="raw"), "png", 8, 8, 1) == Output(8, 8, 3, "raw", True, False)
    assert output_of(ImageOptions(channels=4), "jpeg", 8, 8, 3).format == "png"  # original + alpha: PNG
    assert output_of(ImageOptions(channels=1), "jpeg", 8, 8, 1).made is False


def test_planned_facts_and_bytes() -> None:
    opts = ImageOptions(resize=parse_resize("10x10"), fit="pad", encoding="raw", channels=1)
    assert planned_facts(opts, "jpeg", "40", "20", "3", "exif_rotate", "ab", "99") == (
        "10", "10", "1", "raw", "exif_rotate+resize+channels_1+to_raw", "", "100")
    unchanged = planned_facts(ImageOptions(), "png", "4", "4", "3", "", "ab", "99")
    assert unchanged == ("4", "4", "3", "png", "", "ab", "99")
    assert planned_bytes("123", "jpeg", "10", "10", "3", 95) == 123
    assert 0 < planned_bytes("", "jpeg", "100", "100", "3", 50) < planned_bytes("", "jpeg", "100", "100", "3", 95)


def _png(image: Image.Image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "PNG")
    return buf.getvalue()


def _photo(width: int, height: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, len(mode)), dtype=np.uint8)
    return Image.fromarray(pixels[..., 0] if mode == "L" else pixels, mode)


def test_make_image_raw_equals_pillow_lanczos_and_is_deterministic() -> None:
    source = _photo(40, 30)
    opts = ImageOptions(resize=parse_resize("longest:20"), encoding="raw")
    out = output_of(opts, "png", 40, 30, 3)
    made = make_image(_png(source), out, opts, 10**8)
    expected = np.asarray(source.resize((20, 15), Image.Resampling.LANCZOS))
    assert np.array_equal(np.frombuffer(made, np.uint8).reshape(15, 20, 3), expected)
    assert make_image(_png(source), out, opts, 10**8) == made


def test_make_image_turns_exif_rotated_jpegs_upright() -> None:
    source = _photo(60, 20)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 degrees clockwise to show upright
    buf = io.BytesIO()
    source.save(buf, "JPEG", exif=exif, quality=95)
    opts = ImageOptions(resize=parse_resize("longest:30"), encoding="png")
    out = output_of(opts, "jpeg", 20, 60, 3)  # inspection records the upright size
    made = Image.open(io.BytesIO(make_image(buf.getvalue(), out, opts, 10**8)))
    assert made.format == "PNG" and made.size == (10, 30)


@pytest.mark.parametrize(("fit", "expected_corner"), [("pad", 0), ("crop", None)])
def test_make_image_exact_size_by_fit(fit: str, expected_corner: int | None) -> None:
    source = Image.new("RGB", (40, 20), (200, 100, 50))
    opts = ImageOptions(resize=parse_resize("20x20"), fit=fit, encoding="raw")
    out = output_of(opts, "png", 40, 20, 3)
    pixels = np.frombuffer(make_image(_png(source), out, opts, 10**8), np.uint8).reshape(20, 20, 3)
    if expected_corner is None:
        assert (pixels == (200, 100, 50)).all()  # crop: all image
    else:
        assert (pixels[0, 0] == expected_corner).all() and (pixels[10, 10] == (200, 100, 50)).all()  # pad: black bars


def test_make_image_channels_and_sixteen_bit() -> None:
    grey16 = Image.fromarray(np.full((4, 4), 0x1234, np.uint16))
    opts = ImageOptions(encoding="raw", channels=3)
    out = output_of(opts, "png", 4, 4, 1)
    pixels = np.frombuffer(make_image(_png(grey16), out, opts, 10**8), np.uint8)
    assert (pixels == 0x12).all() and len(pixels) == 4 * 4 * 3  # the high byte, repeated to RGB
    rgba = Image.new("RGBA", (4, 4), (10, 20, 30, 40))
    jpeg = ImageOptions(encoding="jpeg")
    made = Image.open(io.BytesIO(make_image(_png(rgba), output_of(jpeg, "png", 4, 4, 4), jpeg, 10**8)))
    assert made.format == "JPEG" and made.mode == "RGB"


def test_metadata_values() -> None:
    assert normal_value("float", " 1.50 ", "|") == "1.5"
    assert normal_value("int64", "007", "|") == "7"
    assert normal_value("string", " as is ", "|") == " as is "
    assert normal_value("string_list", " a | b ||", "|") == "a|b||"
    assert normal_value("int64_list", "", "|") == ""
    for kind, value in [("float", "abc"), ("int64", "1.5"), ("int64", ""), ("float", "1e39"),
                        ("int64", str(1 << 63)), ("int64_list", "1|x")]:
        with pytest.raises(BadValue):
            normal_value(kind, value, "|")
    assert label_set(" cat | dog|cat||", "|") == ["cat", "dog"]


def test_typed_empty_lists_keep_their_type_in_the_record() -> None:
    record = encode_example({"ints": feature_value("int64_list", "", "|"),
                             "floats": feature_value("float_list", "", "|"),
                             "some": feature_value("float_list", "0.5|2", "|")})
    from image_tfrecords.records.example import _example_class

    example = _example_class()()
    example.ParseFromString(record)
    kinds = {key: f.WhichOneof("kind") for key, f in example.features.feature.items()}
    assert kinds == {"ints": "int64_list", "floats": "float_list", "some": "float_list"}
    assert decode_example(record)["some"] == [0.5, 2.0]
    assert isinstance(feature_value("int64_list", "1|2", "|"), array)


def test_parse_columns() -> None:
    assert parse_columns("caption=string, weight=float,n=int") == {"caption": "string", "weight": "float",
                                                                   "n": "int64"}
    assert parse_columns('{"tags": "string_list"}') == {"tags": "string_list"}
    assert parse_columns("") == {}
    for bad in ["weight=complex", "weight", "split=string", "a/b=string", "x=int,x=float", "{not json"]:
        with pytest.raises(ConfigError):
            parse_columns(bad)
