"""Stopping the CLI (SIGTERM, Ctrl-C, SIGKILL), the version lock between two builds, failed builds, and `clean`.

Slowness is deterministic and needs no production hook: a launcher script (written into tmp_path)
wraps ``read_source`` with a sleep before calling ``cli.main``; the worker processes are forked,
so they inherit the wrapper. ``SLOW_INSPECT`` slows the reads of inspection, ``SLOW_WRITE`` those
of shard writing (told apart by the calling function's name).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.published.locking import LOCK_FILE, LeaseKeeper, read_lock
from image_tfrecords.storage import Storage, join
from tests.support import one_line
from tests.tf_reader import read_version

ROOT = Path(__file__).resolve().parents[2]
DATASET = "ds"

LAUNCHER = """\
import os
import sys
import time

sys.path.insert(0, {root!r})

import image_tfrecords.cli as cli
import image_tfrecords.shards.writer as writer
import image_tfrecords.source.reading as reading
import image_tfrecords.stages as stages

DELAYS = {{"fetch_one": float(os.environ.get("SLOW_INSPECT", "0")),  # (the readers' names: who calls read_source)
           "_source_bytes": float(os.environ.get("SLOW_WRITE", "0"))}}
_original = reading.read_source


def slow_read_source(*args, **kwargs):
    delay = DELAYS.get(sys._getframe(1).f_code.co_name, 0.0)
    if delay:
        time.sleep(delay)
    return _original(*args, **kwargs)


reading.read_source = slow_read_source
stages.inspect.read_source = slow_read_source
writer.read_source = slow_read_source
sys.exit(cli.main(sys.argv[1:]))
"""


# -- helpers -----------------------------------------------------------------------------------------
def _launcher(tmp_path: Path) -> Path:
    path = tmp_path / "slow_cli.py"
    if not path.exists():
        path.write_text(LAUNCHER.format(root=str(ROOT)))
    return path


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("SLOW_INSPECT", "SLOW_WRITE")}
    return {**env, "TMPDIR": str(tmpdir), **extra}


def _source(sample_dir: Path, tmp_path: Path) -> Path:
    src = tmp_path / "src"
    if not src.exists():
        shutil.copytree(sample_dir, src)
    return src


def _build_args(src: Path, dest: Path, version: str, workers: int = 2) -> list[str]:
    return ["build", "--source", str(src), "--destination", str(dest), "--dataset", DATASET,
            "--version", version, "--workers", str(workers), "--no-progress"]


def _start_slow(tmp_path: Path, args: list[str], **slow: str) -> subprocess.Popen[str]:
    """The CLI with slow reads, in a session of its own (its own process group, as a shell job).

    Its output goes to files, not pipes: a worker that outlived it would hold a pipe open, and
    reading the output would then hang instead of failing the test.
    """
    logs = tmp_path / "logs"
    logs.mkdir(exist_ok=True)
    n = len(list(logs.iterdir())) // 2
    with open(logs / f"{n}.out", "w") as out, open(logs / f"{n}.err", "w") as err:
        proc = subprocess.Popen([sys.executable, str(_launcher(tmp_path)), *args], cwd=ROOT,
                                env=_env(tmp_path, **slow), stdout=out, stderr=err, text=True,
                                start_new_session=True)
    proc.logs = (logs / f"{n}.out", logs / f"{n}.err")  # type: ignore[attr-defined]
    return proc


def _finish(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """Wait for the CLI to end; its (stdout, stderr)."""
    proc.wait(timeout=timeout)
    out, err = proc.logs  # type: ignore[attr-defined]
    return out.read_text(), err.read_text()


def _reap(proc: subprocess.Popen[str], workers: list[psutil.Process]) -> None:
    """Leave no process of a test behind, whatever happened (by pid, never by name)."""
    if proc.poll() is None:  # not reaped yet: its pid, hence its process group id, is still ours
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    for worker in workers:
        if not _gone(worker):
            with contextlib.suppress(psutil.Error):
                worker.kill()


def _run_cli(tmp_path: Path, *args: str, env: dict[str, str] | None = None,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "image_tfrecords", *args], cwd=ROOT,
                          env=env or _env(tmp_path), capture_output=True, text=True, timeout=timeout)


def _wait_for(what: str, predicate: Callable[[], Any], proc: subprocess.Popen[str] | None = None,
              timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            out, err = _finish(proc, 0)
            pytest.fail(f"the CLI ended (status {proc.returncode}) before {what}:\n{out}\n{err}")
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


def _children(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _gone(process: psutil.Process) -> bool:
    """Not running any more (a zombie that only waits to be reaped by init counts as gone)."""
    try:
        return not process.is_running() or process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with its sha256 (folders as 'dir')."""
    if not folder.exists():
        return {}
    return {p.relative_to(folder).as_posix(): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(folder.rglob("*"))}


