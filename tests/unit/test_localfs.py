"""localfs: the walk and the confined open, on real files (symlinks, FIFOs, sockets, odd names, depth)."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

import pytest

from image_tfrecords.source import localfs
from image_tfrecords.source.listing import bad_key
from image_tfrecords.source.localfs import NotARegularFile, open_file, walk
from tests.unit.test_discovery import _write_local

ROOT = Path(__file__).resolve().parents[2]


def test_walk_yields_sorted_keys_like_an_s3_listing(tmp_path: Path) -> None:
    names = ["a/x.png", "a-b/y.png", "a.b", "a/b/z.png", "b", "A/c.png"]
    _write_local(tmp_path, {name: b"1" for name in names})
    keys = [e.key for e in walk(str(tmp_path))]
    assert keys == sorted(names)


def test_walk_reports_each_kind_and_never_follows_links(tmp_path: Path) -> None:
    outside = _write_local(tmp_path / "outside", {"secret.png": b"s"})
    src = _write_local(tmp_path / "src", {"roses/a.png": b"a"})
    os.symlink(outside / "secret.png", src / "roses" / "link.png")
    os.symlink(outside, src / "roses" / "linked_dir")
    os.mkfifo(src / "roses" / "fifo.png")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "roses" / "sock.png"))
    try:
        kinds = {e.key: e.kind for e in walk(str(src))}
    finally:
        sock.close()
    assert kinds == {"roses/a.png": "file", "roses/fifo.png": "fifo", "roses/link.png": "symlink",
                     "roses/linked_dir": "symlink", "roses/sock.png": "socket"}


def test_undecodable_names_are_problems_with_an_escaped_key(tmp_path: Path) -> None:
    (tmp_path / "roses").mkdir()
    fd = os.open(os.fsencode(tmp_path / "roses") + b"/caf\xe9.png", os.O_CREAT | os.O_WRONLY)
    os.close(fd)
    os.mkdir(os.fsencode(tmp_path) + b"/bad\xff")
    entries = {e.key: (e.kind, e.problem) for e in walk(str(tmp_path))}
    assert entries == {"bad\\xff/": ("folder", "bad_filename"), "roses/caf\\xe9.png": ("file", "bad_filename")}


def test_deep_nesting_is_a_problem_not_a_recursion_error(tmp_path: Path) -> None:
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(1000):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = child
        os.close(os.open("x.png", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    (tmp_path / "ok.png").write_bytes(b"1")
    try:
        entries = list(walk(str(tmp_path)))
    finally:
        remove_deep_write_local(str(tmp_path / "d"))
    assert [(e.key.count("/"), e.problem) for e in entries] == [(localfs.MAX_DEPTH, "path_too_long"), (0, "")]


def remove_deep_write_local(top: str) -> None:
    """Remove a folder tree of any depth (shutil.rmtree, and pytest's cleanup, recurse and fail at ~1000 levels)."""
    os.chdir(os.path.dirname(top))
    try:
        while os.path.isdir(os.path.basename(top)):
            os.chdir(os.path.basename(top))
            depth = 1
            while True:  # descend to the deepest folder, then remove it and go up one level at a time
                subdirs = [e.name for e in os.scandir(".") if e.is_dir(follow_symlinks=False)]
                if not subdirs:
                    break
                os.chdir(subdirs[0])
                depth += 1
            for _ in range(depth):
                for entry in os.scandir("."):
                    os.unlink(entry.name)
                here = os.path.basename(os.getcwd())
                os.chdir("..")
                os.rmdir(here)
    finally:
        os.chdir(ROOT)


def test_open_file_refuses_links_fifos_and_linked_folders(tmp_path: Path) -> None:
    outside = _write_local(tmp_path / "outside", {"roses/a.png": b"secret"})
    src = _write_local(tmp_path / "src", {"roses/a.png": b"mine", "tulips/t.png": b"t"})
    stream, size = open_file(str(src), "roses/a.png")
    with stream:
        assert (stream.read(), size) == (b"mine", 4)
    (src / "roses" / "a.png").unlink()
    os.symlink(outside / "roses" / "a.png", src / "roses" / "a.png")
    with pytest.raises(NotARegularFile) as err:
        open_file(str(src), "roses/a.png")
    assert err.value.kind == "symlink"
    os.rename(src / "roses", src / "roses-old")
    os.symlink(outside / "roses", src / "roses")
    with pytest.raises(NotARegularFile, match="on its path"):
        open_file(str(src), "roses/a.png")
    (src / "tulips" / "t.png").unlink()
    os.mkfifo(src / "tulips" / "t.png")
    result: list[BaseException] = []

    def try_open() -> None:
        try:
            open_file(str(src), "tulips/t.png")
        except BaseException as exc:  # handed to the test thread
            result.append(exc)

    opener = threading.Thread(target=try_open, daemon=True)
    opener.start()
    opener.join(10)
    assert not opener.is_alive(), "opening a FIFO blocked"
    assert isinstance(result[0], NotARegularFile) and result[0].kind == "fifo"
    for key in ("../outside/roses/a.png", "roses//a.png", "/etc/passwd", "./x"):
        with pytest.raises(NotARegularFile, match="clean relative path"):
            open_file(str(src), key)


def test_open_file_refuses_a_device(tmp_path: Path) -> None:
    os.symlink("/dev/zero", tmp_path / "zero.png")
    with pytest.raises(NotARegularFile):
        open_file(str(tmp_path), "zero.png")
    with pytest.raises(NotARegularFile) as err:  # the device node itself, opened relative to /dev
        open_file("/dev", "zero")
    assert err.value.kind == "device"


@pytest.mark.parametrize(("key", "bad"), [("a/x.png", False), ("a//x.png", True), ("/a/x.png", True), ("a/x/", True),
                                          ("a/./x.png", True), ("a/../x.png", True), ("a/..x.png", False),
                                          ("a/" + "x" * 1100, True)])
def test_bad_s3_keys(key: str, bad: bool) -> None:
    assert bool(bad_key(key)) is bad


@pytest.mark.parametrize("swap", ["symlink_to_outside", "symlink_to_dev_zero", "fifo", "folder_symlink"])
def test_a_swap_between_listing_and_reading_is_a_reject_and_nothing_outside_is_read(
        swap: str, sample_dir: Path, tmp_path: Path) -> None:
    import hashlib
    import shutil

    from image_tfrecords import stages
    from image_tfrecords.config import BuildConfig
    from image_tfrecords.storage import Storage, join

    source, outside = tmp_path / "src", tmp_path / "outside"
    shutil.copytree(sample_dir, source)
    outside.mkdir()
    for path in (sample_dir / "circles").iterdir():  # valid images under the same names, other bytes
        (outside / path.name).write_bytes(path.read_bytes() + b"outside")
    cfg = BuildConfig(source=str(source), destination=str(tmp_path / "out"), dataset="d", version="v1")
    storage = Storage()
    stages.discover_stage(cfg, storage)
    victim = source / "circles" / "circle_003.jpg"
    if swap == "folder_symlink":
        shutil.rmtree(source / "circles")
        os.symlink(outside, source / "circles")
    else:
        victim.unlink()
        if swap == "fifo":
            os.mkfifo(victim)
        else:
            os.symlink("/dev/zero" if swap == "symlink_to_dev_zero" else outside / "circle_003.jpg", victim)
    done = threading.Event()
    result: dict = {}
    worker = threading.Thread(target=lambda: (result.update(stages.inspect_stage(cfg, storage)), done.set()),
                              daemon=True)
    worker.start()
    assert done.wait(60), "inspection blocked"
    rejects = storage.read_text(join(cfg.staging_uri, stages.INSPECT_REJECTS))
    inspected = storage.read_text(join(cfg.staging_uri, stages.INSPECTED))
    assert "circles/circle_003.jpg,not_a_regular_file" in rejects
    outside_hashes = {hashlib.sha256(p.read_bytes()).hexdigest() for p in outside.iterdir()}
    assert not any(h in inspected for h in outside_hashes), "bytes from outside the source were read"
    if swap == "folder_symlink":
        assert rejects.count("not_a_regular_file") == len(list(outside.iterdir()))


def _odd_folder(tmp_path: Path) -> tuple[Path, list[str]]:
    """A folder of every kind of entry, with modification times around 1970 and far from it, and its names (one
    of them missing, one not UTF-8)."""
    src = tmp_path / "odd"
    src.mkdir()
    times = {"epoch.png": 0, "five_ns.png": 5, "before.png": -1_500_000_000, "just_before.png": -1,
             "whole_second_before.png": -1_000_000_000, "far_before.png": -(10**18) - 7, "now.png": time_ns_now(),
             "late.png": 4_102_444_800_123_456_789}
    for name, ns in times.items():
        (src / name).write_bytes(name.encode())
        os.utime(src / name, ns=(ns, ns))
    os.symlink(src / "now.png", src / "link.png")
    os.mkfifo(src / "fifo.png")
    (src / "folder").mkdir()
    fd = os.open(os.fsencode(src) + b"/caf\xe9.png", os.O_CREAT | os.O_WRONLY)
    os.close(fd)
    return src, [*sorted(times), "link.png", "fifo.png", "folder", os.fsdecode(b"caf\xe9.png"), "missing.png"]


def time_ns_now() -> int:
    import time

    return time.time_ns()


@pytest.mark.skipif(localfs.lstat_names is localfs.lstat_names_py, reason="the package was built without its C parts")
def test_the_compiled_lstat_gives_what_os_stat_gives(tmp_path: Path) -> None:
    """``_lstat.lstat_names`` against its Python twin: modes, sizes and ``st_mtime_ns`` as text, to the nanosecond
    and before 1970 too; ``-ENOENT`` for a name that is gone."""
    src, names = _odd_folder(tmp_path)
    fd = os.open(src, os.O_RDONLY | os.O_DIRECTORY)
    try:
        compiled = localfs.lstat_names(fd, names)
        python = localfs.lstat_names_py(fd, names)
    finally:
        os.close(fd)
    assert compiled == python
    modes, _, stamps = compiled
    assert modes[-1] == -2 and stamps[-1] == ""  # missing.png: ENOENT
    assert stamps[names.index("far_before.png")] == str(-(10**18) - 7)
    assert stamps[names.index("just_before.png")] == "-1"
    assert stamps[names.index("five_ns.png")] == "5"
    with pytest.raises(TypeError):
        localfs.lstat_names(0, [b"bytes.png"])
    for twin in (localfs.lstat_names, localfs.lstat_names_py):  # never the name cut at the NUL
        with pytest.raises(ValueError, match="null"):
            twin(0, ["epoch.png\0x"])


def test_the_walk_is_the_same_with_the_python_lstat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every entry of a hostile folder, its kind, problem, size, stamp and time, as either twin lists it; a local
    file's time comes from its stamp (``FileInfo.modified_at``)."""
    _odd_folder(tmp_path)
    first = list(walk(str(tmp_path)))
    monkeypatch.setattr(localfs, "lstat_names", localfs.lstat_names_py)
    assert list(walk(str(tmp_path))) == first
    by_key = {e.key: e for e in first}
    assert by_key["odd/late.png"].modified_at().isoformat() == "2100-01-01T00:00:00.123456+00:00"
    assert by_key["odd/before.png"].modified_at().isoformat() == "1969-12-31T23:59:58.500000+00:00"
    assert by_key["odd/five_ns.png"].stamp == "5" and by_key["odd/five_ns.png"].size == len(b"five_ns.png")
    assert {e.key: e.kind for e in first if e.kind != "file"} == {"odd/fifo.png": "fifo", "odd/link.png": "symlink"}
    assert by_key["odd/caf\\xe9.png"].problem == "bad_filename"
