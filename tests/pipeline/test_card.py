"""The dataset card renderer: tables that match the inputs, deterministic PNGs, a self-contained HTML,
the sample choice, the diff against the previous version, escaping, and a card for a real CLI build."""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import random
import re
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from PIL import Image, ImageDraw

from image_tfrecords.card import render as card_render
from image_tfrecords.card.sections import PreviousVersion, build_card
from image_tfrecords.records.schema import LABELS_FIELDS, feature_spec
from tests.support import run_cli

Row = dict[str, str]
SHARD_BYTES = {"train": [1_000_000, 1_200_000, 900_000], "test": [500_000]}


# -- helpers -----------------------------------------------------------------------------------------
def make_image(seed: int, fmt: str = "PNG", size: tuple[int, int] = (64, 48)) -> bytes:
    rng = random.Random(seed)
    image = Image.new("RGB", size, tuple(rng.randrange(256) for _ in range(3)))
    ImageDraw.Draw(image).rectangle((8, 8, 30, 30), fill=tuple(rng.randrange(256) for _ in range(3)))
    buf = io.BytesIO()
    image.save(buf, fmt)
    return buf.getvalue()


def label_row(filename: str, label: str, label_id: int, split: str, data: bytes) -> Row:
    row = dict.fromkeys(LABELS_FIELDS, "")
    sha = hashlib.sha256(data).hexdigest()
    row.update(filename=filename, label=label, label_id=str(label_id), split=split, sha256=sha, width="64",
               height="48", channels="3", format="png", num_bytes=str(len(data)), source_format="png",
               encoded_sha256=sha, encoded_bytes=str(len(data)))
    return row


def make_dataset(per_class: dict[str, int], classes: list[str] | None = None) -> tuple[list[Row], dict[str, bytes]]:
    """Rows and images: every third image of a class is in test, the others in train."""
    classes = classes or list(per_class)
    rows, images = [], {}
    for name, count in per_class.items():
        for i in range(count):
            filename = f"{name}/{i:03d}.png"
            images[filename] = make_image(len(images))
            rows.append(label_row(filename, name, classes.index(name), "test" if i % 3 == 0 else "train",
                                  images[filename]))
    return rows, images


