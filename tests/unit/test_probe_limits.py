"""Per-image cost is bounded: scans, pages, pixels, memory; and phone JPEGs with secondary images are stored."""

from __future__ import annotations

import io
import random
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords.images.jpeg_markers import MAX_JPEG_SCANS
from image_tfrecords.images.probe import RejectedImage, inspect_image, prepare_image, stored_bytes

ROOT = Path(__file__).resolve().parents[2]


def _photo(size: tuple[int, int], seed: int = 0) -> Any:
    from PIL import Image

    rng = random.Random(seed)
    return Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3))


def _jpeg(image: Any, **options: Any) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", **options)
    return buf.getvalue()


def test_mpo_with_secondary_images_is_stored_as_the_decoders_show_it() -> None:
    import tensorflow as tf

    primary, depth = _photo((64, 48), 1), _photo((32, 24), 2).convert("L").convert("RGB")
    buf = io.BytesIO()
    primary.save(buf, "MPO", save_all=True, append_images=[depth])
    data = buf.getvalue()
    facts, stored = prepare_image(data)
    assert stored == data and (facts.format, facts.width, facts.height, facts.transform) == ("jpeg", 64, 48, "")
    assert tuple(tf.io.decode_image(stored, expand_animations=False).shape) == (48, 64, 3)


def _splice_scans(data: bytes, copies: int) -> bytes:
    """A progressive JPEG with its last scan repeated: a scan-count bomb (the structure is what is tested)."""
    last = data.rfind(b"\xff\xda")
    end = data.rfind(b"\xff\xd9")
    return data[:end] + data[last:end] * copies + data[end:]


def test_a_jpeg_with_too_many_scans_is_rejected_before_decoding() -> None:
    progressive = _jpeg(_photo((256, 256)), progressive=True)
    assert prepare_image(progressive)[0].format == "jpeg"
    bomb = _splice_scans(progressive, 20_000)
    started = time.monotonic()
    with pytest.raises(RejectedImage) as err:
        prepare_image(bomb)
    assert err.value.reason == "too_complex" and f"more than {MAX_JPEG_SCANS}" in err.value.detail
    assert time.monotonic() - started < 10  # a sanity bound: decoding it is what took minutes


def _behind_app(data: bytes, payload: bytes) -> bytes:
    """``data`` with an APP1 segment holding ``payload`` right after SOI."""
    return data[:2] + b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload + data[2:]


def test_a_scan_bomb_behind_an_exif_thumbnail_is_still_counted() -> None:
    """The thumbnail's SOS and EOI sit inside the APP1 payload: they are skipped by the segment's length,
    not taken for the image's own (which hid every scan of the image behind them)."""
    thumbnail = _jpeg(_photo((16, 16), 3))
    bomb = _behind_app(_splice_scans(_jpeg(_photo((256, 256)), progressive=True), 1_000), b"Exif\0\0" + thumbnail)
    with pytest.raises(RejectedImage) as err:
        prepare_image(bomb)
    assert err.value.reason == "too_complex"


def test_scans_are_counted_through_stuffing_restarts_and_fill_bytes() -> None:
    """0xFF00 and RSTn inside scans are data, 0xFF runs before a marker are fill: none of them is a scan,
    and none hides one."""
    progressive = _jpeg(_photo((256, 256), 4), progressive=True, restart_marker_blocks=1)
    assert b"\xff\x00" in progressive and b"\xff\xd0" in progressive
    filled = progressive.replace(b"\xff\xda", b"\xff\xff\xff\xda")
    limit = MAX_JPEG_SCANS - progressive.count(b"\xff\xda")  # copies that keep it at the limit
    assert prepare_image(_splice_scans(filled, limit))[0].format == "jpeg"
    with pytest.raises(RejectedImage) as err:
        prepare_image(_splice_scans(filled, limit + 1))
    assert err.value.reason == "too_complex"


def test_sos_bytes_in_metadata_are_not_scans() -> None:
    data = _behind_app(_jpeg(_photo((64, 48))), b"\xff\xda\x00\x08" * (2 * MAX_JPEG_SCANS))
    assert prepare_image(data)[0].transform == ""


def _tiff(pages: int) -> bytes:
    """A little-endian TIFF of ``pages`` 1x1 grey pages sharing one pixel (Pillow's save_all is quadratic)."""
    tags = [(256, 3, 1), (257, 3, 1), (258, 3, 8), (259, 3, 1), (262, 3, 1), (273, 4, 8), (277, 3, 1), (278, 3, 1),
            (279, 4, 1)]
    size = 2 + 12 * len(tags) + 4
    out = [b"II*\x00", struct.pack("<I", 10), b"\x80\x00"]  # header, first IFD at 10, the pixel at 8
    for page in range(pages):
        entries = b"".join(struct.pack("<HHII", tag, kind, 1, value) for tag, kind, value in tags)
        following = 10 + (page + 1) * size if page + 1 < pages else 0
        out.append(struct.pack("<H", len(tags)) + entries + struct.pack("<I", following))
    return b"".join(out)


