"""The command line end to end: local folders and S3, read back with TensorFlow."""

from __future__ import annotations

import csv
import hashlib
import json
import shutil
from datetime import UTC
from pathlib import Path

import pytest

from image_tfrecords import compiled
from image_tfrecords.storage import Storage
from tests.support import assert_matches_source, run_cli
from tests.tf_reader import read_version

ROOT = Path(__file__).resolve().parents[2]


def labels_by_file(path: Path) -> dict[str, dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return {row["filename"]: row for row in csv.DictReader(f)}


def test_build_local_reads_back_with_tensorflow(sample_dir: Path, tmp_path: Path) -> None:
    result = run_cli("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", "shapes",
                     "--version", "v1", "--shard-size-mb", "0.05", "--workers", "2")
    assert result.returncode == 0, result.stderr
    assert "published shapes version v1" in result.stdout
    assert "images/s" in result.stdout
    assert f"  {compiled.line()}\n" in result.stdout  # the summary names the compiled parts the build ran

    version = tmp_path / "shapes" / "v1"
    manifest, splits = read_version(Storage(), str(version))
    assert_matches_source(manifest, splits, sample_dir)
    assert manifest["classes"] == ["circles", "squares", "triangles"]
    assert set(splits) == {"train", "validation", "test"}
    assert len(manifest["splits"]["train"]["shards"]) > 1, "a small shard size must give several shards"

    labels = labels_by_file(version / "labels.csv")
    for split, records in splits.items():
        for record in records:
            row = labels[record["image/filename"].decode()]
            assert row["split"] == split
            assert (int(row["width"]), int(row["height"])) == (record["image/width"], record["image/height"])
    for info in manifest["splits"].values():
        for shard in info["shards"]:
            data = (version / shard["file"]).read_bytes()
            assert hashlib.sha256(data).hexdigest() == shard["sha256"]
            assert len(data) == shard["num_bytes"]
    assert (version / "_SUCCESS").exists()
    assert json.loads((tmp_path / "shapes" / "latest.json").read_text()) == {"version": "v1"}
    assert not (tmp_path / "shapes" / "_staging").exists()
    assert (version / "rejects.csv").read_text() == "filename,reason,detail\n"


def test_gzip_build_reads_back(sample_dir: Path, tmp_path: Path) -> None:
    result = run_cli("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", "shapes",
                     "--version", "gz", "--compression", "gzip", "--shard-size-mb", "0.1", "--workers", "1")
    assert result.returncode == 0, result.stderr
    files = sorted(p.name for p in (tmp_path / "shapes" / "gz").glob("*.tfrecord*"))
    assert files and all(name.endswith(".tfrecord.gz") for name in files)
    manifest, splits = read_version(Storage(), str(tmp_path / "shapes" / "gz"))
    assert manifest["compression"] == "gzip"
    assert_matches_source(manifest, splits, sample_dir)


def test_rerun_gives_identical_shards(sample_dir: Path, tmp_path: Path) -> None:
    shas = []
    for version, workers in (("a", "1"), ("b", "2")):
        result = run_cli("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", "d",
                         "--version", version, "--shard-size-mb", "0.05", "--salt", "s1", "--workers", workers,
                         "--force")
        assert result.returncode == 0, result.stderr
        manifest = json.loads((tmp_path / "d" / version / "manifest.json").read_text())
        shas.append({s: [(x["file"], x["sha256"]) for x in i["shards"]] for s, i in manifest["splits"].items()})
    assert shas[0] == shas[1]
    assert (tmp_path / "d" / "a" / "labels.csv").read_bytes() == (tmp_path / "d" / "b" / "labels.csv").read_bytes()


def test_unchanged_source_is_skipped_unless_forced(sample_dir: Path, tmp_path: Path) -> None:
    args = ("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", "d", "--workers", "1")
    assert run_cli(*args, "--version", "v1").returncode == 0
    skipped = run_cli(*args, "--version", "v2")
    assert skipped.returncode == 0, skipped.stderr
    assert "unchanged since version v1" in skipped.stdout and "--force" in skipped.stdout
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["latest.json", "v1"]  # no staging left either
    assert json.loads((tmp_path / "d" / "latest.json").read_text()) == {"version": "v1"}
    forced = run_cli(*args, "--version", "v2", "--force")
    assert forced.returncode == 0, forced.stderr
    assert json.loads((tmp_path / "d" / "latest.json").read_text()) == {"version": "v2"}
    assert (tmp_path / "d" / "v2" / "labels.csv").read_bytes() == (tmp_path / "d" / "v1" / "labels.csv").read_bytes()


def test_a_labels_csv_without_its_columns_is_one_line(sample_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.jpg").write_bytes(next(sample_dir.rglob("*.jpg")).read_bytes())
    (source / "labels.csv").write_text("name,class\na.jpg,circle\n")
    result = run_cli("build", "--source", str(source), "--destination", str(tmp_path / "out"), "--dataset", "d",
                     "--workers", "1")
    assert result.returncode == 1
    assert result.stderr.startswith("error: ") and "Traceback" not in result.stderr, result.stderr
    assert "must have a header with columns filename,label (found: name,class)" in result.stderr


def test_a_damaged_previous_manifest_is_passed_over(sample_dir: Path, tmp_path: Path) -> None:
    args = ("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", "d", "--workers", "1")
    assert run_cli(*args, "--version", "v1").returncode == 0
    (tmp_path / "d" / "v1" / "manifest.json").write_text("{not json")
    result = run_cli(*args, "--version", "v2")  # passed over (issue 21), never a traceback
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    damaged = json.loads((tmp_path / "d" / "v2" / "manifest.json").read_text())["build"]["damaged_versions"]
    assert len(damaged) == 1 and damaged[0].startswith("v1: ") and "v1/manifest.json is not valid JSON" in damaged[0]


def test_salt_changes_the_split(sample_dir: Path, tmp_path: Path) -> None:
    for salt in ("one", "two"):
        assert run_cli("build", "--source", str(sample_dir), "--destination", str(tmp_path), "--dataset", salt,
                       "--version", "v", "--salt", salt).returncode == 0
    one = {f: r["split"] for f, r in labels_by_file(tmp_path / "one" / "v" / "labels.csv").items()}
    two = {f: r["split"] for f, r in labels_by_file(tmp_path / "two" / "v" / "labels.csv").items()}
    assert one.keys() == two.keys() and one != two


def test_build_from_s3_to_s3(sample_dir: Path, bucket: str, s3_env: dict[str, str], s3_storage: Storage) -> None:
    for path in sample_dir.rglob("*"):
        if path.is_file():
            s3_storage.write_bytes(f"s3://{bucket}/raw/{path.relative_to(sample_dir).as_posix()}", path.read_bytes())
    result = run_cli("build", "--source", f"s3://{bucket}/raw", "--destination", f"s3://{bucket}/out",
                     "--dataset", "shapes", "--version", "v1", "--shard-size-mb", "0.05", "--workers", "2",
                     env={**__import__("os").environ, **s3_env})
    assert result.returncode == 0, result.stderr
    manifest, splits = read_version(s3_storage, f"s3://{bucket}/out/shapes/v1")
    assert_matches_source(manifest, splits, sample_dir)
    assert s3_storage.exists(f"s3://{bucket}/out/shapes/v1/_SUCCESS")
    assert json.loads(s3_storage.read_bytes(f"s3://{bucket}/out/shapes/latest.json")) == {"version": "v1"}
    assert not list(s3_storage.iter_files(f"s3://{bucket}/out/shapes/_staging"))
    for info in manifest["splits"].values():  # the store holds the SHA-256 it verified on upload
        for shard in info["shards"]:
            assert s3_storage.sha256_of(f"s3://{bucket}/out/shapes/v1/{shard['file']}") == shard["sha256"]


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--source", "/nonexistent/images"], 1, "is not a folder"),
        (["--splits", "train=0.5,test=0.2"], 2, "must sum to 1"),
        (["--compression", "zip"], 2, "invalid choice"),
        (["--dataset", "../escape"], 2, "dataset"),
        (["--shard-size-mb", "0"], 2, "shard_size_mb"),
    ],
)
def test_user_errors_are_one_line(sample_dir: Path, tmp_path: Path, args: list[str], code: int,
                                  message: str) -> None:
    base = {"--source": str(sample_dir), "--destination": str(tmp_path), "--dataset": "d", "--version": "v"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    result = run_cli("build", *[x for pair in base.items() for x in pair])
    assert result.returncode == code
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "d" / "v" / "_SUCCESS").exists()