def _temporaries(folder: Path) -> list[str]:
    return [p.as_posix() for p in folder.rglob(f"{stages.TMP_PREFIX}*")] if folder.exists() else []


def _staging(dest: Path, version: str) -> Path:
    return dest / DATASET / "_staging" / version


def _assert_published(dest: Path, version: str, src: Path) -> None:
    """The version is complete: _SUCCESS, latest.json, no staging, and every source image read back by tf.data."""
    final = dest / DATASET / version
    assert (final / "_SUCCESS").is_file()
    assert not _staging(dest, version).exists()
    manifest, splits = read_version(Storage(), str(final))
    names = sorted(r["image/filename"].decode() for records in splits.values() for r in records)
    sources = sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    assert names == sources
    assert manifest["num_records"] == len(sources) == 60
    assert all(len(r["decoded_shape"]) == 3 for records in splits.values() for r in records)


def _stage_until_plan(src: Path, dest: str, version: str, storage: Storage | None = None) -> str:
    """Run discover..plan in this process (what an interrupted build leaves); returns the staging URI."""
    cfg = BuildConfig(source=str(src), destination=dest, dataset=DATASET, version=version)
    storage = storage or Storage()
    stages.discover_stage(cfg, storage)
    stages.inspect_stage(cfg, storage, workers=2)
    stages.split_stage(cfg, storage)
    stages.plan_stage(cfg, storage)
    return cfg.staging_uri


def _writing(proc: subprocess.Popen[str], staging: Path, what: str = "a shard being written") -> None:
    """Wait until the build's pool runs and a shard is being written (its temporary folder exists)."""
    _wait_for(what, lambda: (staging / stages.PLAN).is_file() and len(_children(proc.pid)) >= 2
              and _temporaries(staging / "shards"), proc)


def _age(folder: Path, hours: float) -> None:
    past = time.time() - hours * 3600
    for path in [folder, *folder.rglob("*")]:
        os.utime(path, (past, past))


# -- 1-3. SIGTERM / SIGINT: one line, no orphans, no temporary files, lock released, resumable ---------
@pytest.mark.parametrize(("signame", "phase"), [("SIGTERM", "inspect"), ("SIGINT", "inspect"),
                                                ("SIGTERM", "write"), ("SIGINT", "write")])