def test_a_tiff_with_many_pages_is_rejected_without_counting_them() -> None:
    from PIL import Image

    single = _tiff(1)
    assert Image.open(io.BytesIO(single)).size == (1, 1) and prepare_image(single)[0].transform == "to_png"
    started = time.monotonic()
    with pytest.raises(RejectedImage) as err:
        prepare_image(_tiff(100_000))
    assert err.value.reason == "multi_frame"
    assert time.monotonic() - started < 10  # a sanity bound: counting 20k pages is quadratic


def test_max_pixels_can_be_lowered() -> None:
    data = _jpeg(_photo((100, 80)))
    assert prepare_image(data, max_pixels=8000)[0].width == 100
    with pytest.raises(RejectedImage) as err:
        prepare_image(data, max_pixels=7999)
    assert err.value.reason == "too_many_pixels"


def test_inspect_image_and_stored_bytes_honour_a_lowered_max_pixels() -> None:
    from PIL import Image

    exif = Image.Exif()
    exif[0x0112] = 6
    data = _jpeg(_photo((100, 80)), exif=exif.tobytes())  # rotated: stored_bytes transcodes it again
    facts, encoded = prepare_image(data)
    row = {"transform": facts.transform, "encoded_sha256": facts.encoded_sha256}
    assert inspect_image(data, max_pixels=8000) == facts and stored_bytes(data, row, max_pixels=8000) == encoded
    for call in (lambda: inspect_image(data, max_pixels=7999), lambda: stored_bytes(data, row, max_pixels=7999)):
        with pytest.raises(RejectedImage) as err:
            call()
        assert err.value.reason == "too_many_pixels"


def _png(width: int, height: int, rows: bytes, interlace: int = 0, colour: int = 0) -> bytes:
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    header = struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, interlace)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", rows) + chunk(b"IEND", b"")


def _bomb_idat(width: int, height: int) -> bytes:
    """zlib data of ``height`` all-zero grey rows, compressed a row block at a time (never held whole)."""
    out, comp, block = [], zlib.compressobj(1), b"\0" * ((1 + width) * 64)
    for _ in range(height // 64):
        out.append(comp.compress(block))
    out.append(comp.compress(b"\0" * ((1 + width) * (height % 64))))
    return b"".join(out) + comp.flush()


PEAK_RSS = """
import sys
sys.path.insert(0, sys.argv[1])
from image_tfrecords.images.probe import prepare_image
data = open(sys.argv[2], "rb").read()
facts = prepare_image(data, max_pixels=10**9)[0]
print(facts.width, facts.height, facts.format)
print(next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:")) // 1024)
"""


def test_a_png_that_inflates_to_a_gigabyte_is_checked_in_bounded_memory(tmp_path: Path) -> None:
    width = height = 30_000  # 900 MB of pixels from ~4 MB of zlib data
    path = tmp_path / "bomb.png"
    path.write_bytes(_png(width, height, _bomb_idat(width, height)))
    result = subprocess.run([sys.executable, "-c", PEAK_RSS, str(ROOT), str(path)], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    dims, peak_mb = result.stdout.split("\n")[:2]
    assert dims == f"{width} {height} png"
    print(f"peak RSS inspecting a {path.stat().st_size / 1e6:.1f} MB PNG of {width}x{height}: {peak_mb} MB")
    assert int(peak_mb) < 250, f"peak RSS {peak_mb} MB"


@pytest.mark.parametrize("interlace", [0, 1])
def test_png_streams_are_checked_row_by_row(interlace: int) -> None:
    import tensorflow as tf
    from PIL import Image

    image = _photo((37, 23), 5)
    buf = io.BytesIO()
    image.save(buf, "PNG", **({"interlace": 1} if interlace else {}))  # Pillow ignores interlace: made below
    width, height = 37, 23
    if interlace:
        from image_tfrecords.images.png_stream import _row_layout

        layout = _row_layout(width, height, 24, True)
        raw = b"".join(b"\0" + bytes(stride - 1) for _, stride, rows in layout for _ in range(rows))
    else:
        raw = b"".join(b"\0" + bytes(3 * width) for _ in range(height))
    good = _png(width, height, zlib.compress(raw), interlace, colour=2)
    facts, _ = prepare_image(good)
    assert (facts.width, facts.height, facts.channels) == (37, 23, 3)
    assert tuple(tf.io.decode_image(good).shape) == (23, 37, 3)
    bad_filter = bytearray(raw)
    bad_filter[len(raw) - (1 + 3 * width if not interlace else layout[-1][1])] = 9  # the last row's filter byte
    with pytest.raises(RejectedImage, match="filter type"):
        prepare_image(_png(width, height, zlib.compress(bytes(bad_filter)), interlace, colour=2))
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.io.decode_image(_png(width, height, zlib.compress(bytes(bad_filter)), interlace, colour=2))
    with pytest.raises(RejectedImage, match="holds"):  # one row short
        prepare_image(_png(width, height, zlib.compress(raw[:-10]), interlace, colour=2))
    assert Image.open(io.BytesIO(good)).size == (37, 23)
