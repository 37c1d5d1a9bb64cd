"""A hostile source and destination: never crash, never hang, never read outside the source.

Every case builds the hostile situation on real files (symlinks and FIFOs swapped in between
listing and reading, sockets, names that are not UTF-8, mode-000 files read by a root without
capabilities, 1000 nested folders, sparse multi-GB files, full and read-only destinations on real
tmpfs mounts, S3 keys that are not clean paths on a real SeaweedFS) and asserts the outcome: a
reject with its reason, a skip counted by kind, or one ``error:`` line with the previous version
untouched. Published datasets are read back with TensorFlow.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.storage import Storage
from tests.tf_reader import read_version

ROOT = Path(__file__).resolve().parents[2]
DATASET = "ds"
CAPLESS = ["setpriv", "--bounding-set=-all", "--inh-caps=-all"]
MB = 1_000_000


# -- helpers -----------------------------------------------------------------------------------------
def _image(fmt: str, seed: int, size: tuple[int, int] = (23, 17)) -> bytes:
    """A noise image (incompressible, distinct per seed) encoded as ``fmt``."""
    from PIL import Image

    rng = random.Random(seed)
    buf = io.BytesIO()
    Image.frombytes("RGB", size, rng.randbytes(size[0] * size[1] * 3)).save(buf, fmt)
    return buf.getvalue()


def _copy_sample(sample_dir: Path, tmp_path: Path, name: str = "src") -> Path:
    src = tmp_path / name
    shutil.copytree(sample_dir, src)
    return src


def _cli(source: Path | str, dest: Path | str, *extra: str, version: str = "v1", env: dict[str, str] | None = None,
         prefix: list[str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    cmd = [*(prefix or []), sys.executable, "-m", "image_tfrecords", "build", "--source", str(source),
           "--destination", str(dest), "--dataset", DATASET, "--version", version, "--no-progress", *extra]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env=env if env is not None else dict(os.environ))


def _assert_one_error(result: subprocess.CompletedProcess[str], code: int | None = None) -> str:
    """The CLI failed with exactly one ``error:`` line and no traceback; returns that line."""
    assert result.returncode != 0, result.stdout
    if code is not None:
        assert result.returncode == code, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    print(f"\n{lines[0]}")
    return lines[0]


def _read_csv(path: Path | str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _rejects(version: Path) -> dict[str, dict[str, str]]:
    return {row["filename"]: row for row in _read_csv(version / "rejects.csv")}


def _snapshot(*paths: Path) -> dict[str, bytes]:
    """Every file's bytes under the given files and folders (to compare before/after)."""
    out: dict[str, bytes] = {}
    for path in paths:
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        out.update({str(p): p.read_bytes() for p in files})
    assert out, paths
    return out


def _records(version: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(manifest, {filename: record}) read back with TensorFlow."""
    manifest, splits = read_version(Storage(), str(version))
    records = {r["image/filename"].decode(): r for split in splits.values() for r in split}
    assert len(records) == manifest["num_records"]
    for record in records.values():
        assert record["decoded_shape"] == (record["image/height"], record["image/width"], record["image/channels"])
    return manifest, records


def _images_in(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _stage_config(source: Path, tmp_path: Path, **kwargs: Any) -> BuildConfig:
    return BuildConfig(source=str(source), destination=str(tmp_path / "out"), dataset=DATASET, version="v1",
                       **kwargs)


def _staged_files(cfg: BuildConfig) -> dict[str, bytes]:
    root = Path(cfg.staging_uri)
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _capless_or_skip(tmp_path: Path) -> list[str]:
    """The setpriv prefix under which root obeys file modes; skip if that cannot be had here."""
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv is not installed: cannot run without capabilities")
    probe = tmp_path / "mode-000-probe"
    probe.write_bytes(b"secret")
    probe.chmod(0)
    try:
        result = subprocess.run([*CAPLESS, "cat", str(probe)], capture_output=True, timeout=30)
    finally:
        probe.chmod(0o600)
        probe.unlink()
    if result.returncode == 0:
        pytest.skip("a capability-less root still reads mode-000 files here (file modes are not enforced)")
    return CAPLESS


@contextlib.contextmanager
def _tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A fresh tmpfs of ``size`` mounted at ``where`` (skip if mounting is not allowed); always unmounted."""
    where.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                            capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.strip() or result.returncode}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=60)


