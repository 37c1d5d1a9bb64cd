"""Real-world JPEG variants (tests/jpeg_variants.py) against tf.io.decode_image, the reference decoder.

The rule: a file TensorFlow decodes is stored (as is, upright when EXIF says so, CMYK as RGB) and what is
stored decodes with TensorFlow to the probe's dimensions and channels; a file TensorFlow rejects is rejected.

Variants on which the probe disagreed with TensorFlow before this round (TensorFlow decodes them all):

- rejected as ``multi_frame`` before 141e1f6: ``mpo_two_frames``, ``mpo_depth_map`` (Pillow opens MPF files
  as MPO; ``ultra_hdr_gain_map`` passed only because Pillow opens a file with ``hdrgm`` XMP as plain JPEG);
- rejected as ``corrupt`` (Pillow's header parser raises where libjpeg ignores the segment):
  ``short_jfif_app0``, ``short_adobe_app14``, ``short_icc_chunk``, ``tem_marker``;
- rejected as ``too_complex`` from 141e1f6 on: ``app_payload_with_sos_bytes`` (SOS bytes inside an APP
  payload were counted as scans);
- re-encoded for a rotation that does not exist: ``exif_orientation_9``, ``exif_orientation_65535``.

None was accepted that TensorFlow rejects (``missing_eoi*``, ``truncated_scan``, ``twelve_bit_*``,
``two_components``); arithmetic coding is not in the corpus (nothing here can write it).
"""

from __future__ import annotations

import io
import struct
from typing import Any

import pytest

from image_tfrecords.images.probe import RejectedImage, prepare_image
from tests.jpeg_variants import VARIANTS, split, variant

ROTATED = {5, 6, 7, 8}  # orientations that swap width and height


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


def _decode(tf: Any, data: bytes) -> tuple[int, ...] | None:
    try:
        return tuple(tf.io.decode_image(data, expand_animations=False).shape)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        return None


def _expected_transform(name: str) -> str:
    if name in ("cmyk_adobe", "ycck_adobe"):
        return "cmyk_to_rgb"
    orientation = int(name.rsplit("_", 1)[1]) if name.startswith("exif_orientation_") else 1
    return "exif_rotate" if 2 <= orientation <= 8 else ""


@pytest.mark.parametrize("name", VARIANTS)
def test_the_probe_stores_what_tensorflow_decodes(tf: Any, name: str) -> None:
    data = variant(name)
    reference = _decode(tf, data)
    if reference is None:
        with pytest.raises(RejectedImage):
            prepare_image(data)
        return
    try:
        facts, stored = prepare_image(data)
    except RejectedImage as exc:
        pytest.fail(f"TensorFlow decodes {name} to {reference}, the probe rejects it: {exc}")
    assert _decode(tf, stored) == (facts.height, facts.width, facts.channels)
    rotated = name.startswith("exif_orientation_") and int(name.rsplit("_", 1)[1]) in ROTATED
    assert (facts.height, facts.width) == (reference[1::-1] if rotated else reference[:2])
    assert facts.channels == reference[2] and facts.transform == _expected_transform(name)
    assert (stored == data) == (not facts.transform)


def test_the_corpus_is_deterministic() -> None:
    assert all(variant(name) == variant(name) for name in ("huge_app_segments", "mpo_depth_map", "subsampling_440"))


def _sof(data: bytes) -> tuple[int, int, int, list[int]]:
    """(SOF marker, precision, components, sampling bytes) of a JPEG."""
    sof = next(seg for seg in split(data)[0] if seg[1] in (0xC0, 0xC1, 0xC2))
    return sof[1], sof[4], sof[9], [sof[11 + 3 * i] for i in range(sof[9])]


@pytest.mark.parametrize(("name", "marker", "sampling"), [
    ("baseline_jfif", 0xC0, [0x22, 0x11, 0x11]), ("progressive", 0xC2, [0x22, 0x11, 0x11]),
    ("subsampling_444", 0xC0, [0x11] * 3), ("subsampling_422", 0xC0, [0x21, 0x11, 0x11]),
    ("subsampling_440", 0xC0, [0x12, 0x11, 0x11]), ("subsampling_411", 0xC0, [0x41, 0x11, 0x11]),
    ("grayscale", 0xC0, [0x11]), ("sof1_extended_8bit", 0xC1, [0x22, 0x11, 0x11]),
])
def test_variants_have_the_structure_they_are_named_for(name: str, marker: int, sampling: list[int]) -> None:
    assert _sof(variant(name)) == (marker, 8, len(sampling), sampling)


def test_the_flat_encoder_writes_the_colour_it_is_given(tf: Any) -> None:
    """The hand-made bitstreams decode to their flat colour, so their agreement with TensorFlow means something."""
    import numpy as np

    grey = tf.io.decode_image(variant("flat_gray")).numpy()
    assert grey.shape == (45, 67, 1) and np.all(grey == 77)
    rgb = tf.io.decode_image(variant("subsampling_440")).numpy().reshape(-1, 3)
    assert np.all(rgb == rgb[0])  # one colour: every block decoded alike
    assert _sof(variant("twelve_bit_sof1"))[:2] == (0xC1, 12)


def test_metadata_variants_carry_their_segments() -> None:
    from PIL import Image

    def segments(name: str) -> list[bytes]:
        return split(variant(name))[0]

    assert sum(seg[4:16] == b"ICC_PROFILE\0" for seg in segments("icc_multi_chunk")) == 3
    assert sum(0xE3 <= seg[1] <= 0xEF and len(seg) == 65537 for seg in segments("huge_app_segments")) == 24
    assert sum(seg[4:39] == b"http://ns.adobe.com/xmp/extension/\0" for seg in segments("extended_xmp")) == 3
    exif = next(seg for seg in segments("exif_thumbnail") if seg[4:10] == b"Exif\0\0")
    assert b"\xff\xd8\xff" in exif and exif.count(b"\xff\xda") == 1  # an embedded JPEG thumbnail
    for name in ("mpo_two_frames", "mpo_depth_map"):
        image = Image.open(io.BytesIO(variant(name)))
        assert (image.format, image.n_frames) == ("MPO", 2)
    assert b"\xff\xd0" in variant("restart_every_block") and b"\xff\xdd" in variant("restart_every_block")
    assert struct.unpack(">H", variant("exif_orientation_65535").split(b"\x01\x12\x00\x03")[1][4:6])[0] == 65535