def test_signal_stops_build_cleanly_and_rerun_resumes(signame: str, phase: str, sample_dir: Path,
                                                      tmp_path: Path) -> None:
    src, dest = _source(sample_dir, tmp_path), tmp_path / "out"
    staging = _staging(dest, "v1")
    slow = {"SLOW_INSPECT": "0.2"} if phase == "inspect" else {"SLOW_WRITE": "0.5"}
    proc = _start_slow(tmp_path, _build_args(src, dest, "v1"), **slow)
    workers: list[psutil.Process] = []
    try:
        if phase == "inspect":
            _wait_for("2 workers and discovered.csv",
                      lambda: len(_children(proc.pid)) >= 2 and (staging / stages.DISCOVERED).is_file(), proc)
        else:  # a worker is inside write_shard: its temporary folder exists in staging/shards
            _writing(proc, staging)
        time.sleep(0.3)
        workers = _children(proc.pid)
        assert len(workers) >= 2
        assert (staging / LOCK_FILE).is_file()
        sig = getattr(signal, signame)
        sent = time.monotonic()
        if sig == signal.SIGINT:  # a terminal's Ctrl-C goes to the whole foreground process group
            os.killpg(os.getpgid(proc.pid), sig)
        else:  # `kill PID`, docker stop: only the parent gets it
            os.kill(proc.pid, sig)
        _, err = _finish(proc, 30)
        took = time.monotonic() - sent
        still = [w.pid for w in workers if not _gone(w)]
    finally:
        _reap(proc, workers)
    assert proc.returncode == 128 + sig, err
    assert took < 3, f"took {took:.1f} s to stop"  # observed: under 0.1 s
    line = one_line(err)
    assert line.startswith(f"interrupted by {signame}"), line
    assert str(staging) in line and "--version v1" in line and " clean " in line, line
    assert not still, f"workers outlived the CLI: {still}"
    assert os.listdir(tmp_path / "tmp") == [], "the build's temporary folder was left in TMPDIR"
    assert _temporaries(dest) == []
    assert not (staging / LOCK_FILE).exists(), "the lock was not released"
    assert not (dest / DATASET / "latest.json").exists()
    before = _tree(staging)
    assert before, "staging should be kept for a resume"
    time.sleep(1.5)
    assert _tree(staging) == before, "something wrote to staging after the CLI ended"

    rerun = _run_cli(tmp_path, *_build_args(src, dest, "v1"))
    assert rerun.returncode == 0, rerun.stderr
    assert "published ds version v1" in rerun.stdout
    _assert_published(dest, "v1", src)
    assert json.loads((dest / DATASET / "latest.json").read_text())["version"] == "v1"


def test_sigterm_while_a_night_splices_its_shards_side_by_side_stops_promptly(sample_dir: Path,
                                                                              tmp_path: Path) -> None:
    """A night whose few shards are all spliced (each in a pool process of its own, with its new records, every
    read slowed): SIGTERM stops it within seconds, not after every shard in flight is done (the pool's processes
    are ended with the shards they were splicing), and the same command again publishes every image."""
    from image_tfrecords.images.sample import make_sample

    src, dest = _source(sample_dir, tmp_path), tmp_path / "out"
    first = _run_cli(tmp_path, *_build_args(src, dest, "v1"))
    assert first.returncode == 0, first.stderr
    more = tmp_path / "more"
    make_sample(str(more), per_class=6, seed=77)
    for path in more.rglob("*.*"):  # new images into the class folders, under names of their own
        path.rename(src / path.parent.name / f"new-{path.name}")
    staging = _staging(dest, "v2")
    proc = _start_slow(tmp_path, _build_args(src, dest, "v2"), SLOW_WRITE="0.15")
    workers: list[psutil.Process] = []
    try:
        _writing(proc, staging, "the shards being spliced")
        plan = json.loads((staging / stages.PLAN).read_text())
        assert len(plan["rewrite"]) >= 2 and not [s for t in plan["tasks"] for s in t if s not in plan["rewrite"]]
        time.sleep(0.3)
        workers = _children(proc.pid)
        sent = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        _, err = _finish(proc, 60)
        took = time.monotonic() - sent
        still = [w.pid for w in workers if not _gone(w)]
    finally:
        _reap(proc, workers)
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert took < 3, f"took {took:.1f} s to stop"
    assert one_line(err).startswith("interrupted by SIGTERM")
    assert not still, f"workers outlived the CLI: {still}"
    assert not (staging / LOCK_FILE).exists()
    rerun = _run_cli(tmp_path, *_build_args(src, dest, "v2"))
    assert rerun.returncode == 0, rerun.stderr
    manifest, splits = read_version(Storage(), str(dest / DATASET / "v2"))
    names = sorted(r["image/filename"].decode() for records in splits.values() for r in records)
    assert names == sorted(p.relative_to(src).as_posix() for p in src.rglob("*") if p.is_file())
    assert manifest["build"]["mode"] == "incremental" and manifest["build"]["shards_spliced"] >= 2