def test_empty_source_fails_clearly(tmp_path: Path) -> None:
    (tmp_path / "src" / "cats").mkdir(parents=True)
    (tmp_path / "src" / "notes.txt").write_text("not an image")
    result = run_cli("build", "--source", str(tmp_path / "src"), "--destination", str(tmp_path / "out"),
                     "--dataset", "d", "--version", "v")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "no labelled images found" in result.stderr
    assert not (tmp_path / "out" / "d" / "v").exists()


def test_wrong_credentials_name_endpoint_and_bucket_not_secret(sample_dir: Path, bucket: str,
                                                                s3_env: dict[str, str]) -> None:
    import os

    secret = "definitely-wrong-secret-value"
    env = {**os.environ, **s3_env, "AWS_SECRET_ACCESS_KEY": secret}
    result = run_cli("build", "--source", str(sample_dir), "--destination", f"s3://{bucket}/out", "--dataset", "d",
                     "--version", "v", env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert bucket in result.stderr and s3_env["AWS_ENDPOINT_URL"] in result.stderr
    assert secret not in result.stderr + result.stdout


def test_missing_bucket_is_one_clear_line(sample_dir: Path, s3_env: dict[str, str]) -> None:
    import os

    result = run_cli("build", "--source", str(sample_dir), "--destination", "s3://no-such-bucket-here/out",
                     "--dataset", "d", "--version", "v", env={**os.environ, **s3_env})
    assert result.returncode == 1
    assert "bucket 'no-such-bucket-here' does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_sample_command_is_deterministic(tmp_path: Path) -> None:
    for out in ("a", "b"):
        assert run_cli("sample", str(tmp_path / out), "--per-class", "3").returncode == 0
    files_a = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files_a) == 9
    for rel in files_a:
        assert (tmp_path / "a" / rel).read_bytes() == (tmp_path / "b" / rel).read_bytes()
    shutil.rmtree(tmp_path / "b")


