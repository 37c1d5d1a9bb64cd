"""The passes over every row (inspection's join and gather, split, plan's join and labels.csv) have one path, on
polars, for every file name: names with a comma, a quote, a line feed, a carriage return, a tab, spaces or
non-ASCII letters go through the same code as plain names, in the base version and in the night built on it."""

from __future__ import annotations

import csv
from pathlib import Path

from image_tfrecords.storage import Storage
from tests.pipeline.test_incremental import CLASSES, Images, add, base_source, build, check_night, read

HOSTILE = ("comma,in name", 'a "quoted" name', "line\nfeed", "carriage\rreturn", "tab\there", " spaced ",
           "ünïcödé ✓", "semi;colon")


def _hostile(source, images: Images, tag: str) -> dict[str, bytes]:  # type: ignore[no-untyped-def]
    """One image under each hostile name, in each class; returns {name: bytes}."""
    added: dict[str, bytes] = {}
    for label in CLASSES:
        for k, (ext, data) in enumerate(images.take(len(HOSTILE))):
            name = f"{label}/{tag} {HOSTILE[k]}{ext}"
            source.put(name, data)
            added[name] = data
    return added


def test_a_night_with_hostile_names_holds_what_a_full_build_holds(tmp_path: Path) -> None:
    """A base whose labels.csv and inspected.csv quote fields, then a night that adds more such names, deletes one
    and changes one: the incremental night takes over the base's inspections and shards as it does for plain
    names (only the touched files are read), and holds what a full build of the same source holds."""
    storage = Storage()
    source = base_source(tmp_path, storage, None, per_class=4)
    images = Images(tmp_path / "fresh")
    _hostile(source, images, "old")
    build(storage, source.uri, str(tmp_path / "out"), "d", "v1")
    prev = read(storage, str(tmp_path / "out" / "d" / "v1"))
    with open(tmp_path / "out" / "d" / "v1" / "labels.csv", newline="") as f:
        labels_text = f.read()
    assert '"circles/old comma,in name' in labels_text and '"circles/old line\nfeed' in labels_text
    names = {row["filename"].rsplit(".", 1)[0] for row in prev.labels}
    assert {f"circles/old {name}" for name in HOSTILE} <= names

    touched = _hostile(source, images, "new")
    touched |= add(source, images, "squares", "plain", 2)
    source.delete(next(name for name in source.files() if name.startswith(f"triangles/old {HOSTILE[0]}")))
    changed = next(name for name in source.files() if name.startswith(f"circles/old {HOSTILE[2]}"))
    touched[changed] = images.take(1, "." + changed.rsplit(".", 1)[1])[0][1]
    source.put(changed, touched[changed])
    build(storage, source.uri, str(tmp_path / "out"), "d", "v2")
    build(storage, source.uri, str(tmp_path / "full"), "d", "v2", full=True)
    cur = read(storage, str(tmp_path / "out" / "d" / "v2"))
    full = read(storage, str(tmp_path / "full" / "d" / "v2"))
    assert check_night(storage, prev, cur, full, source.files(), touched) == "incremental"
    assert cur.build["shards_reused"] + cur.build["shards_rewritten"] > 0  # the base's shards were joined on
    with open(tmp_path / "out" / "d" / "v2" / "labels.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {row["filename"] for row in rows} == set(source.files())