# -- 4. SIGKILL: the workers die with the parent; the dead holder's lock is taken over -------------------
def test_sigkill_workers_die_with_parent_and_lock_is_taken_over(sample_dir: Path, tmp_path: Path) -> None:
    src, dest = _source(sample_dir, tmp_path), tmp_path / "out"
    staging = _staging(dest, "v1")
    proc = _start_slow(tmp_path, _build_args(src, dest, "v1"), SLOW_WRITE="0.5")
    workers: list[psutil.Process] = []
    try:
        _writing(proc, staging)
        workers = _children(proc.pid)
        assert len(workers) >= 2
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed = time.monotonic()
        while time.monotonic() < killed + 5 and not all(_gone(w) for w in workers):
            time.sleep(0.05)
        survivors = [w.pid for w in workers if not _gone(w)]
        died_in = time.monotonic() - killed
    finally:
        _reap(proc, workers)  # never leave a stray process behind, even when the test fails
    assert proc.returncode == -signal.SIGKILL
    assert not survivors, f"workers outlived a SIGKILLed parent by 5 s: {survivors}"
    assert died_in < 5
    shards_then = {k: v for k, v in _tree(staging).items() if k.startswith("shards/")}
    time.sleep(1.5)
    assert {k: v for k, v in _tree(staging).items() if k.startswith("shards/")} == shards_then, \
        "a worker wrote a shard after its parent was killed"

    lock = read_lock(Storage(), str(staging))
    assert lock is not None and lock["pid"] == proc.pid  # left behind: SIGKILL cannot be handled
    assert lock["expires"] > time.time() + 60  # its lease is still running: only the dead pid frees it
    started = time.monotonic()
    rerun = _run_cli(tmp_path, *_build_args(src, dest, "v1"))
    assert rerun.returncode == 0, rerun.stderr
    assert time.monotonic() - started < 120
    _assert_published(dest, "v1", src)


# -- 5. two builds of one version: the second fails at once; another version is not blocked ------------
def test_second_build_of_same_version_fails_fast_and_first_completes(sample_dir: Path, tmp_path: Path) -> None:
    src, dest = _source(sample_dir, tmp_path), tmp_path / "out"
    staging = _staging(dest, "v1")
    first = _start_slow(tmp_path, _build_args(src, dest, "v1"), SLOW_INSPECT="0.15")  # ~9 s of inspection
    try:
        _wait_for("the first build's lock", lambda: (staging / LOCK_FILE).is_file(), first)
        owner = read_lock(Storage(), str(staging))
        assert owner is not None and owner["pid"] == first.pid
        started = time.monotonic()
        second = _run_cli(tmp_path, *_build_args(src, dest, "v1"), timeout=120)
        took = time.monotonic() - started
        assert second.returncode == 1, second.stderr
        line = one_line(second.stderr)
        assert line.startswith("error:") and "being built by another process" in line, line
        assert owner["owner"] in line and socket.gethostname() in line and f"pid {first.pid}" in line, line
        assert second.stdout == ""
        assert first.poll() is None, f"the first build ended before the second failed ({took:.1f} s)"
        assert read_lock(Storage(), str(staging)) == owner, "the second build touched the first one's lock"

        other = _run_cli(tmp_path, *_build_args(src, dest, "v2"), timeout=120)  # another version: not blocked
        assert other.returncode == 0, other.stderr
        assert first.poll() is None, "the first build ended before the other version was built"
        out, err = _finish(first, 180)
    finally:
        _reap(first, [])
    assert first.returncode == 0, err
    assert "published ds version v1" in out
    assert took < 10, f"the second build took {took:.1f} s to fail"
    _assert_published(dest, "v1", src)
    _assert_published(dest, "v2", src)
    assert not (dest / DATASET / "_staging").exists()