def test_class_ids_stay_stable_across_versions(sample_dir: Path, tmp_path: Path) -> None:
    """A new version keeps the ids of earlier classes, appends new ones, and never reuses an id."""
    first = tmp_path / "first"
    for cls in ("squares", "triangles", "circles"):
        shutil.copytree(sample_dir / cls, first / cls)
    second = tmp_path / "second"
    shutil.copytree(sample_dir / "circles", second / "circles")  # squares disappear, triangles stay
    shutil.copytree(sample_dir / "triangles", second / "triangles")
    shutil.copytree(sample_dir / "squares", second / "aardvarks")  # a new class, sorting first
    dest = tmp_path / "out"
    for source, version in ((first, "v1"), (second, "v2")):
        result = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", "d",
                         "--version", version)
        assert result.returncode == 0, result.stderr
    v1, _ = read_version(Storage(), str(dest / "d" / "v1"))
    v2, splits = read_version(Storage(), str(dest / "d" / "v2"))
    assert v1["classes"] == ["circles", "squares", "triangles"] and v1["previous_version"] is None
    assert v2["classes"] == ["circles", "squares", "triangles", "aardvarks"] and v2["previous_version"] == "v1"
    for record in (r for split in splits.values() for r in split):
        assert v2["classes"][record["image/class/label"]] == record["image/class/text"].decode()
    assert {r["image/class/text"].decode() for s in splits.values() for r in s} == {"circles", "triangles",
                                                                                      "aardvarks"}


