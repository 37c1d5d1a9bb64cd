"""Real-world JPEG variants (tests/real_world_jpegs.py) against tf.io.decode_image, the reference decoder.

The rule: whatever TensorFlow decodes is stored (byte for byte, or upright when EXIF says so), and what is
stored always decodes with TensorFlow to the dimensions the probe reports; what TensorFlow cannot decode is
rejected, or transcoded into something it decodes (CMYK). Before this test, MPO files (phones' depth maps,
cameras' previews: ``mpo_depth_map``, ``mpo_two_secondaries``) were rejected as ``multi_frame``, and EXIF
orientations outside 1-8 (``exif_orientation_9``, ``_65535``) were re-encoded for a rotation that does not exist.
"""

from __future__ import annotations

from typing import Any

import pytest

from include.image_tfrecords.probe import RejectedImage, prepare_image
from tests.real_world_jpegs import variants

VARIANTS = variants()
ROTATED = {5, 6, 7, 8}  # orientations that swap width and height


@pytest.fixture(scope="module")
def tf() -> Any:
    import tensorflow

    return tensorflow


def _tf_decode(tf: Any, data: bytes) -> tuple[int, ...] | None:
    try:
        return tuple(tf.io.decode_image(data, expand_animations=False).shape)
    except (tf.errors.InvalidArgumentError, tf.errors.UnknownError):
        return None


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_probe_stores_what_tensorflow_decodes(name: str, tf: Any) -> None:
    data = VARIANTS[name]
    reference = _tf_decode(tf, data)
    try:
        facts, stored = prepare_image(data)
    except RejectedImage as exc:
        assert reference is None, f"{name}: TensorFlow decodes it {reference} but the probe rejects it: {exc}"
        return
    shape = _tf_decode(tf, stored)
    assert shape == (facts.height, facts.width, facts.channels), f"{name}: stored bytes decode to {shape}"
    if reference is None:  # only a transcode may make decodable what TensorFlow could not read
        assert facts.transform, f"{name}: stored as is, but TensorFlow cannot decode it"
        return
    orientation = int(name.rsplit("_", 1)[1]) if name.startswith("exif_orientation_") else 1
    upright = (reference[1], reference[0]) if orientation in ROTATED else reference[:2]
    assert (facts.height, facts.width) == upright, name
    if name.startswith("cmyk"):  # decoders disagree on Adobe's inverted CMYK: always converted to RGB
        assert facts.transform == "cmyk_to_rgb" and facts.channels == 3
    elif facts.transform:
        assert facts.transform == "exif_rotate" and orientation in range(2, 9), f"{name}: {facts.transform}"
    else:
        assert stored == data, name


def test_the_corpus_covers_what_the_issue_names() -> None:
    for kind in ("exif_with_thumbnail", "xmp", "icc_profile_3_chunks", "mpo_depth_map", "ultra_hdr_like_gain_map",
                 "trailing_second_jpeg", "trailing_samsung_sefh", "photoshop_iptc", "fill_bytes_before_markers",
                 "restart_intervals", "progressive", "missing_eoi", "truncated_mid_scan"):
        assert kind in VARIANTS