def _run_measuring_rss(cmd: list[str], tmp_path: Path, timeout: float = 600) -> tuple[int, str, str, dict[int, int]]:
    """Run ``cmd``; sample VmHWM (peak RSS, bytes) of it and its children every ~20 ms.

    Returns (exit status, stdout, stderr, {pid: peak RSS seen})."""
    out_path, err_path = tmp_path / "rss-stdout.txt", tmp_path / "rss-stderr.txt"
    peaks: dict[int, int] = {}
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err)
        deadline = time.monotonic() + timeout
        try:
            parent = psutil.Process(proc.pid)
            while proc.poll() is None:
                if time.monotonic() > deadline:
                    pytest.fail(f"{cmd} still running after {timeout} s")
                try:
                    pids = [proc.pid, *(c.pid for c in parent.children(recursive=True))]
                except psutil.NoSuchProcess:
                    pids = []
                for pid in pids:
                    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
                        for line in status:
                            if line.startswith("VmHWM:"):
                                peaks[pid] = max(peaks.get(pid, 0), int(line.split()[1]) * 1024)
                time.sleep(0.02)
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    return proc.returncode, out_path.read_text(), err_path.read_text(), peaks


def _run_guarded(fn: Any, timeout: float, unblock: Path | None = None) -> Any:
    """Run ``fn()`` in a thread; fail (instead of hanging) if it has not returned after ``timeout`` s.

    On a hang, ``unblock`` (a FIFO) is opened for writing so a reader stuck opening it is released."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as exc:  # reported below, in the test's thread
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        if unblock is not None:
            with contextlib.suppress(OSError):
                os.close(os.open(unblock, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(10)
        pytest.fail(f"still blocked after {timeout} s (reading a FIFO?)")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _remove_nested(top: Path) -> None:
    """Remove a chain of nested folders ``top/d/d/...`` without recursion."""
    chain = [top]
    while (chain[-1] / "d").is_dir() and not (chain[-1] / "d").is_symlink():
        chain.append(chain[-1] / "d")
    for folder in reversed(chain):
        for entry in folder.iterdir():
            if not entry.is_dir() or entry.is_symlink():
                entry.unlink()
        folder.rmdir()


# -- 1. a file or a folder swapped for a symlink between listing and reading --------------------------
@pytest.mark.parametrize("target", ["outside_jpeg", "dev_zero"])
def test_file_swapped_for_symlink_after_listing_is_not_followed(target: str, sample_dir: Path,
                                                                 tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    outside = tmp_path / "outside" / "secret.jpg"
    outside.parent.mkdir()
    outside.write_bytes(_image("JPEG", seed=4242))
    secret_sha = hashlib.sha256(outside.read_bytes()).hexdigest()
    cfg = _stage_config(src, tmp_path)
    storage = Storage()
    assert stages.discover_stage(cfg, storage)["candidates"] == 60

    victim = src / "circles" / "circle_001.jpg"
    victim.unlink()
    victim.symlink_to(outside if target == "outside_jpeg" else Path("/dev/zero"))
    result = _run_guarded(lambda: stages.inspect_stage(cfg, storage, workers=2), timeout=120)
    result = {k: result[k] for k in ("inspected", "rejected")}

    assert result == {"inspected": 59, "rejected": 1}
    rejects = _read_csv(Path(cfg.staging_uri) / stages.INSPECT_REJECTS)
    assert [(r["filename"], r["reason"]) for r in rejects] == [("circles/circle_001.jpg", "not_a_regular_file")]
    assert "symlink" in rejects[0]["detail"]
    inspected = [r for r in _read_csv(Path(cfg.staging_uri) / stages.INSPECTED) if not r["reason"]]  # the images
    assert "circles/circle_001.jpg" not in {r["filename"] for r in inspected}
    staged = _staged_files(cfg)
    assert secret_sha not in staged[stages.INSPECTED].decode()
    for name, data in staged.items():
        assert secret_sha.encode() not in data and outside.read_bytes() not in data, name


def test_class_folder_swapped_for_symlink_after_listing_is_not_followed(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    names = sorted(p.name for p in (src / "circles").iterdir())
    outside = tmp_path / "outside" / "circles"
    outside.mkdir(parents=True)
    for i, name in enumerate(names):  # same names, other (valid) images
        (outside / name).write_bytes(_image("PNG" if name.endswith(".png") else "JPEG", seed=7000 + i))
    outside_shas = {hashlib.sha256(p.read_bytes()).hexdigest() for p in outside.iterdir()}
    cfg = _stage_config(src, tmp_path, max_reject_fraction=1)
    storage = Storage()
    assert stages.discover_stage(cfg, storage)["candidates"] == 60

    shutil.rmtree(src / "circles")
    (src / "circles").symlink_to(outside, target_is_directory=True)
    result = _run_guarded(lambda: stages.inspect_stage(cfg, storage, workers=2), timeout=120)
    result = {k: result[k] for k in ("inspected", "rejected")}

    assert result == {"inspected": 40, "rejected": 20}
    rejects = _read_csv(Path(cfg.staging_uri) / stages.INSPECT_REJECTS)
    assert {r["filename"]: r["reason"] for r in rejects} == {f"circles/{n}": "not_a_regular_file" for n in names}
    inspected = [r for r in _read_csv(Path(cfg.staging_uri) / stages.INSPECTED) if not r["reason"]]  # the images
    assert not any(r["filename"].startswith("circles/") for r in inspected)
    assert not outside_shas & {r["sha256"] for r in inspected}
    staged = _staged_files(cfg)
    for sha in outside_shas:
        assert sha not in staged[stages.INSPECTED].decode()
        assert all(sha.encode() not in data for data in staged.values())


# -- 2. a file swapped for a FIFO between listing and reading -----------------------------------------
@pytest.mark.timeout(180)
def test_file_swapped_for_fifo_after_listing_does_not_block(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    cfg = _stage_config(src, tmp_path)
    storage = Storage()
    stages.discover_stage(cfg, storage)
    victim = src / "squares" / "square_002.jpg"
    victim.unlink()
    os.mkfifo(victim)

    result = _run_guarded(lambda: stages.inspect_stage(cfg, storage, workers=2), timeout=60, unblock=victim)
    result = {k: result[k] for k in ("inspected", "rejected")}

    assert result == {"inspected": 59, "rejected": 1}
    rejects = _read_csv(Path(cfg.staging_uri) / stages.INSPECT_REJECTS)
    assert [(r["filename"], r["reason"]) for r in rejects] == [("squares/square_002.jpg", "not_a_regular_file")]
    assert "fifo" in rejects[0]["detail"]


# -- 3. symlinks, FIFOs and sockets named like images at listing time ---------------------------------
@pytest.mark.timeout(400)
def test_special_entries_named_like_images_are_skipped_and_counted(sample_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.jpg").write_bytes(_image("JPEG", seed=99))
    (src / "squares" / "link.jpg").symlink_to(outside / "secret.jpg")
    (src / "triangles" / "dirlink.jpg").symlink_to(outside, target_is_directory=True)
    os.mkfifo(src / "circles" / "fifo.jpg")
    (src / "circles" / ".hidden.jpg").write_bytes(_image("JPEG", seed=98))
    (src / "squares" / "notes.txt").write_text("not an image\n")
    monkeypatch.chdir(src / "circles")  # keeps the socket path short (AF_UNIX paths are <= 107 bytes)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("sock.png")
        sock.listen(1)
        assert (src / "circles" / "sock.png").is_socket()
        result = _cli(src, tmp_path / "out", "--workers", "2", timeout=300)

    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    manifest, records = _records(version)
    assert manifest["skipped_by_kind"] == {"fifo": 1, "socket": 1, "symlink": 2, "not_an_image_name": 2}
    assert manifest["num_skipped"] == 6
    assert manifest["num_rejected"] == 0 and _rejects(version) == {}
    assert set(records) == set(_images_in(sample_dir))
    secret = hashlib.sha256((outside / "secret.jpg").read_bytes()).hexdigest()
    assert secret not in {r["image/sha256"].decode() for r in records.values()}


# -- 4. a file name that is not UTF-8 ---------------------------------------------------------------------
def test_name_that_is_not_utf8_is_a_reject_and_the_rest_is_published(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    fd = os.open(os.fsencode(src / "circles") + b"/caf\xe9.png", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(_image("PNG", seed=5))

    result = _cli(src, tmp_path / "out", "--workers", "2")

    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    rejects = _rejects(version)
    assert set(rejects) == {"circles/caf\\xe9.png"}, rejects  # a literal backslash-x-e-9 escape
    assert rejects["circles/caf\\xe9.png"]["reason"] == "bad_filename"
    raw = (version / "rejects.csv").read_bytes()
    raw.decode("utf-8")  # the published CSV is valid UTF-8
    assert b"caf\\xe9.png" in raw
    manifest, records = _records(version)
    assert manifest["rejects_by_reason"] == {"bad_filename": 1}
    expected = _images_in(sample_dir)
    assert set(records) == set(expected)
    for name, record in records.items():
        assert record["image/sha256"].decode() == hashlib.sha256(expected[name]).hexdigest()


# -- 5. permission problems, run by a root without capabilities (obeys file modes) -----------------------
def test_unreadable_file_and_folder_are_rejects(sample_dir: Path, tmp_path: Path) -> None:
    capless = _capless_or_skip(tmp_path)
    src = _copy_sample(sample_dir, tmp_path)
    locked_file = src / "circles" / "circle_001.jpg"
    locked_folder = src / "diamonds"
    locked_folder.mkdir()
    (locked_folder / "d1.png").write_bytes(_image("PNG", seed=1))
    (locked_folder / "d2.png").write_bytes(_image("PNG", seed=2))
    locked_file.chmod(0)
    locked_folder.chmod(0)
    try:
        result = _cli(src, tmp_path / "out", "--workers", "2", prefix=capless)
    finally:
        locked_folder.chmod(0o755)
        locked_file.chmod(0o644)

    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    rejects = _rejects(version)
    assert {name: row["reason"] for name, row in rejects.items()} == {
        "circles/circle_001.jpg": "unreadable", "diamonds/": "unreadable"}
    assert "permission denied" in rejects["circles/circle_001.jpg"]["detail"].lower()
    assert "permission denied" in rejects["diamonds/"]["detail"].lower()
    manifest, records = _records(version)
    assert manifest["classes"] == ["circles", "squares", "triangles"]
    assert set(records) == set(_images_in(sample_dir)) - {"circles/circle_001.jpg"}


# -- 6. 1000 nested folders ----------------------------------------------------------------------------
def test_thousand_nested_folders_are_one_reject(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    fd = os.open(src / "circles", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(1000):
            os.mkdir("d", dir_fd=fd)
            child = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        deep = os.open("x.png", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        with os.fdopen(deep, "wb") as f:
            f.write(_image("PNG", seed=3))
    finally:
        os.close(fd)

    try:
        result = _cli(src, tmp_path / "out", "--workers", "2")
    finally:
        _remove_nested(src / "circles" / "d")  # pytest's own (recursive) cleanup could not remove it

    assert "RecursionError" not in result.stderr
    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    rejects = _rejects(version)
    assert len(rejects) == 1, rejects
    (name, row), = rejects.items()
    assert row["reason"] == "path_too_long"
    assert name.startswith("circles/d/d/") and name.endswith("/"), name
    _, records = _records(version)
    assert set(records) == set(_images_in(sample_dir))


# -- 7. labels.csv mode: huge field, invalid UTF-8, symlinked labels.csv ---------------------------------
def _labels_source(sample_dir: Path, tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """imgs/ with 12 sample images (4 per class); returns (source, {filename: label})."""
    src = tmp_path / "src"
    (src / "imgs").mkdir(parents=True)
    labels = {}
    for cls in ("circles", "squares", "triangles"):
        for path in sorted((sample_dir / cls).iterdir())[:4]:
            shutil.copy(path, src / "imgs" / path.name)
            labels[f"imgs/{path.name}"] = cls
    return src, labels


def test_labels_csv_bad_rows_are_rejects_and_later_rows_are_used(sample_dir: Path, tmp_path: Path) -> None:
    src, labels = _labels_source(sample_dir, tmp_path)
    items = [f"{name},{label}\n".encode() for name, label in labels.items()]
    content = (b"filename,label\n" + b"".join(items[:3])
               + b"imgs/ghost-big.jpg," + b"x" * (2 * MB) + b"\n"   # a 2 MB label
               + b"".join(items[3:7])
               + b"imgs/ghost-latin1.jpg,caf\xe9\n"                 # not UTF-8
               + b"".join(items[7:]))
    (src / "labels.csv").write_bytes(content)

    result = _cli(src, tmp_path / "out", "--workers", "2", "--max-reject-fraction", "0.5")

    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    rejects = _rejects(version)
    assert [row["reason"] for row in rejects.values()] == ["bad_row", "bad_row"], rejects
    assert all(name.startswith("labels.csv:") for name in rejects), rejects
    assert any("not valid UTF-8" in row["detail"] for row in rejects.values()), rejects
    assert (version / "rejects.csv").stat().st_size < 10_000  # the 2 MB field is not copied into it
    published = {row["filename"]: row["label"] for row in _read_csv(version / "labels.csv")}
    assert published == labels  # every good row, including those after the bad ones
    _, records = _records(version)
    assert set(records) == set(labels)


def test_symlinked_labels_csv_fails_with_one_line(sample_dir: Path, tmp_path: Path) -> None:
    src, labels = _labels_source(sample_dir, tmp_path)
    real = tmp_path / "elsewhere.csv"
    real.write_text("filename,label\n" + "".join(f"{n},{lab}\n" for n, lab in labels.items()))
    (src / "labels.csv").symlink_to(real)

    result = _cli(src, tmp_path / "out")

    line = _assert_one_error(result, code=1)
    assert "labels.csv" in line and "regular file" in line, line
    assert not (tmp_path / "out" / DATASET / "v1").exists()


# -- 8. big files: sparse multi-GB, --max-file-mb, a big file that is not an image -------------------------
@pytest.mark.timeout(600)
def test_huge_files_are_rejected_without_being_read(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    big = src / "circles" / "big.jpg"
    with open(big, "wb") as f:
        f.write(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")
    os.truncate(big, 3 * 10**9)
    huge = src / "circles" / "huge.png"
    with open(huge, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
    os.truncate(huge, 40 * 10**9)
    with open(src / "squares" / "blob.jpg", "wb") as f:  # 100 MB, really written, not an image
        f.write(b"NOT AN IMAGE")
        chunk = bytes(range(256)) * 4096
        for _ in range(100 * MB // len(chunk)):
            f.write(chunk)

    cmd = [sys.executable, "-m", "image_tfrecords", "build", "--source", str(src), "--destination",
           str(tmp_path / "out"), "--dataset", DATASET, "--version", "v1", "--workers", "2", "--no-progress"]
    code, _, err, peaks = _run_measuring_rss(cmd, tmp_path)

    assert code == 0, err
    peak, total = max(peaks.values()), sum(peaks.values())
    print(f"\npeak RSS (VmHWM): largest process {peak / 2**20:.0f} MiB, sum over {len(peaks)} processes "
          f"{total / 2**20:.0f} MiB")
    assert peak < 400 * 2**20, f"peak RSS {peak / 2**20:.0f} MiB (per process: {peaks})"
    version = tmp_path / "out" / DATASET / "v1"
    rejects = _rejects(version)
    assert {n: r["reason"] for n, r in rejects.items()} == {
        "circles/big.jpg": "too_large", "circles/huge.png": "too_large", "squares/blob.jpg": "not_an_image"}
    assert "max_file_mb 256" in rejects["circles/huge.png"]["detail"]
    _, records = _records(version)
    assert set(records) == set(_images_in(sample_dir))


def test_max_file_mb_rejects_a_normal_image(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    tiny = {}
    for i, cls in enumerate(("circles", "squares", "triangles")):
        data = _image("PNG", seed=500 + i, size=(4, 4))
        assert len(data) < 1000
        (src / cls / "tiny.png").write_bytes(data)
        tiny[f"{cls}/tiny.png"] = data

    result = _cli(src, tmp_path / "out", "--max-file-mb", "0.001", "--max-reject-fraction", "1")

    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    rejects = _rejects(version)
    assert {n: r["reason"] for n, r in rejects.items()} == {name: "too_large" for name in _images_in(sample_dir)}
    assert all("max_file_mb 0.001" in r["detail"] for r in rejects.values())
    _, records = _records(version)
    assert set(records) == set(tiny)


# -- 9. destination checks ---------------------------------------------------------------------------------
def test_destination_that_is_a_file(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    dest = tmp_path / "dest-file"
    dest.write_bytes(b"keep me")
    line = _assert_one_error(_cli(src, dest), code=1)
    assert "is a file" in line or "Not a directory" in line, line
    assert dest.read_bytes() == b"keep me"


def test_destination_inside_the_source(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    before = sorted(p.relative_to(src).as_posix() for p in src.rglob("*"))
    line = _assert_one_error(_cli(src, src / "out"), code=1)
    assert "inside the source" in line, line
    assert sorted(p.relative_to(src).as_posix() for p in src.rglob("*")) == before  # nothing written there


def test_s3_typo_destination(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    assert not (ROOT / "s3:").exists()
    line = _assert_one_error(_cli(src, "s3:/bucket/x"), code=2)
    assert "s3://bucket/x" in line, line
    assert not (ROOT / "s3:").exists() and not (tmp_path / "s3:").exists()


def test_read_only_destination_leaves_previous_version(sample_dir: Path, tmp_path: Path) -> None:
    capless = _capless_or_skip(tmp_path)
    src = _copy_sample(sample_dir, tmp_path)
    dest = tmp_path / "out"
    assert _cli(src, dest, "--workers", "2").returncode == 0
    dataset = dest / DATASET
    before = _snapshot(dataset / "v1", dataset / "latest.json")
    (src / "circles" / "new.png").write_bytes(_image("PNG", seed=77))
    dataset.chmod(0o555)
    try:
        result = _cli(src, dest, "--workers", "2", version="v2", prefix=capless)
    finally:
        dataset.chmod(0o755)
    line = _assert_one_error(result, code=1)
    assert "permission denied" in line.lower(), line
    assert _snapshot(dataset / "v1", dataset / "latest.json") == before
    assert not (dataset / "v2").exists()


@pytest.mark.timeout(600)
def test_full_destination_leaves_previous_version(sample_dir: Path, tmp_path: Path) -> None:
    src = _copy_sample(sample_dir, tmp_path)
    with _tmpfs(tmp_path / "small", "2m") as dest:
        first = _cli(src, dest, "--workers", "2")
        assert first.returncode == 0, first.stderr
        dataset = dest / DATASET
        before = _snapshot(dataset / "v1", dataset / "latest.json")
        added = 0
        for i in range(30):  # ~5.9 MB of incompressible images
            data = _image("PNG", seed=9000 + i, size=(256, 256))
            (src / ("circles", "squares", "triangles")[i % 3] / f"noise-{i:02d}.png").write_bytes(data)
            added += len(data)
        assert added > 5 * MB

        result = _cli(src, dest, "--workers", "2", version="v2")

        line = _assert_one_error(result, code=1)
        assert "no space left" in line.lower(), line
        assert _snapshot(dataset / "v1", dataset / "latest.json") == before
        assert json.loads((dataset / "latest.json").read_text()) == {"version": "v1"}
        assert not (dataset / "v2" / "_SUCCESS").exists()


@pytest.mark.timeout(600)
def test_full_temp_dir_fails_with_one_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    for cls in ("a", "b", "c"):
        (src / cls).mkdir(parents=True)
    for i in range(900):  # distinct tiny images: discovery's temporary table of them is far more than 16 KiB
        (src / ("a", "b", "c")[i % 3] / f"img-{i:04d}.png").write_bytes(_image("PNG", seed=i, size=(3, 3)))
    dest = tmp_path / "out"
    first = _cli(src, dest, "--workers", "2")
    assert first.returncode == 0, first.stderr
    dataset = dest / DATASET
    before = _snapshot(dataset / "v1", dataset / "latest.json")
    (src / "a" / "extra.png").write_bytes(_image("PNG", seed=12345, size=(3, 3)))
    with _tmpfs(tmp_path / "tinytmp", "16k") as tiny:
        result = _cli(src, dest, "--workers", "2", version="v2", env={**os.environ, "TMPDIR": str(tiny)})
        assert not list(tiny.iterdir()), "temporary files left behind"
    line = _assert_one_error(result, code=1)
    assert "no space left" in line.lower() or "temporary" in line.lower(), line
    assert _snapshot(dataset / "v1", dataset / "latest.json") == before
    assert not (dataset / "v2").exists()


# -- 10. S3 keys that are not clean relative paths (real SeaweedFS) -----------------------------------------
ODD_KEYS = {"circles//a.png": 801, "/circles/b.png": 802, "circles/./c.png": 803, "circles/../d.png": 804,
            "circles/e/": 805}


def _s3_normal_source(client: Any, bucket: str, sample_dir: Path) -> tuple[dict[str, bytes], dict[str, int]]:
    """Upload 13 images and a zero-byte folder marker under src/; returns ({key: bytes}, {listed key: size})."""
    normal = {"circles/a.png": _image("PNG", seed=800)}
    for cls in ("circles", "squares", "triangles"):
        for path in sorted((sample_dir / cls).iterdir())[:4]:
            normal[f"{cls}/{path.name}"] = path.read_bytes()
    for key, data in normal.items():
        client.put_object(Bucket=bucket, Key=f"src/{key}", Body=data)
    client.put_object(Bucket=bucket, Key="src/squares/marker/", Body=b"")  # a console's folder marker
    listed = {o["Key"][len("src/"):]: o["Size"] for o in
              client.list_objects_v2(Bucket=bucket, Prefix="src/").get("Contents", [])}
    return normal, listed


def test_s3_folder_marker_is_skipped_not_rejected(s3_server: Any, bucket: str, s3_env: dict[str, str],
                                                  sample_dir: Path, tmp_path: Path) -> None:
    normal, listed = _s3_normal_source(s3_server.client(), bucket, sample_dir)
    if listed.get("squares/marker/") != 0:
        pytest.skip(f"SeaweedFS does not list the zero-byte key 'squares/marker/' (listed: {sorted(listed)})")

    result = _cli(f"s3://{bucket}/src", tmp_path / "out", "--workers", "1", env={**os.environ, **s3_env})

    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    assert _rejects(version) == {}
    manifest, records = _records(version)
    assert manifest["skipped_by_kind"] == {"folder_marker": 1} and manifest["num_skipped"] == 1
    assert {k: r["image/sha256"].decode() for k, r in records.items()} == {
        k: hashlib.sha256(v).hexdigest() for k, v in normal.items()}


@pytest.mark.timeout(600)
@pytest.mark.parametrize("odd", list(ODD_KEYS))
def test_s3_key_that_is_not_a_clean_path_is_a_reject(odd: str, s3_server: Any, bucket: str,
                                                     s3_env: dict[str, str], sample_dir: Path,
                                                     tmp_path: Path) -> None:
    client = s3_server.client()
    odd_bytes = _image("PNG", seed=ODD_KEYS[odd])
    from botocore.exceptions import ClientError

    try:  # first: a normalised copy of it is overwritten by the normal objects below
        client.put_object(Bucket=bucket, Key=f"src/{odd}", Body=odd_bytes)
    except ClientError as exc:
        pytest.skip(f"SeaweedFS refuses the key {odd!r}: {exc}")
    normal, listed = _s3_normal_source(client, bucket, sample_dir)
    if listed.get(odd) != len(odd_bytes):
        pytest.skip(f"SeaweedFS does not keep the key {odd!r} verbatim (listed: {sorted(listed)})")
    assert all(listed.get(k) == len(v) for k, v in normal.items()), listed

    result = _cli(f"s3://{bucket}/src", tmp_path / "out", "--workers", "1", "--max-reject-fraction", "1",
                  env={**os.environ, **s3_env})

    assert result.returncode == 0, result.stderr
    version = tmp_path / "out" / DATASET / "v1"
    rejects = _rejects(version)
    assert {n: r["reason"] for n, r in rejects.items()} == {odd: "bad_key"}
    labels = {row["filename"]: row for row in _read_csv(version / "labels.csv")}
    assert set(labels) == set(normal)
    for key, data in normal.items():
        assert labels[key]["sha256"] == hashlib.sha256(data).hexdigest(), key
    manifest, records = _records(version)
    assert set(records) == set(normal)
    assert records["circles/a.png"]["image/sha256"].decode() == hashlib.sha256(normal["circles/a.png"]).hexdigest()
    odd_sha = hashlib.sha256(odd_bytes).hexdigest().encode()
    for path in version.rglob("*"):
        if path.is_file():
            content = path.read_bytes()
            assert odd_bytes not in content and odd_sha not in content, path
    if listed.get("squares/marker/") == 0:
        assert manifest["skipped_by_kind"].get("folder_marker") == 1, manifest["skipped_by_kind"]