def test_as_of_builds_the_source_as_it_was(sample_dir: Path, tmp_path: Path) -> None:
    """Files modified after --as-of are left out, so a backfill reproduces an earlier date's dataset."""
    import os
    from datetime import datetime

    source = tmp_path / "src"
    shutil.copytree(sample_dir, source)
    old, new = datetime(2026, 10, 1, tzinfo=UTC), datetime(2026, 10, 20, tzinfo=UTC)
    files = sorted(p for p in source.rglob("*") if p.is_file())
    for i, path in enumerate(files):
        stamp = (old if i % 3 else new).timestamp()
        os.utime(path, (stamp, stamp))
    before = {p.relative_to(source).as_posix() for i, p in enumerate(files) if i % 3}
    dest = tmp_path / "out"
    result = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", "d", "--version",
                     "20261010", "--as-of", "2026-10-10T00:00:00+00:00")
    assert result.returncode == 0, result.stderr
    assert set(labels_by_file(dest / "d" / "20261010" / "labels.csv")) == before
    manifest = json.loads((dest / "d" / "20261010" / "manifest.json").read_text())
    assert manifest["as_of"] == "2026-10-10T00:00:00+00:00" and manifest["num_records"] == len(before)
    later = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", "d", "--version",
                    "20261021", "--as-of", "2026-10-21T00:00:00+00:00")
    assert later.returncode == 0, later.stderr
    assert len(labels_by_file(dest / "d" / "20261021" / "labels.csv")) == len(files)
    bad = run_cli("build", "--source", str(source), "--destination", str(dest), "--dataset", "d", "--version", "x",
                  "--as-of", "yesterday")
    assert bad.returncode == 2 and "as_of must be an ISO 8601 time" in bad.stderr


def test_a_build_without_bars_never_imports_tqdm(sample_dir: Path, tmp_path: Path) -> None:
    """--no-progress (or no terminal): the stages count into nothing, and tqdm is not imported at all."""
    import subprocess
    import sys

    script = ("import sys; from image_tfrecords.cli import main; code = main(sys.argv[1:]); "
              "print('tqdm' in sys.modules); sys.exit(code)")
    result = subprocess.run([sys.executable, "-c", script, "build", "--source", str(sample_dir), "--destination",
                             str(tmp_path / "out"), "--dataset", "d", "--version", "v1", "--no-progress"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False"
    assert (tmp_path / "out" / "d" / "v1" / "_SUCCESS").exists()


def test_the_command_ends_at_once_yet_loses_no_output_nor_a_profile(sample_dir: Path, tmp_path: Path) -> None:
    """``image-tfrecords`` ends its process with ``os._exit`` after a build (the interpreter's teardown is 5% of
    a small night): its output to a pipe is whole, exit handlers run, and under a profiler it exits as usual, so
    the profile is saved."""
    import subprocess
    import sys

    args = ["build", "--source", str(sample_dir), "--dataset", "d", "--no-progress", "--workers", "2"]
    marker = tmp_path / "atexit-ran"
    script = (f"import atexit, pathlib, sys; atexit.register(pathlib.Path({str(marker)!r}).touch); "
              "from image_tfrecords.cli import run; run(sys.argv[1:])")
    quick = subprocess.run([sys.executable, "-c", script, *args, "--destination", str(tmp_path / "a"),
                            "--version", "v1"], capture_output=True, text=True, timeout=300)
    assert quick.returncode == 0, quick.stderr
    assert "published d version v1" in quick.stdout and quick.stdout.rstrip().endswith("latest is v1")
    assert marker.exists()
    profile = tmp_path / "build.prof"
    profiled = subprocess.run([sys.executable, "-m", "cProfile", "-o", str(profile), "-m", "image_tfrecords", *args,
                               "--destination", str(tmp_path / "b"), "--version", "v1"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert profiled.returncode == 0, profiled.stderr
    assert profile.stat().st_size > 0
    failed = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(tmp_path / "none"),
                             "--destination", str(tmp_path / "c"), "--dataset", "d", "--version", "v1"],
                            capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert failed.returncode != 0 and "error:" in failed.stderr
