"""discovery.discover on local folders and on S3 (a real SeaweedFS server)."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from image_tfrecords.errors import BuildError
from image_tfrecords.source.listing import Candidate, DiscoveryCounts, discover, looks_like_image
from image_tfrecords.storage import Storage, StorageError

UNICODE_NAME = "daisies/ünïcödé 名前, with 'single' and \"double\" quotes.jpg"

FOLDER_TREE = {
    "roses/a.jpg": b"a" * 10,
    "roses/2024/x.jpg": b"x" * 11,
    "roses/2024/deeper/y.jpeg": b"y" * 12,
    "roses/.hidden.jpg": b"h",
    "roses/Thumbs.db": b"thumbs",
    "roses/.DS_Store": b"ds",
    "roses/readme.txt": b"text",
    "tulips/B.JPG": b"b" * 13,
    "tulips/c.Png": b"c" * 14,
    "tulips/d.JPEG": b"d" * 15,
    "tulips/e.gif": b"e" * 16,
    "tulips/f.webp": b"f" * 17,
    UNICODE_NAME: b"u" * 18,
    "daisies/with space.png": b"s" * 19,
    "root.jpg": b"r" * 20,
    "notes.txt": b"notes",
    ".hidden_root.png": b"h",
    "tulips/noextension": b"n",
}

FOLDER_EXPECTED = [
    Candidate("daisies/with space.png", label="daisies", num_bytes=19),
    Candidate(UNICODE_NAME, label="daisies", num_bytes=18),
    Candidate("root.jpg", num_bytes=20, reason="no_label",
              detail="image in the source root: put it in a class folder"),
    Candidate("roses/2024/deeper/y.jpeg", label="roses", num_bytes=12),
    Candidate("roses/2024/x.jpg", label="roses", num_bytes=11),
    Candidate("roses/a.jpg", label="roses", num_bytes=10),
    Candidate("tulips/B.JPG", label="tulips", num_bytes=13),
    Candidate("tulips/c.Png", label="tulips", num_bytes=14),
    Candidate("tulips/d.JPEG", label="tulips", num_bytes=15),
    Candidate("tulips/e.gif", label="tulips", num_bytes=16),
    Candidate("tulips/f.webp", label="tulips", num_bytes=17),
]
FOLDER_SKIPPED = 7  # .hidden.jpg, Thumbs.db, .DS_Store, readme.txt, notes.txt, .hidden_root.png, noextension


def _write_local(root: Path, tree: dict[str, bytes]) -> Path:
    for name, data in tree.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return root


def _write_s3(storage: Storage, source: str, tree: dict[str, bytes]) -> None:
    for name, data in tree.items():
        storage.write_bytes(f"{source}/{name}", data)


def _discover(storage: Storage, source: str) -> tuple[list[Candidate], DiscoveryCounts]:
    """The candidates (stamps blanked: test_stamps checks them) and the counts."""
    counts = DiscoveryCounts()
    return [dataclasses.replace(c, stamp="") for c in discover(storage, source, counts)], counts


def test_stamps_are_mtime_ns_locally_and_the_etag_on_s3(tmp_path: Path, bucket: str, s3_storage: Storage) -> None:
    """What inspection reuse compares besides name and size: it changes when a file is rewritten."""
    source = _write_local(tmp_path / "src", FOLDER_TREE)
    found = {c.filename: c.stamp for c in discover(Storage(), str(source)) if not c.reason}
    assert found and all(stamp == str((source / name).stat().st_mtime_ns) for name, stamp in found.items())
    for name in found:
        s3_storage.write_bytes(f"s3://{bucket}/stamps/{name}", (source / name).read_bytes())
    on_s3 = {c.filename: c.stamp for c in discover(s3_storage, f"s3://{bucket}/stamps") if not c.reason}
    etags = {name: s3_storage.s3.head_object(Bucket=bucket, Key=f"stamps/{name}")["ETag"].strip('"')
             for name in found}
    assert on_s3 == etags and all(on_s3.values())


def _by_name(candidates: Iterable[Candidate]) -> dict[str, Candidate]:
    return {c.filename: c for c in candidates}


# -- folder layout, local --------------------------------------------------------------------------
def test_folder_layout(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", FOLDER_TREE))
    candidates, counts = _discover(Storage(), source)
    assert candidates == FOLDER_EXPECTED
    assert (counts.layout, counts.listed, counts.skipped) == ("folders", len(FOLDER_TREE), FOLDER_SKIPPED)


def test_trailing_slash_in_source(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", FOLDER_TREE))
    assert _discover(Storage(), source + "/")[0] == FOLDER_EXPECTED


def test_order_is_stable_and_names_use_forward_slashes(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", FOLDER_TREE))
    first = [c.filename for c in discover(Storage(), source)]
    second = [c.filename for c in discover(Storage(), source)]
    assert first == second == sorted(first)
    assert all("\\" not in name and not name.startswith("/") for name in first)
    assert UNICODE_NAME in first


def test_counts_default_to_a_fresh_object(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", FOLDER_TREE))
    assert [dataclasses.replace(c, stamp="") for c in discover(Storage(), source)] == FOLDER_EXPECTED


def test_order_is_sorted_by_full_name(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", {"roses/a.jpg": b"1", "roses-red/a.jpg": b"2",
                                                 "roses.old/a.jpg": b"3"}))
    names = [c.filename for c in discover(Storage(), source)]
    assert names == sorted(names)


def test_images_in_hidden_folders_are_skipped(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", {"roses/a.jpg": b"1", ".Trash-1000/files/x.jpg": b"2",
                                                 ".ipynb_checkpoints/y.png": b"3"}))
    candidates, counts = _discover(Storage(), source)
    assert [c.filename for c in candidates] == ["roses/a.jpg"]
    assert counts.skipped == 2


def test_symlinks_are_not_followed(tmp_path: Path) -> None:
    outside = _write_local(tmp_path / "outside", {"secret.jpg": b"s" * 5, "dir/inner.jpg": b"i" * 6})
    source = _write_local(tmp_path / "src", {"roses/a.jpg": b"a"})
    os.symlink(outside / "secret.jpg", source / "roses" / "link.jpg")
    os.symlink(outside / "dir", source / "linked_dir")
    os.symlink(outside / "dir", source / "roses" / "linked_dir")
    os.symlink(source / "roses" / "a.jpg", source / "roses" / "inner_link.jpg")
    candidates, counts = _discover(Storage(), str(source))
    assert candidates == [Candidate("roses/a.jpg", label="roses", num_bytes=1)]
    assert (counts.listed, counts.skipped, dict(counts.skipped_by_kind)) == (5, 4, {"symlink": 4})


def test_empty_source(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    candidates, counts = _discover(Storage(), str(tmp_path / "empty"))
    assert (candidates, counts.listed, counts.skipped) == ([], 0, 0)


def test_missing_source_raises(tmp_path: Path) -> None:
    from image_tfrecords.storage import StorageError

    with pytest.raises(StorageError, match="not a folder"):
        list(discover(Storage(), str(tmp_path / "nope")))


@pytest.mark.parametrize("name,expected", [
    ("a.jpg", True), ("a.JPG", True), ("a.Png", True), ("a.jpeg", True), ("a.JPEG", True), ("a.jpe", True),
    ("a.jfif", True), ("a.gif", True), ("a.bmp", True), ("a.webp", True), ("a.tif", True), ("a.TIFF", True),
    ("dir/a.png", True), ("a.b.jpg", True), (".a.jpg", False), ("dir/.a.jpg", False), ("Thumbs.db", False),
    ("a.txt", False), ("jpg", False), ("a.jpg.txt", False), ("a.svg", False), ("a", False), (".DS_Store", False),
])
def test_looks_like_image(name: str, expected: bool) -> None:
    assert looks_like_image(name) is expected


# -- labels.csv layout, local ----------------------------------------------------------------------
LABELS_CSV = (
    "filename,label,notes\n"
    "a.jpg,cat,first\n"
    "sub/b.jpg, dog ,second\n"
    "missing.jpg,cat,\n"
    "../outside.jpg,cat,\n"
    "/etc/absolute.jpg,cat,\n"
    "c.jpg,,no label\n"
    "c2.jpg,   ,blank label\n"
    "a.jpg,cat,duplicate\n"
    "./sub/../a.jpg,dog,same file again\n"
    "\"x, \"\"quoted\"\".jpg\",bird,\n"
    ",cat,empty filename\n"
)
LABELS_TREE = {
    "a.jpg": b"a" * 3,
    "sub/b.jpg": b"b" * 4,
    "c.jpg": b"c" * 5,
    "c2.jpg": b"c" * 6,
    'x, "quoted".jpg': b"x" * 7,
    "unlisted.png": b"u" * 8,
    "sub/unlisted.JPG": b"u" * 9,
    "notes.txt": b"n",
    ".hidden.jpg": b"h",
}
LABELS_EXPECTED = [
    Candidate("a.jpg", label="cat", num_bytes=3),
    Candidate("sub/b.jpg", label="dog", num_bytes=4),
    Candidate("missing.jpg", reason="missing_file", detail="listed in labels.csv but not found"),
    Candidate("../outside.jpg", reason="bad_path", detail="path is empty, absolute or outside the source"),
    Candidate("/etc/absolute.jpg", reason="bad_path", detail="path is empty, absolute or outside the source"),
    Candidate("c.jpg", num_bytes=5, reason="no_label", detail="empty label"),
    Candidate("c2.jpg", num_bytes=6, reason="no_label", detail="empty label"),
    Candidate("a.jpg", reason="duplicate_row", detail="listed more than once in labels.csv"),
    Candidate("a.jpg", reason="duplicate_row", detail="listed more than once in labels.csv"),
    Candidate('x, "quoted".jpg', label="bird", num_bytes=7),
    Candidate("", reason="bad_path", detail="path is empty, absolute or outside the source"),
    Candidate("sub/unlisted.JPG", num_bytes=9, reason="no_label", detail="not listed in labels.csv"),
    Candidate("unlisted.png", num_bytes=8, reason="no_label", detail="not listed in labels.csv"),
]


def _labels_tree(csv_text: str = LABELS_CSV, encoding: str = "utf-8") -> dict[str, bytes]:
    return {**LABELS_TREE, "labels.csv": csv_text.encode(encoding)}


def test_labels_csv_layout(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", _labels_tree()))
    candidates, counts = _discover(Storage(), source)
    assert candidates == LABELS_EXPECTED
    assert counts.layout == "labels.csv"
    assert counts.listed == len(LABELS_TREE) + 1
    assert counts.skipped == 2  # notes.txt, .hidden.jpg


def test_labels_csv_with_bom(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", _labels_tree(encoding="utf-8-sig")))
    assert _discover(Storage(), source)[0] == LABELS_EXPECTED


def test_labels_csv_with_crlf_and_column_order(tmp_path: Path) -> None:
    csv_text = "label,extra,filename\r\ncat,1,a.jpg\r\ndog,2,sub/b.jpg\r\n"
    source = str(_write_local(tmp_path / "src", {"a.jpg": b"a", "sub/b.jpg": b"bb", "labels.csv": csv_text.encode()}))
    assert _discover(Storage(), source)[0] == [Candidate("a.jpg", label="cat", num_bytes=1),
                                              Candidate("sub/b.jpg", label="dog", num_bytes=2)]


def test_labels_csv_with_unicode_names(tmp_path: Path) -> None:
    name = "fotos/ñandú 名前.jpg"
    csv_text = f"filename,label\n{name},pájaro\n"
    source = str(_write_local(tmp_path / "src", {name: b"123", "labels.csv": csv_text.encode()}))
    assert _discover(Storage(), source)[0] == [Candidate(name, label="pájaro", num_bytes=3)]


@pytest.mark.parametrize("csv_text,found", [
    ("file,class\na.jpg,cat\n", "file,class"),
    ("filename\na.jpg\n", "filename"),
    ("Filename,Label\na.jpg,cat\n", "Filename,Label"),
    ("", "nothing"),
])
def test_labels_csv_without_the_right_header(tmp_path: Path, csv_text: str, found: str) -> None:
    source = str(_write_local(tmp_path / "src", {"a.jpg": b"a", "labels.csv": csv_text.encode()}))
    with pytest.raises(BuildError, match="header with columns filename,label") as info:
        list(discover(Storage(), source))
    assert f"(found: {found})" in str(info.value)
    assert "labels.csv" in str(info.value)


def test_labels_csv_in_a_subfolder_is_just_a_file(tmp_path: Path) -> None:
    source = str(_write_local(tmp_path / "src", {"cats/a.jpg": b"a", "cats/labels.csv": b"filename,label\n"}))
    candidates, counts = _discover(Storage(), source)
    assert candidates == [Candidate("cats/a.jpg", label="cats", num_bytes=1)]
    assert (counts.layout, counts.skipped) == ("folders", 1)


# -- S3 --------------------------------------------------------------------------------------------
def test_s3_folder_layout_matches_local(bucket: str, s3_storage: Storage, tmp_path: Path) -> None:
    source = f"s3://{bucket}/data/src"
    _write_s3(s3_storage, source, FOLDER_TREE)
    # Neighbours that share the prefix text but are not below the source folder.
    s3_storage.write_bytes(f"s3://{bucket}/data/src-other/roses/z.jpg", b"z")
    s3_storage.write_bytes(f"s3://{bucket}/data/srcfile.jpg", b"z")
    s3_storage.write_bytes(f"s3://{bucket}/data/root.jpg", b"z")
    candidates, counts = _discover(s3_storage, source)
    assert candidates == FOLDER_EXPECTED
    assert (counts.layout, counts.listed, counts.skipped) == ("folders", len(FOLDER_TREE), FOLDER_SKIPPED)
    local = _discover(Storage(), str(_write_local(tmp_path / "src", FOLDER_TREE)))[0]
    assert candidates == local


def test_s3_source_at_bucket_root(bucket: str, s3_storage: Storage) -> None:
    _write_s3(s3_storage, f"s3://{bucket}", {"roses/a.jpg": b"aa", "b.jpg": b"b"})
    for source in (f"s3://{bucket}", f"s3://{bucket}/"):
        assert _discover(s3_storage, source)[0] == [
            Candidate("b.jpg", num_bytes=1, reason="no_label",
                      detail="image in the source root: put it in a class folder"),
            Candidate("roses/a.jpg", label="roses", num_bytes=2)]


def test_s3_labels_csv_layout(bucket: str, s3_storage: Storage) -> None:
    source = f"s3://{bucket}/labelled"
    _write_s3(s3_storage, source, _labels_tree(encoding="utf-8-sig"))
    candidates, counts = _discover(s3_storage, source)
    assert candidates == LABELS_EXPECTED
    assert (counts.layout, counts.listed, counts.skipped) == ("labels.csv", len(LABELS_TREE) + 1, 2)


def test_s3_labels_csv_without_header_raises(bucket: str, s3_storage: Storage) -> None:
    source = f"s3://{bucket}/bad"
    _write_s3(s3_storage, source, {"a.jpg": b"a", "labels.csv": b"name,class\na.jpg,cat\n"})
    with pytest.raises(BuildError, match=r"must have a header with columns filename,label \(found: name,class\)"):
        list(discover(s3_storage, source))


def test_s3_listing_paginates(bucket: str, s3_storage: Storage) -> None:
    source = f"s3://{bucket}/many"
    names = [f"class{i % 3}/img{i:05d}.jpg" for i in range(1100)] + [f"class0/skip{i}.txt" for i in range(5)]
    s3_storage.s3  # noqa: B018 - create the shared client before the threads use it
    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(lambda n: s3_storage.write_bytes(f"{source}/{n}", n.encode()), names))
    first_page = s3_storage.s3.list_objects_v2(Bucket=bucket, Prefix="many/")
    assert first_page["IsTruncated"] and first_page["KeyCount"] <= 1000  # the listing really takes pages
    candidates, counts = _discover(s3_storage, source)
    filenames = [c.filename for c in candidates]
    assert len(filenames) == len(set(filenames)) == 1100
    assert set(filenames) == {n for n in names if n.endswith(".jpg")}
    assert filenames == sorted(filenames)
    assert all(c.label == c.filename.split("/")[0] and c.num_bytes == len(c.filename) for c in candidates)
    assert (counts.listed, counts.skipped) == (1105, 5)


def test_labels_csv_rows_that_do_not_parse_are_rejects_and_the_rest_is_read(tmp_path: Path) -> None:
    source = _write_local(tmp_path / "src", {"a.jpg": b"1", "b.jpg": b"2", "c.jpg": b"3"})
    rows = (b"filename,label\na.jpg,cat\n" + b'"b.jpg","' + b"x" * (2 << 20) + b'"\n'
            + b"c.jpg,caf\xe9\nb.jpg,dog\n")
    (source / "labels.csv").write_bytes(rows)
    found = _by_name(_discover(Storage(), str(source))[0])
    assert found["a.jpg"] == Candidate("a.jpg", label="cat", num_bytes=1)
    assert found["b.jpg"] == Candidate("b.jpg", label="dog", num_bytes=1)  # the row after the bad ones counts
    bad = {name: c.reason for name, c in found.items() if name.startswith("labels.csv:")}
    assert sorted(bad.values()) == ["bad_row", "bad_row"]
    assert found["c.jpg"].reason == "no_label"  # its only row was not UTF-8


def test_a_symlinked_labels_csv_is_a_run_error_never_followed(tmp_path: Path) -> None:
    outside = _write_local(tmp_path / "outside", {"labels.csv": b"filename,label\na.jpg,x\n"})
    source = _write_local(tmp_path / "src", {"a.jpg": b"1"})
    (source / "labels.csv").symlink_to(outside / "labels.csv")
    with pytest.raises(StorageError, match="not a regular file"):
        _discover(Storage(), str(source))
