"""The card's pass over labels.csv takes rows in batches (``LabelScan.of``): what it learns does not depend on
the batches, and a pass made before the manifest exists (``scan_labels``, which the command line runs beside
the shards' writing) is used only for the manifest it assumed."""

from __future__ import annotations

import random

import pytest

from image_tfrecords.card.quality import QualityScan
from image_tfrecords.card.sections import build_card, scan_labels
from image_tfrecords.card.stats import LabelScan, SamplePicker
from image_tfrecords.images.quality import FLAGS
from tests.pipeline.test_card import REJECTS, make_dataset, make_manifest

Row = dict[str, str]


def _rows(count: int, seed: int = 5) -> tuple[list[Row], list[list[tuple[int, str]]]]:
    """Rows with signals (some unmeasured, some flagged) and their classes, one of them past ``max_classes``."""
    rng = random.Random(seed)
    rows, classes = [], []
    for number in range(count):
        cid = rng.choice([0, 1, 2, 7])
        row = {"filename": f"c{cid}/{number:04d}.jpg", "sha256": f"{rng.getrandbits(256):064x}", "label": f"c{cid}",
               "label_id": str(cid), "split": rng.choice(["train", "test"])}
        if rng.random() < 0.1:  # not measured
            row |= dict.fromkeys(("brightness", "contrast", "sharpness", "colourfulness", "width", "height"), "")
        else:
            row |= {"brightness": f"{rng.uniform(0, 255):.2f}", "contrast": f"{rng.uniform(0, 90):.2f}",
                    "sharpness": f"{rng.uniform(0, 3):.3f}", "colourfulness": f"{rng.uniform(0, 120):.2f}",
                    "width": str(rng.randrange(16, 4000)), "height": str(rng.randrange(16, 4000))}
        row["quality"] = "|".join(sorted(rng.sample(FLAGS, rng.choice([0, 0, 0, 1, 2]))))
        rows.append(row)
        classes.append([(cid, f"c{cid}")])
    return rows, classes


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_quality_in_batches_is_quality_row_by_row(size: int) -> None:
    rows, classes = _rows(500)
    one_by_one, batched = QualityScan(max_classes=5), QualityScan(max_classes=5)
    for row, these in zip(rows, classes, strict=True):
        one_by_one.offer(row, these)
    for start in range(0, len(rows), size):
        batched.offer_batch(rows[start:start + size], classes[start:start + size])
    assert batched.unmeasured == one_by_one.unmeasured > 0
    assert batched.flags == one_by_one.flags and sum(batched.flags.values()) > 0
    assert sorted(batched.classes) == sorted(one_by_one.classes) == [0, 1, 2]  # 7 is past max_classes
    for cid, (name, stats) in one_by_one.classes.items():
        other = batched.classes[cid][1]
        assert (batched.classes[cid][0], other.records, other.flags) == (name, stats.records, stats.flags)
        assert other.sums == pytest.approx(stats.sums, rel=1e-12)
    assert {flag: sorted(heap, key=lambda item: item[:2]) for flag, heap in batched.worst.items()} == \
        {flag: sorted(heap, key=lambda item: item[:2]) for flag, heap in one_by_one.worst.items()}


def test_samples_do_not_depend_on_the_batches_or_the_order_of_rows() -> None:
    rows, classes = _rows(300)
    picked = []
    for seed, size in ((0, 1), (1, 13), (2, 300)):
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        picker = SamplePicker(max_classes=2, keep=3)
        for start in range(0, len(order), size):
            chunk = order[start:start + size]
            picker.offer_batch([rows[i] for i in chunk], [classes[i] for i in chunk])
        picked.append({cid: [row["filename"] for _, row in picks.items] for cid, picks in picker.by_class.items()})
    assert picked[0] == picked[1] == picked[2]
    assert sorted(picked[0]) == [0, 1]  # the two smallest ids
    smallest = sorted((row["sha256"], row["filename"]) for row, these in zip(*_rows(300), strict=True)
                      if these[0][0] == 0)[:3]
    assert picked[0][0] == [name for _, name in smallest]


def test_a_pass_made_beforehand_is_used_for_the_manifest_it_assumed_only() -> None:
    rows, images = make_dataset({"cats": 9, "dogs": 7})
    manifest = make_manifest(rows, ["cats", "dogs"])

    def card(facts: object = None) -> dict[str, bytes]:
        return build_card(manifest, lambda: iter(rows), lambda: iter(REJECTS), None,
                          lambda row: images.get(row["filename"]), labels_sha256="a" * 64, facts=facts)

    fresh = card()
    assert card(scan_labels(None, 2, lambda: iter(rows), lambda: iter(REJECTS), None)) == fresh
    fewer = rows[1:]  # a pass over other rows, assuming this manifest: the card shows what it learnt
    shown = card(scan_labels(None, 2, lambda: iter(fewer), lambda: iter(REJECTS), None))
    assert shown != fresh and LabelScan.load(shown["card/labels-scan.bin"], "a" * 64).records.total() == len(fewer)
    for assumed in ((None, 3), ("|", 2)):  # assumed another manifest: passed over, the rows scanned again
        assert card(scan_labels(*assumed, lambda: iter(fewer), lambda: iter(REJECTS), None)) == fresh