def make_manifest(rows: list[Row], classes: list[str], version: str = "v2", **extra: Any) -> dict[str, Any]:
    per_split = Counter(r["split"] for r in rows)
    splits = {}
    for split, sizes in SHARD_BYTES.items():
        counts = [per_split[split] // len(sizes) + (i < per_split[split] % len(sizes)) for i in range(len(sizes))]
        splits[split] = {"num_records": per_split[split], "shards": [
            {"file": f"{split}-{i:05d}-of-{len(sizes):05d}.tfrecord", "num_records": n, "num_bytes": b, "sha256": "0"}
            for i, (n, b) in enumerate(zip(counts, sizes, strict=True))]}
    return {"dataset": "pets", "version": version, "num_records": len(rows), "num_rejected": 2, "num_skipped": 1,
            "rejects_by_reason": {"corrupt": 1, "duplicate": 1}, "classes": classes, "previous_version": None,
            "source_fingerprint": "f" * 64, "as_of": "2026-11-22T02:00:00+00:00", "compression": "none",
            "features": feature_spec(), "splits": splits, "source": "s3://raw/pets",
            "params": {"splits": {"test": 0.3, "train": 0.7}, "salt": "s1", "shard_size_mb": 1}} | extra


REJECTS = [{"filename": "cats/bad.jpg", "reason": "corrupt", "detail": "truncated"},
           {"filename": "dogs/copy.png", "reason": "duplicate", "detail": "same as dogs/000.png"}]


def render(manifest: dict[str, Any], rows: list[Row], images: dict[str, bytes], rejects: list[Row] = REJECTS,
           previous: PreviousVersion | None = None,
           fetch: Callable[[Row], bytes | None] | None = None) -> dict[str, bytes]:
    return build_card(manifest, lambda: iter(rows), lambda: iter(rejects), previous,
                      fetch or (lambda row: images.get(row["filename"])))


def md_table(md: str, heading: str, nth: int = 0) -> tuple[list[str], list[list[str]]]:
    """(header, body rows) of the ``nth`` Markdown table after the line ``heading``, cells unescaped."""
    lines = md.split("\n")
    i = lines.index(heading)
    tables: list[list[list[str]]] = []
    while i < len(lines) and not (lines[i].startswith("## ") and lines[i] != heading):
        if lines[i].startswith("|") and (not tables or not lines[i - 1].startswith("|")):
            tables.append([])
        if lines[i].startswith("|"):
            cells = re.split(r"(?<!\\)\|", lines[i])[1:-1]
            tables[-1].append([re.sub(r"\\(.)", r"\1", c.strip()) for c in cells])
        i += 1
    table = tables[nth]
    return table[0], table[2:]


def number(text: str) -> int:
    return int(text.replace(",", ""))


def md_images(md: str) -> list[str]:
    return re.findall(r"!\[[^\]]*\]\((card/[^)]+\.png)\)", md)


class TagCollector(HTMLParser):
    """Every start tag of a page with its attributes, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))


def assert_self_contained(out: dict[str, bytes]) -> None:
    md, page = out["card.md"].decode(), out["card.html"].decode()
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|link|iframe|object|embed)\b|@import|url\(", page, re.I)
    parser = TagCollector()
    parser.feed(page)
    assert {tag for tag, _ in parser.tags} <= {"html", "head", "meta", "title", "style", "body", "main", "h1", "h2",
                                               "h3", "p", "table", "thead", "tbody", "tr", "th", "td", "img"}
    targets = [value or "" for _, attrs in parser.tags for name, value in attrs if name in ("src", "href")]
    assert targets and all(t.startswith("data:image/png;base64,") for t in targets)
    referenced = md_images(md)
    assert referenced and sorted(set(referenced)) == sorted(k for k in out if k.endswith(".png"))
    for path in referenced:
        assert f"data:image/png;base64,{base64.b64encode(out[path]).decode()}\"" in page


def decode_png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    image.load()
    return image


# -- unit tests --------------------------------------------------------------------------------------
CLASSES = ["cats", "dogs", "owls"]  # owls: a class that has no records in this version


def test_tables_match_the_inputs_and_pngs_decode() -> None:
    rows, images = make_dataset({"cats": 9, "dogs": 7}, CLASSES)
    manifest = make_manifest(rows, CLASSES)
    out = render(manifest, rows, images)
    md = out["card.md"].decode()

    _, header = md_table(md, "# Dataset card: pets v2")
    fields = dict(header)
    assert fields["Records"] == "16" and fields["Rejected"] == "2" and fields["Skipped (not images)"] == "1"
    assert fields["Created from"] == "s3://raw/pets" and fields["As of"] == "2026-11-22T02:00:00+00:00"
    assert fields["Classes"] == "3: cats, dogs, owls" and fields["Compression"] == "none"

    head, body = md_table(md, "## Records per split and class")
    assert head == ["id", "class", "train", "test", "total"]
    expected = Counter((r["label"], r["split"]) for r in rows)
    for cid, name, train, test, total in body[:-1]:
        assert CLASSES[int(cid)] == name
        assert (number(train), number(test)) == (expected[name, "train"], expected[name, "test"])
        assert number(total) == expected[name, "train"] + expected[name, "test"]
    assert [r[1] for r in body] == ["cats", "dogs", "owls", "total"]
    assert body[-1][2:] == ["10", "6", "16"]

    _, reasons = md_table(md, "## Rejects")
    assert reasons == [["corrupt", "1"], ["duplicate", "1"], ["total", "2"]]
    _, examples = md_table(md, "## Rejects", nth=1)
    assert examples == [["cats/bad.jpg", "corrupt", "truncated"],
                        ["dogs/copy.png", "duplicate", "same as dogs/000.png"]]

    _, shards = md_table(md, "## Shards")
    assert shards == [["train", "3", "10", "3.10", "0.90", "1.00", "1.20"], ["test", "1", "6", "0.50", "0.50", "0.50",
                                                                             "0.50"]]
    assert "This is the first version of the dataset" in md
    _, params = md_table(md, "## Parameters")
    assert dict(params)["splits"] == "train=0.7, test=0.3" and dict(params)["salt"] == "'s1'"
    assert dict(params)["source fingerprint"] == "f" * 64
    _, features = md_table(md, "## Features")
    assert [f[:2] for f in features] == [[k, v["dtype"]] for k, v in feature_spec().items()]

    assert sorted(k for k in out if k.endswith(".png")) == [
        "card/records.png", "card/samples/class-00000.png", "card/samples/class-00001.png", "card/shards.png"]
    records, shard_chart = decode_png(out["card/records.png"]), decode_png(out["card/shards.png"])
    assert records.width == 800 and 150 <= records.height <= 1800
    assert shard_chart.size == (800, 354)
    strip = decode_png(out["card/samples/class-00000.png"])
    assert strip.size == (4 + 6 * 100, 104)
    assert_self_contained(out)


def test_output_is_deterministic_and_independent_of_row_order() -> None:
    rows, images = make_dataset({"cats": 9, "dogs": 7}, CLASSES)
    manifest = make_manifest(rows, CLASSES)
    previous = PreviousVersion(make_manifest(rows[:5], CLASSES, "v1"), lambda: iter(rows[:5]))
    first = render(manifest, rows, images, previous=previous)
    shuffled, rejects = rows[:], REJECTS[::-1]
    random.Random(1).shuffle(shuffled)
    again = render(manifest, shuffled, images, rejects, previous=previous)
    assert again == first
    assert render(manifest, rows, images, previous=previous) == first


def test_samples_are_the_smallest_sha_rows_of_each_class() -> None:
    rows, images = make_dataset({"cats": 9, "dogs": 7}, CLASSES)
    fetched: list[str] = []

    def fetch(row: Row) -> bytes:
        fetched.append(row["filename"])
        return images[row["filename"]]

    out = render(make_manifest(rows, CLASSES), rows, images, fetch=fetch)
    expected = {name: [r["filename"] for r in sorted((r for r in rows if r["label"] == name),
                                                     key=lambda r: r["sha256"])[:6]] for name in ("cats", "dogs")}
    assert fetched == expected["cats"] + expected["dogs"]
    for cid, name in enumerate(("cats", "dogs")):
        thumbs = [card_render.thumbnail(images[f]) for f in expected[name]]
        assert out[f"card/samples/class-{cid:05d}.png"] == card_render.thumbnail_strip(thumbs)


def test_missing_or_undecodable_images_are_skipped() -> None:
    rows, images = make_dataset({"cats": 9, "dogs": 7}, CLASSES)
    cats = [r["filename"] for r in sorted((r for r in rows if r["label"] == "cats"), key=lambda r: r["sha256"])]
    images[cats[1]] = b"not an image at all"

    def fetch(row: Row) -> bytes | None:
        return None if row["label"] == "dogs" or row["filename"] == cats[0] else images[row["filename"]]

    out = render(make_manifest(rows, CLASSES), rows, images, fetch=fetch)
    thumbs = [card_render.thumbnail(images[f]) for f in cats[2:8]]
    assert out["card/samples/class-00000.png"] == card_render.thumbnail_strip(thumbs)
    assert "card/samples/class-00001.png" not in out
    _, samples = md_table(out["card.md"].decode(), "## Samples")
    assert samples[1] == ["1", "dogs", "no image available"]
    assert_self_contained(out)


def test_many_classes_are_capped_in_the_grid_and_chart() -> None:
    names = [f"class{i:03d}" for i in range(55)]
    rows, images = make_dataset(dict.fromkeys(names, 1), names)
    tiny = {f: make_image(i, size=(8, 8)) for i, f in enumerate(images)}
    out = render(make_manifest(rows, names), rows, tiny)
    md = out["card.md"].decode()
    assert "Showing the first 50 classes by id of the 55 classes with records." in md
    assert sorted(k for k in out if k.startswith("card/samples/")) == [
        f"card/samples/class-{i:05d}.png" for i in range(50)]
    assert len(md_table(md, "## Records per split and class")[1]) == 56
    assert "first 50 of 55 classes by id" in md
    assert 800 <= decode_png(out["card/records.png"]).height <= 1800


def test_diff_against_the_previous_version() -> None:
    classes = ["cats", "ferrets", "dogs"]
    rows, images = make_dataset({"cats": 9, "dogs": 7}, classes)
    old_rows, _ = make_dataset({"cats": 9, "ferrets": 12}, classes)
    changed = next(r for r in old_rows if r["filename"] == "cats/002.png")
    changed["sha256"] = "0" * 64  # same name, other content
    previous = PreviousVersion(make_manifest(old_rows, classes[:2], "v1"), lambda: iter(old_rows))
    out = render(make_manifest(rows, classes, previous_version="v1"), rows, images, previous=previous)
    md = out["card.md"].decode()
    assert "Compared with version v1: -5 records." in md
    _, changes = md_table(md, "## Changes since the previous version")
    got = {change: (number(count), examples) for change, count, examples in changes}
    assert got["images added"] == (7, ", ".join(f"dogs/{i:03d}.png" for i in range(7)))
    assert got["images removed"] == (12, ", ".join(f"ferrets/{i:03d}.png" for i in range(10)))
    assert got["images changed"] == (1, "cats/002.png")
    assert got["classes added"] == (1, "dogs") and got["classes removed"] == (1, "ferrets")
    _, per_split = md_table(md, "## Changes since the previous version", nth=1)
    old_split = Counter(r["split"] for r in old_rows)
    assert per_split[-1] == ["total", "21", "16", "-5"]
    assert per_split[0] == ["train", str(old_split["train"]), "10", f"{10 - old_split['train']:+d}"]
    unchanged = render(make_manifest(rows, classes), rows, images,
                       previous=PreviousVersion(make_manifest(rows, classes, "v1"), lambda: iter(rows)))
    _, none = md_table(unchanged["card.md"].decode(), "## Changes since the previous version")
    assert [(c, n, e) for c, n, e in none] == [(c, "0", "") for c, _, _ in none]


def test_strings_from_the_data_are_escaped() -> None:
    evil_class = "<script>alert(1)</script>"
    evil_file = "x/<script>alert('f')</script>|*_b_*[l](http://e.x).png"
    rows, images = make_dataset({"cats": 2}, ["cats", evil_class])
    data = make_image(5)
    rows.append(label_row(evil_file, evil_class, 1, "train", data))
    images[evil_file] = data
    rejects = [{"filename": "<img src=x onerror=alert(1)>.jpg", "reason": "corrupt|<b>", "detail": "a|b\nc & d"}]
    manifest = make_manifest(rows, ["cats", evil_class], params={"splits": {"train": 0.7, "test": 0.3},
                                                                  "salt": "<b>salt</b>", "shard_size_mb": 1})
    out = render(manifest, rows, images, rejects, previous=PreviousVersion(
        make_manifest(rows[:1], ["cats"], "v1"), lambda: iter(rows[:1])))
    md, page = out["card.md"].decode(), out["card.html"].decode()
    assert "<script" not in page.lower() and "<img src=x" not in page and "<b>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "&lt;b&gt;salt&lt;/b&gt;" in page
    unmarked = re.sub(r"<!-- (end of )?section [a-z-]+ -->", "", md)  # the card's own section markers
    assert not re.search(r"(?<!\\)[<>]", unmarked), "every < and > from the data is backslash-escaped"
    assert "http:" not in md and "\\[l\\](http\\://e.x)" in md  # no link, no autolink
    assert "\\<script\\>alert(1)\\</script\\>" in md
    for block in md.split("\n\n"):  # every table row keeps its columns: no pipe or newline breaks out
        lines = block.strip("\n").split("\n")
        if lines[0].startswith("|"):
            assert all(line.startswith("|") for line in lines)
            assert len({len(re.split(r"(?<!\\)\|", line)) for line in lines}) == 1, block
    _, records = md_table(md, "## Records per split and class")
    assert records[1][1] == evil_class
    _, examples = md_table(md, "## Rejects", nth=1)
    assert examples == [["<img src=x onerror=alert(1)>.jpg", "corrupt|<b>", "a|b c & d"]]
    _, changes = md_table(md, "## Changes since the previous version")
    assert evil_file in changes[0][2]
    assert_self_contained(out)


# -- multi-label datasets and the build options ------------------------------------------------------
ML_CLASSES = ["cats", "dogs", "owls", "yaks"]  # yaks: no records
ML_RECORDS = [  # (filename, classes, split)
    ("a.png", ["cats"], "train"), ("b.png", ["cats", "dogs"], "train"), ("c.png", ["cats", "dogs"], "test"),
    ("d.png", ["cats", "dogs", "owls"], "train"), ("e.png", ["dogs", "owls"], "test"), ("f.png", ["owls"], "train"),
    ("g.png", ["cats", "dogs"], "train"), ("h.png", ["owls", "cats"], "test"),
]


def multi_label_rows(records: list[tuple[str, list[str], str]] = ML_RECORDS, classes: list[str] = ML_CLASSES,
                     sep: str = "|") -> tuple[list[Row], dict[str, bytes]]:
    """labels.csv rows as a multi-label build writes them: sorted names joined by ``sep``, ids in that order."""
    rows, images = [], {}
    for i, (filename, names, split) in enumerate(records):
        images[filename] = make_image(100 + i)
        names = sorted(set(names))
        row = label_row(filename, sep.join(names), 0, split, images[filename])
        row["label_id"] = sep.join(str(classes.index(n)) for n in names)
        rows.append(row)
    return rows, images


def multi_label_manifest(rows: list[Row], sep: str = "|", **extra: Any) -> dict[str, Any]:
    features = feature_spec()
    features["image/class/label"]["shape"] = features["image/class/text"]["shape"] = [None]
    return make_manifest(rows, ML_CLASSES, multi_label=True, label_separator=sep, features=features) | extra


@pytest.mark.parametrize("sep", ["|", ";"])
def test_multi_label_counts_each_class_of_a_record(sep: str) -> None:
    rows, images = multi_label_rows(sep=sep)
    out = render(multi_label_manifest(rows, sep), rows, images)
    md = out["card.md"].decode()
    _, header = md_table(md, "# Dataset card: pets v2")
    assert dict(header)["Labels"].startswith("multi-label")

    head, body = md_table(md, "## Records per split and class")
    assert head == ["id", "class", "train", "test", "total"]
    expected = Counter((name, split) for _, names, split in ML_RECORDS for name in names)
    assert {name: (number(train), number(test)) for _, name, train, test, _ in body[:-2]} == {
        name: (expected[name, "train"], expected[name, "test"]) for name in ML_CLASSES}
    assert dict((r[1], r[2:]) for r in body)["cats"] == ["4", "2", "6"]  # a, b, d, g; c, h
    assert body[-2] == ["", "class labels", "9", "6", "15"]
    assert body[-1] == ["", "records", "5", "3", "8"]  # the manifest's counts: no warning
    assert "Warning" not in md

    head, sizes = md_table(md, "## Classes per record")
    assert head == ["classes", "train", "test", "total"]
    assert sizes == [["1", "2", "0", "2"], ["2", "2", "3", "5"], ["3+", "1", "0", "1"],
                     ["mean", "1.80", "2.00", "1.88"]]
    assert "the most classes on one record: 3." in md

    head, pairs = md_table(md, "## Classes found together")
    assert head == ["id", "class", "id", "class", "records", "share"]
    assert pairs == [["0", "cats", "1", "dogs", "4", "80.0%"],  # b, c, d, g; dogs: 5 records
                     ["0", "cats", "2", "owls", "2", "50.0%"],  # d, h
                     ["1", "dogs", "2", "owls", "2", "50.0%"]]  # d, e

    # samples by class id: a record shows under each of its classes, named by the class (not "cats|dogs")
    _, samples = md_table(md, "## Samples")
    assert [s[:2] for s in samples] == [["0", "cats"], ["1", "dogs"], ["2", "owls"]]
    for cid, name in enumerate(ML_CLASSES[:3]):
        with_class = sorted((r for r, (_, names, _) in zip(rows, ML_RECORDS, strict=True) if name in names),
                            key=lambda r: r["sha256"])
        thumbs = [card_render.thumbnail(images[r["filename"]]) for r in with_class[:6]]
        assert out[f"card/samples/class-{cid:05d}.png"] == card_render.thumbnail_strip(thumbs)
    decode_png(out["card/records.png"])
    reversed_rows = render(multi_label_manifest(rows, sep), rows[::-1], images)  # independent of the row order
    assert reversed_rows == out
    assert_self_contained(out)


def test_multi_label_top_pairs_and_label_set_sizes() -> None:
    classes = [f"c{i}" for i in range(8)]
    records = [(f"{i:03d}.png", [classes[j] for j in range(8) if (i >> j) & 1], "train") for i in range(1, 256)]
    rows, images = multi_label_rows(records, classes)
    manifest = make_manifest(rows, classes, multi_label=True, label_separator="|")
    md = render(manifest, rows, images)["card.md"].decode()
    _, pairs = md_table(md, "## Classes found together")
    assert len(pairs) == 20  # top 20 of the 28 pairs, each on 64 of the 255 records: ties by id
    assert [(p[1], p[3], p[4]) for p in pairs[:8]] == [("c0", f"c{j}", "64") for j in range(1, 8)] + [
        ("c1", "c2", "64")]
    _, sizes = md_table(md, "## Classes per record")
    assert sizes[:3] == [["1", "8", "0", "8"], ["2", "28", "0", "28"], ["3+", "219", "0", "219"]]


def test_pairs_among_the_most_frequent_classes_when_there_are_many(monkeypatch: pytest.MonkeyPatch) -> None:
    from image_tfrecords.card import sections as card

    monkeypatch.setattr(card, "PAIR_CLASSES", 2)
    rows, images = multi_label_rows()  # cats 6, dogs 5, owls 4 records
    md = render(multi_label_manifest(rows), rows, images)["card.md"].decode()
    _, pairs = md_table(md, "## Classes found together")
    assert pairs == [["0", "cats", "1", "dogs", "4", "80.0%"]]
    assert "counted among the 2 classes with the most records: a pair with another class is on at most 4" in md


def test_single_label_cards_have_no_multi_label_sections() -> None:
    rows, images = make_dataset({"cats": 4, "dogs|owls": 3}, ["cats", "dogs|owls"])  # a "|" in a class name
    md = render(make_manifest(rows, ["cats", "dogs|owls"]), rows, images)["card.md"].decode()
    assert "## Classes per record" not in md and "## Classes found together" not in md
    _, body = md_table(md, "## Records per split and class")
    assert [r[1] for r in body] == ["cats", "dogs|owls", "total"]
    assert "Labels" not in dict(md_table(md, "# Dataset card: pets v2")[1])


def test_multi_label_diff_counts_records_and_relabelled_images() -> None:
    rows, images = multi_label_rows()
    old_records = [(f, ["cats"] if f == "b.png" else names, s) for f, names, s in ML_RECORDS if f != "h.png"]
    old_rows, _ = multi_label_rows(old_records)
    previous = PreviousVersion(multi_label_manifest(old_rows, version="v1"), lambda: iter(old_rows))
    out = render(multi_label_manifest(rows, previous_version="v1"), rows, images, previous=previous)
    md = out["card.md"].decode()
    _, changes = md_table(md, "## Changes since the previous version")
    got = {change: (number(count), examples) for change, count, examples in changes}
    assert got["images added"] == (1, "h.png") and got["images removed"] == (0, "")
    assert got["images changed"] == (0, "") and got["images relabelled"] == (1, "b.png")
    _, per_split = md_table(md, "## Changes since the previous version", nth=1)
    assert per_split == [["train", "5", "5", "+0"], ["test", "2", "3", "+1"], ["total", "7", "8", "+1"]]
    # from a single-label version: a record whose one class is still its only class is not relabelled
    single = [dict(r, label=r["label"].split("|")[0], label_id=r["label_id"].split("|")[0]) for r in rows]
    previous = PreviousVersion(make_manifest(single, ML_CLASSES, "v1"), lambda: iter(single))
    got = {c: number(n) for c, n, _ in md_table(render(multi_label_manifest(rows), rows, images, previous=previous)[
        "card.md"].decode(), "## Changes since the previous version")[1]}
    assert got["images relabelled"] == 6  # b, c, d, e, g and h gained classes; a and f did not
    assert_self_contained(out)


def test_image_options_labels_and_columns_are_listed() -> None:
    rows, images = multi_label_rows()
    features = feature_spec()
    del features["image/encoded"]
    features |= {"image/raw": {"dtype": "string", "shape": []}, "image/shape": {"dtype": "int64", "shape": [3]},
                 "caption": {"dtype": "string", "shape": []}, "weight": {"dtype": "float", "shape": []},
                 "tags": {"dtype": "string", "shape": [None]}}
    features["image/class/label"]["shape"] = features["image/class/text"]["shape"] = [None]
    manifest = multi_label_manifest(rows, features=features, columns={
        "caption": "string", "weight": "float", "tags": "string_list"}, image={
        "resize": "224x160", "fit": "pad", "upscale": True, "encoding": "raw", "jpeg_quality": 90, "channels": 0,
        "filter": "lanczos"})
    md = render(manifest, rows, images)["card.md"].decode()
    _, options = md_table(md, "### Images")
    got = dict(options)
    assert list(got) == ["resize", "fit", "upscale", "encoding", "jpeg_quality", "channels", "filter"]
    assert got["resize"] == "224x160 (224 px wide, 160 px high)" and got["fit"].startswith("pad (")
    assert got["upscale"].startswith("yes") and got["encoding"].startswith("raw (")
    assert got["jpeg_quality"] == "90 (not used)" and got["channels"] == "0 (3 for raw: RGB)"
    assert got["filter"] == "lanczos"
    _, labels = md_table(md, "### Labels")
    assert dict(labels)["labels"].startswith("multi-label") and dict(labels)["label separator"] == "'|'"
    _, columns = md_table(md, "### Metadata columns")
    assert columns == [["caption", "string", "string", "[]"], ["weight", "float", "float", "[]"],
                       ["tags", "string_list", "string", "[variable length]"]]
    shapes = {key: shape for key, _, shape in md_table(md, "## Features")[1]}
    assert shapes["image/class/label"] == "[variable length]" and shapes["image/shape"] == "[3]"
    assert shapes["image/height"] == "[]" and "image/encoded" not in shapes

    jpeg = dict(md_table(render(manifest | {"image": {"resize": "longest:512", "encoding": "jpeg", "channels": 3}},
                                rows, images)["card.md"].decode(), "### Images")[1])
    assert jpeg["resize"] == "longest:512 (longest side 512 px)" and jpeg["encoding"].startswith("jpeg (")
    assert jpeg["fit"] == "crop (used only with a WxH resize)" and jpeg["channels"] == "3 (RGB)"
    assert jpeg["jpeg_quality"] == "95" and jpeg["upscale"].startswith("no")


def test_a_manifest_from_before_the_options_shows_the_defaults() -> None:
    rows, images = make_dataset({"cats": 3}, CLASSES)
    md = render(make_manifest(rows, CLASSES), rows, images)["card.md"].decode()
    assert "The manifest records no image options" in md
    got = dict(md_table(md, "### Images")[1])
    assert got["resize"] == "none (original size)" and got["encoding"].startswith("original (as stored")
    assert got["channels"] == "0 (as decoded)" and got["upscale"].startswith("no")
    assert got["filter"] == "lanczos (not used: no resize)" and got["jpeg_quality"] == "95"
    assert dict(md_table(md, "### Labels")[1]) == {"labels": "single-label: one class per record"}
    assert "No metadata columns" in md


# -- a card for a real build --------------------------------------------------------------------------
def csv_rows(path: Path) -> Callable[[], Iterator[Row]]:
    def rows() -> Iterator[Row]:
        with open(path, newline="", encoding="utf-8") as f:
            yield from csv.DictReader(f)
    return rows


def read_manifest(version: Path) -> dict[str, Any]:
    import json

    return json.loads((version / "manifest.json").read_text())


def card_of(version: Path, source: Path, previous: Path | None, uri: str = "") -> dict[str, bytes]:
    old = PreviousVersion(read_manifest(previous), csv_rows(previous / "labels.csv")) if previous else None
    return build_card(read_manifest(version), csv_rows(version / "labels.csv"), csv_rows(version / "rejects.csv"),
                      old, lambda row: (source / row["filename"]).read_bytes(), uri=uri)


@pytest.fixture(scope="module")
def two_builds(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """v1 from the sample; v2 with squares gone, two circles gone, one changed, a new class, a bad file."""
    tmp = tmp_path_factory.mktemp("card")
    second = tmp / "second"
    shutil.copytree(sample_dir, second)
    shutil.move(second / "squares", second / "<img src=x onerror=alert(1)>")
    for name in ("circle_000.jpg", "circle_001.jpg"):
        (second / "circles" / name).unlink()
    (second / "circles" / "circle_004.png").write_bytes(make_image(99))
    (second / "triangles" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    for source, version in ((sample_dir, "v1"), (second, "v2")):
        result = run_cli("build", "--source", str(source), "--destination", str(tmp / "out"), "--dataset", "shapes",
                         "--version", version, "--shard-size-mb", "0.05", "--workers", "1", "--no-progress")
        assert result.returncode == 0, result.stderr
    return tmp / "out" / "shapes", second


def test_a_card_made_beside_the_writing_is_the_card_made_after_it(two_builds: tuple[Path, Path], sample_dir: Path,
                                                                  tmp_path: Path) -> None:
    """With a process pool the command line makes the card's pass over the rows on a thread while the shards are
    written; the published card is the one a build without a pool (the DAG's way: the card stage alone) makes."""
    dataset, second = two_builds
    for source, version in ((sample_dir, "v1"), (second, "v2")):
        result = run_cli("build", "--source", str(source), "--destination", str(tmp_path / "out"), "--dataset",
                         "shapes", "--version", version, "--shard-size-mb", "0.05", "--workers", "2", "--no-progress")
        assert result.returncode == 0, result.stderr
    after, beside = dataset / "v2", tmp_path / "out" / "shapes" / "v2"
    files = sorted(str(p.relative_to(after)) for p in after.rglob("*") if p.is_file() and (
        p.name.startswith("card.") or "card" in p.relative_to(after).parts[:1]))
    assert {"card.md", "card.html"} <= set(files) and any(f.endswith(".png") for f in files)
    assert not [f for f in files if f.endswith(".bin")]  # nothing private: what the card shows, and its pictures
    assert "## Changes since the previous version" in (after / "card.md").read_text()
    for name in files:  # the same but for where each was published (the card's "Load this version" names it)
        assert (beside / name).read_bytes().replace(str(tmp_path / "out").encode(), b"DEST") == \
            (after / name).read_bytes().replace(str(dataset.parent).encode(), b"DEST"), name


def test_the_cards_pass_over_a_staged_night_reads_labels_csv_and_keeps_no_copy_of_it(tmp_path: Path) -> None:
    """The card's pass over a staged night's labels.csv (real quality cells, flags, a previous version to diff, read
    by polars) learns what it learns of the same rows read by Python's csv module; it needs no private file: the
    previous version published no copy of its labels.csv's columns, the plan staged nothing for the card."""
    import json

    from image_tfrecords import stages
    from image_tfrecords.card.sections import scan_labels
    from image_tfrecords.config import BuildConfig
    from image_tfrecords.stages import card as card_stage
    from image_tfrecords.storage import Storage
    from tests.pipeline.test_incremental import Images, add, night_source
    from tests.unit.test_card_table import facts_key

    storage = Storage()
    source, dest = night_source(tmp_path)
    add(source, Images(tmp_path / "more", seed=2000), "triangles", "extra", 3)
    cfg = BuildConfig(source=source.uri, destination=str(dest), dataset="d", version="v2", shard_size_mb=0.02)
    by_name = {stage.name: stage for stage in stages.PIPELINE}
    for name in ("discover", "inspect", "split", "plan"):
        by_name[name].run(cfg, storage, **({"workers": 1} if by_name[name].per_image else {}))
    facts = card_stage.card_facts(cfg, storage)
    assert facts.diff is not None
    assert (facts.diff.added, facts.diff.removed, facts.diff.changed) == (12, 2, 1)
    assert facts.old is not None and facts.quality.classes and facts.picker.by_class
    base, root = dest / "d" / "v1", Path(cfg.staging_uri)
    classes = len(json.loads((root / "split.json").read_text())["classes"])
    near = csv_rows(root / "near_duplicates.csv") if (root / "near_duplicates.csv").exists() else None
    by_rows = scan_labels(None, classes, csv_rows(root / "labels.csv"), csv_rows(root / "rejects.csv"),
                          PreviousVersion(read_manifest(base), csv_rows(base / "labels.csv")), near)
    assert facts_key(facts) == facts_key(by_rows)
    assert not [p for p in root.rglob("*") if p.is_file() and p.name.startswith("card")]  # nothing staged for it
    assert not [p for p in (base / "card").rglob("*.bin")]  # no saved scan: the card read v1's labels.csv


def test_card_of_a_real_build(two_builds: tuple[Path, Path], sample_dir: Path) -> None:
    dataset, _ = two_builds
    version = dataset / "v1"
    manifest = read_manifest(version)
    out = card_of(version, sample_dir, None)
    md = out["card.md"].decode()
    labels = list(csv_rows(version / "labels.csv")())
    expected = Counter((r["label"], r["split"]) for r in labels)
    head, body = md_table(md, "## Records per split and class")
    assert head == ["id", "class", "train", "validation", "test", "total"]
    for cid, name, *counts in body[:-1]:
        assert manifest["classes"][int(cid)] == name
        assert [number(c) for c in counts[:3]] == [expected[name, s] for s in ("train", "validation", "test")]
    assert [number(c) for c in body[-1][2:]] == [manifest["splits"][s]["num_records"]
                                                 for s in ("train", "validation", "test")] + [60]
    _, shards = md_table(md, "## Shards")
    assert {r[0]: number(r[1]) for r in shards} == {s: len(i["shards"]) for s, i in manifest["splits"].items()}
    assert {r[0]: number(r[2]) for r in shards} == {s: i["num_records"] for s, i in manifest["splits"].items()}
    for cid, name in enumerate(manifest["classes"]):
        smallest = sorted(r["sha256"] for r in labels if r["label"] == name)[:6]
        by_sha = {r["sha256"]: r["filename"] for r in labels}
        thumbs = [card_render.thumbnail((sample_dir / by_sha[sha]).read_bytes()) for sha in smallest]
        assert out[f"card/samples/class-{cid:05d}.png"] == card_render.thumbnail_strip(thumbs)
    assert "No files were rejected." in md and "This is the first version of the dataset" in md
    gated = manifest["build"]["near_duplicates"]["gated"]  # the sample's flat shapes: their hashes say too little
    assert gated > 0 and f"{gated:,} images took no part in the search" in md
    assert "The near-duplicate search is on (8 bits) and found no group" in md
    assert "## Image quality" in md and not [name for name in out if name.startswith("card/near-duplicates/")]
    assert_self_contained(out)


def test_card_of_a_real_second_build_shows_the_changes(two_builds: tuple[Path, Path]) -> None:
    dataset, second = two_builds
    out = card_of(dataset / "v2", second, dataset / "v1")
    md, page = out["card.md"].decode(), out["card.html"].decode()
    _, changes = md_table(md, "## Changes since the previous version")
    got = {change: (number(count), examples) for change, count, examples in changes}
    squares = [f"squares/square_{i:03d}.{'png' if i % 5 == 4 else 'jpg'}" for i in range(20)]
    assert got["images added"][0] == 20 and got["images added"][1].startswith("<img src=x onerror=alert(1)>/square_000")
    assert got["images removed"] == (22, ", ".join(sorted(["circles/circle_000.jpg", "circles/circle_001.jpg",
                                                           *squares])[:10]))
    assert got["images changed"] == (1, "circles/circle_004.png")
    assert got["classes added"] == (1, "<img src=x onerror=alert(1)>")
    assert got["classes removed"] == (1, "squares")
    _, reasons = md_table(md, "## Rejects")
    rejects = Counter(r["reason"] for r in csv_rows(dataset / "v2" / "rejects.csv")())
    assert reasons == [[reason, str(n)] for reason, n in rejects.items()] + [["total", "1"]]
    assert "&lt;img src=x onerror=alert(1)&gt;" in page and "<img src=x" not in page
    assert_self_contained(out)


def test_chart_ticks_are_round_and_cover_the_data() -> None:
    from image_tfrecords.card.plot import nice_ticks

    assert nice_ticks(898) == [0, 200, 400, 600, 800, 1000]
    assert nice_ticks(3) == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert nice_ticks(0) == [0.0, 1.0]
    for high in (1, 7, 13, 99.5, 12345):
        ticks = nice_ticks(high)
        assert ticks[0] == 0 and ticks[-1] >= high and len(ticks) <= 8


def test_charts_draw_every_class_and_are_deterministic() -> None:
    from image_tfrecords.card.plot import COLOURS, records_chart, shards_chart

    classes = [f"class {i}" for i in range(50)]
    counts = {(c, s): 1 + i for i, c in enumerate(classes) for s in ("train", "test")}
    png = records_chart(classes, ["train", "test"], counts, "Records")
    assert png == records_chart(classes, ["train", "test"], counts, "Records")
    image = Image.open(io.BytesIO(png)).convert("RGB")
    train = tuple(int(COLOURS[0][i:i + 2], 16) for i in (1, 3, 5))
    rows_with_bars = {y for y in range(image.height) for x in range(100, 700, 7) if image.getpixel((x, y)) == train}
    assert len(rows_with_bars) >= 50 * 15  # 50 bars of 20 px, each with a train segment
    shards = Image.open(io.BytesIO(shards_chart({"train": [90_000_000, 100_000_000], "test": []})))
    assert shards.size == (800, 354)


def test_card_of_a_real_multi_label_build(tmp_path: Path) -> None:
    """A labels.csv with a ``labels`` column, resized and re-encoded: the card counts each class of a record."""
    names, source = ["cats", "dogs", "owls"], tmp_path / "source"
    source.mkdir()
    with open(source / "labels.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["filename", "labels", "caption"])
        for i in range(21):
            (source / f"img{i:02d}.png").write_bytes(make_image(i))
            writer.writerow([f"img{i:02d}.png", "|".join(n for j, n in enumerate(names) if (i % 7 + 1) >> j & 1),
                             f"picture {i}"])
    result = run_cli("build", "--source", str(source), "--destination", str(tmp_path / "out"), "--dataset", "ml",
                     "--version", "v1", "--workers", "1", "--no-progress", "--resize", "32x24", "--fit", "pad",
                     "--encoding", "png", "--columns", "caption=string")
    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / "ml" / "v1"
    md = card_of(version, source, None, str(version))["card.md"].decode()  # thumbnails of the source images

    def without_samples(text: str) -> str:  # and without the gate's verdict, which the gate stage writes
        text = re.sub(r"<!-- section publish-gate -->.*?<!-- end of section publish-gate -->", "", text, flags=re.S)
        return re.sub(r"## Samples\n.*?(?=## Rejects)", "", text, flags=re.S)

    assert without_samples((version / "card.md").read_text()) == without_samples(md)  # the published card
    labels = list(csv_rows(version / "labels.csv")())
    expected = Counter((name, r["split"]) for r in labels for name in r["label"].split("|"))
    splits = ["train", "validation", "test"]
    _, body = md_table(md, "## Records per split and class")
    assert {name: [number(c) for c in counts[:3]] for _, name, *counts in body[:-2]} == {
        name: [expected[name, s] for s in splits] for name in names}
    assert body[-1][1] == "records" and number(body[-1][-1]) == len(labels) == 21
    _, pairs = md_table(md, "## Classes found together")
    assert sorted((p[1], p[3], number(p[4])) for p in pairs) == [("cats", "dogs", 6), ("cats", "owls", 6),
                                                                  ("dogs", "owls", 6)]
    _, sizes = md_table(md, "## Classes per record")
    assert [(s[0], number(s[-1])) for s in sizes[:3]] == [("1", 9), ("2", 9), ("3+", 3)]
    options = dict(md_table(md, "### Images")[1])
    assert options["resize"].startswith("32x24") and options["encoding"].startswith("png")
    assert md_table(md, "### Metadata columns")[1] == [["caption", "string", "string", "[]"]]
