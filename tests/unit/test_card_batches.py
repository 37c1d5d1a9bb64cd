"""What the sample picker keeps does not depend on the batches it is offered or the order of the rows (the card's
pass offers it only each class's few smallest rows: ``card.label_table``), and a pass made before the manifest
exists (``scan_labels``, which the command line runs beside the shards' writing) is used only for the manifest it
assumed. tests/unit/test_card_table.py checks the pass itself against the rows one by one."""

from __future__ import annotations

import random

from image_tfrecords.card.sections import build_card, scan_labels
from image_tfrecords.card.stats import SamplePicker
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
                          lambda row: images.get(row["filename"]), facts=facts)

    fresh = card()
    assert card(scan_labels(None, 2, lambda: iter(rows), lambda: iter(REJECTS), None)) == fresh
    fewer = rows[1:]  # a pass over other rows, assuming this manifest: the card shows what it learnt
    shown = card(scan_labels(None, 2, lambda: iter(fewer), lambda: iter(REJECTS), None))
    assert shown != fresh and shown == build_card(manifest, lambda: iter(fewer), lambda: iter(REJECTS), None,
                                                  lambda row: images.get(row["filename"]))
    for assumed in ((None, 3), ("|", 2)):  # assumed another manifest: passed over, the rows scanned again
        assert card(scan_labels(*assumed, lambda: iter(fewer), lambda: iter(REJECTS), None)) == fresh
