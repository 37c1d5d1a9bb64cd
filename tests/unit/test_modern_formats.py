"""HEIC/HEIF, AVIF and JPEG XL, what phones and new cameras write: sniffed, decoded, made upright and
stored as lossless PNG, end to end through the CLI and read back with TensorFlow.

Every file is made here from photo-like pixels (``jpeg_variants.photo``): HEIC with pillow-heif's
encoder (x265), AVIF with Pillow's (libavif), JPEG XL with pillow-jxl-plugin's (libjxl).
"""

from __future__ import annotations

import csv
import io
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.errors import RejectedImage
from image_tfrecords.images.formats import JxlHeader, jxl_header, register_decoders
from image_tfrecords.images.probe import prepare_image, sniff_format
from image_tfrecords.storage import Storage
from tests.jpeg_variants import SIZE, encode, photo
from tests.tf_reader import read_version

ROOT = Path(__file__).resolve().parents[2]
ORIENTATION = 0x0112
HEAD = 32  # reading._HEAD: what decides not_an_image


def _exif(orientation: int) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return exif.tobytes()


def _encoders() -> None:
    register_decoders()  # registers HEIF saving too; pillow_jxl registers JXL saving on import
    import pillow_jxl  # noqa: F401


def heic(image: Any = None, **options: Any) -> bytes:
    _encoders()
    return encode(photo() if image is None else image, "HEIF", quality=90, **options)


def burst_heic() -> bytes:
    """Two images, the second (30 x 20) marked primary."""
    _encoders()
    buf = io.BytesIO()
    photo().save(buf, "HEIF", save_all=True, append_images=[photo(size=(30, 20), seed=3)], primary_index=1, quality=90)
    return buf.getvalue()


def avif(image: Any = None, **options: Any) -> bytes:
    return encode(photo() if image is None else image, "AVIF", quality=90, **options)


def jxl(image: Any = None, **options: Any) -> bytes:
    _encoders()
    return encode(photo() if image is None else image, "JXL", **({"lossless": True} | options))