# -- 7. a failed build: one line, exit 1, lock released, staging kept with its rejects.csv -------------
def test_failed_build_keeps_staging_and_releases_lock(tmp_path: Path) -> None:
    src, dest = tmp_path / "src", tmp_path / "out"
    for label in ("cat", "dog", "owl"):
        (src / label).mkdir(parents=True)
        for i in range(3):
            (src / label / f"{i}.jpg").write_bytes(b"this is not a JPEG at all " * 10)
    result = _run_cli(tmp_path, *_build_args(src, dest, "v1"))
    assert result.returncode == 1, result.stderr
    line = one_line(result.stderr)
    staging = _staging(dest, "v1")
    assert line.startswith("error:") and "no valid images to publish" in line, line
    assert str(staging) in line and "--version v1" in line and " clean " in line, line
    assert not (staging / LOCK_FILE).exists(), "a failed build kept its lock"
    rejects = (staging / stages.REJECTS).read_text().splitlines()
    assert len(rejects) == 1 + 9 and all("not_an_image" in row for row in rejects[1:])
    assert os.listdir(tmp_path / "tmp") == []
    assert _temporaries(dest) == []
    assert not (dest / DATASET / "v1").exists() and not (dest / DATASET / "latest.json").exists()


# -- 6. clean ------------------------------------------------------------------------------------------
def _clean(tmp_path: Path, dest: str, *extra: str, env: dict[str, str] | None = None) -> list[str]:
    result = _run_cli(tmp_path, "clean", "--destination", dest, "--dataset", DATASET, *extra, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout.splitlines()


def _line_for(lines: list[str], uri: str) -> str:
    found = [line for line in lines if f"{uri} (" in line]
    assert len(found) == 1, f"{uri} not reported once in:\n" + "\n".join(lines)
    return found[0]


def test_clean_removes_only_old_unlocked_staging(sample_dir: Path, tmp_path: Path) -> None:
    src, dest = _source(sample_dir, tmp_path), tmp_path / "out"
    published = _run_cli(tmp_path, *_build_args(src, dest, "v1"))
    assert published.returncode == 0, published.stderr
    dataset = dest / DATASET
    old = Path(_stage_until_plan(src, str(dest), "old"))  # an interrupted build, two days ago
    recent = Path(_stage_until_plan(src, str(dest), "recent"))
    held = Path(_stage_until_plan(src, str(dest), "held"))  # old files, but a build holds its lock now
    foreign = Path(_stage_until_plan(src, str(dest), "foreign"))  # a live lock of another process
    dead = Path(_stage_until_plan(src, str(dest), "dead"))  # an unexpired lock of a process that is gone
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for folder, pid in ((foreign, sleeper.pid), (dead, int(gone.stdout))):
        (folder / LOCK_FILE).write_text(json.dumps(
            {"owner": f"cli:{socket.gethostname()}:{pid}:x", "host": socket.gethostname(), "pid": pid,
             "pid_bound": True, "expires": time.time() + 3600, "renewed": "now"}))
    for folder in (old, held, foreign, dead):
        _age(folder, 48)
    keeper = LeaseKeeper(Storage(), str(held))
    keeper.__enter__()
    try:
        assert (held / LOCK_FILE).is_file()
        published_files = _tree(dataset / "v1")
        latest = (dataset / "latest.json").read_bytes()
        everything = _tree(dataset)

        lines = _clean(tmp_path, str(dest), "--dry-run")
        assert _tree(dataset) == everything, "--dry-run removed something"
        assert _line_for(lines, str(old)).startswith("would remove ")
        assert re.search(r" 48(\.0\d)? h old\)$", _line_for(lines, str(old))), _line_for(lines, str(old))
        assert _line_for(lines, str(dead)).startswith("would remove ")
        assert _line_for(lines, str(recent)).startswith("kept ")
        assert _line_for(lines, str(held)).startswith("kept ") and "lock" in _line_for(lines, str(held))
        assert _line_for(lines, str(foreign)).startswith("kept ") and "lock" in _line_for(lines, str(foreign))
        assert not any(str(dataset / "v1") + " " in line or "latest.json" in line for line in lines)
        assert lines[-1].startswith("would remove staging of 2 version(s)"), lines

        lines = _clean(tmp_path, str(dest))  # default grace: 24 h
        assert _line_for(lines, str(old)).startswith("removed ")
        assert _line_for(lines, str(dead)).startswith("removed ")
        assert not old.exists() and not dead.exists()
        assert recent.is_dir() and held.is_dir() and foreign.is_dir()
        assert (held / LOCK_FILE).is_file() and read_lock(Storage(), str(held))["owner"] == keeper.owner
        assert lines[-1].startswith("removed staging of 2 version(s)"), lines

        lines = _clean(tmp_path, str(dest), "--older-than-hours", "0")  # all but those in use
        assert _line_for(lines, str(recent)).startswith("removed ")
        assert not recent.exists()
        assert held.is_dir() and foreign.is_dir()
        assert "lock" in _line_for(lines, str(held)) and "lock" in _line_for(lines, str(foreign))
    finally:
        keeper.__exit__(None, None, None)
        sleeper.kill()
        sleeper.wait()
    lines = _clean(tmp_path, str(dest), "--older-than-hours", "0")  # the holders are gone now
    assert _line_for(lines, str(held)).startswith("removed ") and _line_for(lines, str(foreign)).startswith("removed ")
    assert not (dataset / "_staging").exists()
    assert _tree(dataset / "v1") == published_files
    assert (dataset / "latest.json").read_bytes() == latest
    assert _clean(tmp_path, str(dest)) == [f"no staging under {dataset}"]


def test_clean_refuses_a_negative_grace(tmp_path: Path) -> None:
    result = _run_cli(tmp_path, "clean", "--destination", str(tmp_path / "out"), "--dataset", DATASET,
                      "--older-than-hours", "-1")
    assert result.returncode == 2
    assert one_line(result.stderr).startswith("error:")


def test_clean_on_s3(sample_dir: Path, tmp_path: Path, bucket: str, s3_env: dict[str, str]) -> None:
    storage = Storage()
    dest = f"s3://{bucket}/out"
    dataset = join(dest, DATASET)
    src = _source(sample_dir, tmp_path)
    done = _stage_until_plan(src, dest, "stopped", storage)
    busy = _stage_until_plan(src, dest, "busy", storage)
    storage.write_bytes(join(dataset, "v0", "_SUCCESS"), b"published\n")
    storage.write_bytes(join(dataset, "latest.json"), b'{"version": "v0"}\n')
    env = _env(tmp_path, **s3_env)

    def keys(uri: str) -> set[str]:
        return {info.key for info in storage.iter_files(uri, everything=True)}

    with LeaseKeeper(storage, busy) as keeper:
        before = keys(dataset)
        lines = _clean(tmp_path, dest, "--older-than-hours", "0", "--dry-run", env=env)
        assert keys(dataset) == before
        assert _line_for(lines, done).startswith("would remove ")
        assert _line_for(lines, busy).startswith("kept ") and "lock" in _line_for(lines, busy)

        lines = _clean(tmp_path, dest, "--older-than-hours", "0", env=env)
        assert _line_for(lines, done).startswith("removed ")
        assert keys(done) == set()
        assert stages.PLAN in keys(busy) and read_lock(storage, busy)["owner"] == keeper.owner
    assert storage.read_bytes(join(dataset, "v0", "_SUCCESS")) == b"published\n"
    assert storage.read_bytes(join(dataset, "latest.json")) == b'{"version": "v0"}\n'
    lines = _clean(tmp_path, dest, "--older-than-hours", "0", env=env)  # released: removed now
    assert _line_for(lines, busy).startswith("removed ")
    assert keys(join(dataset, "_staging")) == set()