def _boxes(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, whole box) of each top-level ISO-BMFF / JPEG XL container box."""
    out, pos = [], 0
    while pos < len(data):
        size, kind = struct.unpack(">I4s", data[pos:pos + 8])
        out.append((kind, data[pos:pos + size]))
        pos += size
    return out


def recompressed_jpeg(tmp: Path, orientation: int, keep_jpeg: bool = True) -> bytes:
    """A JPEG with EXIF ``orientation`` recompressed losslessly into JPEG XL (libjxl copies the
    orientation into the codestream). Without its jbrd box the JPEG cannot be rebuilt, so libjxl
    decodes pixels and applies the codestream orientation itself."""
    from PIL import Image

    _encoders()
    path = tmp / f"src-{orientation}.jpg"
    path.write_bytes(encode(photo(seed=5), "JPEG", quality=90, exif=_exif(orientation)))
    buf = io.BytesIO()
    Image.open(path).save(buf, "JXL", lossless_jpeg=True)
    data = buf.getvalue()
    assert jxl_header(data).orientation == orientation
    return data if keep_jpeg else b"".join(box for kind, box in _boxes(data) if kind != b"jbrd")


class BitWriter:
    """Writes a JPEG XL bitstream: least significant bit first."""

    def __init__(self) -> None:
        self.bits: list[int] = []

    def put(self, value: int, count: int) -> BitWriter:
        self.bits += [(value >> i) & 1 for i in range(count)]
        return self

    def bytes(self) -> bytes:
        out = bytearray((len(self.bits) + 7) // 8)
        for i, bit in enumerate(self.bits):
            out[i >> 3] |= bit << (i & 7)
        return bytes(out)


def jxl_codestream_header(ysize_minus_1: int, orientation: int = 1, preview: bool = False,
                          animation: bool = False) -> bytes:
    """A codestream that declares a square image (SizeHeader with ratio 1:1), then metadata: what
    ``jxl_header`` reads; the rest is zeros (libjxl must never get that far)."""
    bits = BitWriter().put(0, 1).put(2, 2).put(ysize_minus_1, 18).put(1, 3)  # not small, U32 18 bits, 1:1
    if orientation == 1 and not preview and not animation:
        bits.put(1, 1)  # all_default
    else:
        bits.put(0, 1).put(1, 1).put(orientation - 1, 3).put(0, 1)  # extra_fields, orientation, no intrinsic size
        bits.put(int(preview), 1)
        if preview:
            bits.put(0, 1).put(0, 2).put(31, 6).put(0, 3).put(1, 2).put(200, 8)  # 32 high, 265 wide
        bits.put(int(animation), 1)
    return b"\xff\x0a" + bits.bytes() + bytes(64)


# -- sniffing --------------------------------------------------------------------------------------
def _ftyp(major: bytes, *compatible: bytes) -> bytes:
    return struct.pack(">I4s4sI", 16 + 4 * len(compatible), b"ftyp", major, 0) + b"".join(compatible)


@pytest.mark.parametrize("data,expected", [
    (_ftyp(b"heic", b"mif1", b"heic"), "heif"),
    (_ftyp(b"heix", b"mif1"), "heif"),
    (_ftyp(b"hevc", b"msf1"), "heif"),
    (_ftyp(b"heim"), "heif"),
    (_ftyp(b"heis"), "heif"),
    (_ftyp(b"mif1", b"mif1", b"heic"), "heif"),
    (_ftyp(b"msf1", b"msf1", b"hevc"), "heif"),
    (_ftyp(b"mif1", b"miaf"), "heif"),  # generic brand: libheif decides
    (_ftyp(b"avif", b"avif", b"mif1", b"miaf"), "avif"),
    (_ftyp(b"avis", b"avis", b"msf1"), "avif"),
    (_ftyp(b"mif1", b"mif1", b"miaf", b"avif"), "avif"),
    (_ftyp(b"msf1", b"avis"), "avif"),
    (_ftyp(b"isom", b"iso2", b"mp41"), None),  # MP4 video
    (_ftyp(b"qt  "), None),  # QuickTime (a Live Photo's video)
    (_ftyp(b"crx ", b"crx "), None),  # Canon CR3 raw
    (b"\x00\x00\x00\x18ftyp", None),
    (b"\xff\x0a\xfa\x7f", "jxl"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87\n\x00\x00\x00\x14ftypjxl ", "jxl"),
    (b"\x00\x00\x00\x0cJXL \r\n\x87", None),
    (b"\x00\x00\x00\x0cjP  \r\n\x87\n", None),  # JPEG 2000
    (b"\xff\x0b", None),
])
def test_sniff_format_modern(data: bytes, expected: str | None) -> None:
    assert sniff_format(data) == expected


@pytest.mark.parametrize("make,expected", [(heic, "heif"), (avif, "avif"), (jxl, "jxl"),
                                           (lambda: jxl(use_container=True, exif=_exif(6)), "jxl")])
def test_real_files_are_recognised_from_their_first_bytes(make: Any, expected: str) -> None:
    data = make()
    assert sniff_format(data) == sniff_format(data[:HEAD]) == expected


# -- JPEG XL headers -----------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [SIZE, (64, 64), (800, 600), (1920, 1080), (100, 120), (3, 1000), (5000, 17)])
def test_jxl_header_reads_the_size(size: tuple[int, int]) -> None:
    for data in (jxl(photo(size=size)), jxl(photo(size=size), lossless=False, quality=80, use_container=True)):
        header = jxl_header(data)
        assert (header.width, header.height, header.orientation, header.animated) == (*size, 1, False)


def test_jxl_header_reads_orientation_preview_and_animation() -> None:
    assert jxl_header(jxl_codestream_header(99)) == JxlHeader(100, 100, 1, False)
    header = jxl_header(jxl_codestream_header(99, orientation=6))
    assert (header.width, header.height, header.orientation, header.animated) == (100, 100, 6, False)
    header = jxl_header(jxl_codestream_header(99, orientation=3, preview=True, animation=True))
    assert (header.orientation, header.animated) == (3, True)
    assert jxl_header(jxl_codestream_header(99, preview=True)).animated is False
    with pytest.raises(ValueError, match="cut short"):
        jxl_header(b"\xff\x0a\x00")


def _reason(data: bytes, **kwargs: Any) -> tuple[str, str]:
    with pytest.raises(RejectedImage) as info:
        prepare_image(data, **kwargs)
    return info.value.reason, info.value.detail


def test_jxl_bomb_and_animation_are_rejected_from_the_header() -> None:
    # libjxl would decode all 10^10 pixels on open: the header decides first
    assert _reason(jxl_codestream_header(99_999)) == ("too_many_pixels", "100000x100000 exceeds 89478485 pixels")
    assert _reason(jxl_codestream_header(99, animation=True)) == ("multi_frame", "animated jxl")


# -- decoding, one file at a time ----------------------------------------------------------------------
@pytest.mark.parametrize("make", [heic, avif, jxl])
@pytest.mark.parametrize("cut", [0.25, 0.5, 0.9, -1])
def test_truncated_files_are_corrupt(make: Any, cut: float) -> None:
    data = make()
    end = len(data) - 1 if cut == -1 else int(len(data) * cut)
    reason, detail = _reason(data[:end])
    assert reason == "corrupt", detail
    assert "\n" not in detail and " at 0x" not in detail


def test_animated_avif_is_multi_frame() -> None:
    frames = [photo(seed=i) for i in range(3)]
    data = encode(frames[0], "AVIF", save_all=True, append_images=frames[1:], quality=90)
    assert _reason(data) == ("multi_frame", "avif with more than one frame")


def test_heif_sequence_without_a_still_image_is_multi_frame() -> None:
    data = b"".join(box if kind != b"meta" else b"" for kind, box in _boxes(heic()))
    sequence_only = data + struct.pack(">I4s", 8, b"moov")
    assert _reason(sequence_only) == ("multi_frame", "heif image sequence without a still image")
    assert _reason(data)[0] == "corrupt"


def test_heif_with_several_images_stores_the_primary_one() -> None:
    facts, _ = prepare_image(burst_heic())
    assert (facts.source_format, facts.format, facts.width, facts.height) == ("heif", "png", 30, 20)


def test_a_missing_decoder_is_unsupported_format(monkeypatch: pytest.MonkeyPatch) -> None:
    from image_tfrecords.images import formats

    register_decoders()
    monkeypatch.setitem(formats._problems, "heif", "HEIF/HEIC needs the pillow-heif package (test)")
    assert _reason(heic()) == ("unsupported_format", "HEIF/HEIC needs the pillow-heif package (test)")


def test_decoders_are_registered_on_first_use_only() -> None:
    jpeg, heif_file = encode(photo(), "JPEG"), heic()
    code = ("import sys\n"
            "import image_tfrecords, image_tfrecords.images.probe as p\n"
            "import image_tfrecords.source.reading, image_tfrecords.source.listing\n"
            "from image_tfrecords.images.formats import register_decoders\n"
            "loaded = lambda: sorted(m for m in ('pillow_heif', 'pillow_jxl', 'PIL') if m in sys.modules)\n"
            "print(loaded())\n"
            "p.prepare_image(sys.stdin.buffer.read(int(sys.argv[1])))\n"
            "print(loaded())\n"
            "assert p.prepare_image(sys.stdin.buffer.read())[0].source_format == 'heif'\n"
            "print(loaded())\n"
            "assert register_decoders() == register_decoders() == {'heif': '', 'avif': '', 'jxl': ''}\n"
            "print(loaded())\n")
    result = subprocess.run([sys.executable, "-c", code, str(len(jpeg))], input=jpeg + heif_file, cwd=ROOT,
                            capture_output=True, timeout=120)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().splitlines() == [
        "[]", "['PIL']", "['PIL', 'pillow_heif']", "['PIL', 'pillow_heif', 'pillow_jxl']"]


# -- end to end: build with the CLI, read back with TensorFlow -----------------------------------------
def _pillow_upright(data: bytes) -> Any:
    """The source as Pillow decodes it (decoders registered), made upright by its EXIF orientation."""
    import numpy as np
    from PIL import Image, ImageOps

    register_decoders()
    return np.asarray(ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB"))


def _mean_diff(a: Any, b: Any) -> float:
    import numpy as np

    return float(np.abs(a.astype(int) - b.astype(int)).mean()) if a.shape == b.shape else float("inf")


def test_cli_builds_phone_formats_and_tensorflow_reads_them(tmp_path: Path) -> None:
    import numpy as np
    import tensorflow as tf
    from PIL import Image

    source = tmp_path / "src"
    rotated = photo(seed=5).transpose(Image.Transpose.ROTATE_270)  # what orientation 6 shows
    files = {
        "phone/upright.heic": heic(),
        "phone/rotated.HEIC": heic(photo(seed=5), exif=_exif(6)),  # as iPhones write: irot and EXIF 6
        "phone/upright.avif": avif(),
        "phone/rotated.avif": avif(photo(seed=5), exif=_exif(6)),
        "phone/burst.heic": burst_heic(),
        "camera/lossless.jxl": jxl(),
        "camera/recompressed.jxl": recompressed_jpeg(tmp_path, 6),
        "camera/rotated.jxl": recompressed_jpeg(tmp_path, 6, keep_jpeg=False),
        "camera/photo.jpg": encode(photo(seed=7), "JPEG", quality=90),
        "phone/truncated.heic": heic()[:-40],
        "phone/truncated.avif": avif()[:-10],
        "phone/animated.avif": encode(photo(), "AVIF", save_all=True, append_images=[photo(seed=1)]),
        "camera/truncated.jxl": jxl()[:300],
        "camera/bomb.jxl": jxl_codestream_header(99_999),
        "camera/animated.jxl": jxl_codestream_header(99, animation=True),
    }
    for name, data in files.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_bytes(data)

    result = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(source),
                             "--destination", str(tmp_path / "out"), "--dataset", "phones", "--version", "v1",
                             "--max-reject-fraction", "1", "--workers", "1"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / "phones" / "v1"
    with open(version / "rejects.csv", newline="", encoding="utf-8") as f:
        rejects = {row["filename"]: row["reason"] for row in csv.DictReader(f)}
    assert rejects == {"phone/truncated.heic": "corrupt", "phone/truncated.avif": "corrupt",
                       "phone/animated.avif": "multi_frame", "camera/truncated.jxl": "corrupt",
                       "camera/bomb.jxl": "too_many_pixels", "camera/animated.jxl": "multi_frame"}
    with open(version / "labels.csv", newline="", encoding="utf-8") as f:
        labels = {row["filename"]: row for row in csv.DictReader(f)}

    _, splits = read_version(Storage(), str(version))
    records = {r["image/filename"].decode(): r for split in splits.values() for r in split}
    assert set(records) == set(labels) == set(files) - set(rejects)
    expected_size = {"phone/rotated.HEIC": (45, 67), "phone/rotated.avif": (45, 67), "camera/rotated.jxl": (45, 67),
                     "camera/recompressed.jxl": (45, 67), "phone/burst.heic": (30, 20)}
    expected_transform = {"phone/rotated.avif": "to_png+exif_rotate", "camera/recompressed.jxl": "to_png+exif_rotate",
                          "camera/photo.jpg": ""}
    for name, record in records.items():
        row = labels[name]
        if name == "camera/photo.jpg":
            assert (record["image/format"], row["source_format"]) == (b"jpeg", "jpeg")
            continue
        assert row["source_format"] == {"heic": "heif", "avif": "avif", "jxl": "jxl"}[name.rsplit(".", 1)[1].lower()]
        assert row["transform"] == expected_transform.get(name, "to_png"), name
        assert record["image/format"] == b"png" and record["image/encoded"][:8] == b"\x89PNG\r\n\x1a\n"
        pixels = tf.io.decode_image(record["image/encoded"]).numpy()
        width, height = expected_size.get(name, SIZE)
        assert pixels.shape == (height, width, 3) == record["decoded_shape"], name
        assert (record["image/width"], record["image/height"], record["image/channels"]) == (width, height, 3)
        assert (row["width"], row["height"]) == (str(width), str(height))
        # lossy source, lossless transcode: exactly what Pillow decodes, made upright
        assert np.array_equal(pixels, _pillow_upright(files[name])), name
        if name.split("/")[1].startswith("rotated") or name == "camera/recompressed.jxl":
            # and upright for real: close to the photo turned as orientation 6 says, far from the other way
            assert _mean_diff(pixels, np.asarray(rotated)) < 16, name
            for wrong in (Image.Transpose.ROTATE_180, Image.Transpose.FLIP_LEFT_RIGHT):  # orientations 8 and 7
                assert _mean_diff(pixels, np.asarray(rotated.transpose(wrong))) > 30, name
    assert np.array_equal(tf.io.decode_image(records["camera/lossless.jxl"]["image/encoded"]).numpy(),
                          np.asarray(photo())), "a lossless JPEG XL is stored pixel for pixel"
    assert _mean_diff(tf.io.decode_image(records["phone/burst.heic"]["image/encoded"]).numpy(),
                      np.asarray(photo(size=(30, 20), seed=3))) < 16, "the primary image of the burst"


def test_modern_formats_off_skips_their_names_and_rejects_their_bytes(tmp_path: Path) -> None:
    import json

    source = tmp_path / "src"
    (source / "phone").mkdir(parents=True)
    (source / "phone" / "a.heic").write_bytes(heic())
    (source / "phone" / "b.AVIF").write_bytes(avif())
    (source / "phone" / "disguised.jpg").write_bytes(heic(photo(seed=3)))
    (source / "phone" / "photo.jpg").write_bytes(encode(photo(seed=7), "JPEG", quality=90))
    result = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(source),
                             "--destination", str(tmp_path / "out"), "--dataset", "d", "--version", "v1",
                             "--max-reject-fraction", "1", "--workers", "1", "--no-modern-formats"],
                            cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / "d" / "v1"
    manifest = json.loads((version / "manifest.json").read_text())
    assert manifest["skipped_by_kind"] == {"modern_format_off": 2}
    assert manifest["params"]["modern_formats"] is False and manifest["num_records"] == 1
    with open(version / "rejects.csv", newline="") as f:
        rejects = list(csv.DictReader(f))
    assert [(r["filename"], r["reason"]) for r in rejects] == [("phone/disguised.jpg", "unsupported_format")]
    assert "turned off" in rejects[0]["detail"]
