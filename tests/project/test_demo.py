"""`make demo` (tools/demo.py) prints the steps, where the dataset is, what it holds and how to look at it, and
nothing else: no TensorFlow (absl, oneDNN, CPU features) or setuptools start-up lines; a failing step shows its
error."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VERSION = r"\d{8}T\d{6}Z"
# Every line the demo may print on success, in this order (a pattern may match several lines in a row).
LINES = [
    r"==> writing sample images to \S+/sample",
    r"    60 images in 3 class folders",
    r"==> starting SeaweedFS \(S3\) on 127\.0\.0\.1",
    r"    S3 endpoint http://\S+",
    r"==> migrating the Airflow database in \S+/airflow",
    r"==> airflow dags test image_tfrecords \S+ \(its log: \S+/dags-test\.log\)",
    r"==> reading the published dataset back with TensorFlow",
    rf"Published s3://datasets/demo/{VERSION}  \(latest\.json -> {VERSION}\)",
    r"classes: circles, squares, triangles; rejected: 0",
    r"  (train|validation|test) +\d+ records read back with tf\.data in \d+ shard\(s\); per class \{.+\}; "
    r"decoded widths (\d+)-(\d+) px, heights (\d+)-(\d+) px",
    r"files: \d+ shards with their \.tfindex, .*\blabels\.txt\b.*, manifest\.json, .*",
    r"dataset card: (\S+) \(a copy of s3://\S+/card\.html; open it in a browser\)",
    r"S3 endpoint http://\S+ \(key \S+\)(; data kept in \S+/s3: .+ serves it again \(on new ports\))?\.",
    r"demo finished in [\d.]+ s",
]
NOISE = re.compile(r"absl|onednn|cpu_feature_guard|tensorflow/|setuptools|experimental|warning|^[IWEF]\d{4} ",
                   re.IGNORECASE)


def run_demo(work: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """tools/demo.py (what `make demo` runs after `make install`) with its work folder in ``work``; TensorFlow's
    log level left unset, as in a newcomer's shell, so its start-up lines would show unless the demo hides them."""
    environ = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"} | env
    return subprocess.run([sys.executable, "tools/demo.py", "--work", str(work)], cwd=ROOT, env=environ,
                          capture_output=True, text=True, timeout=900)


def test_the_demo_prints_only_what_a_newcomer_needs(tmp_path: Path) -> None:
    result = run_demo(tmp_path / "demo")
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stderr == ""
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert [line for line in lines if NOISE.search(line)] == []
    at = 0
    for line in lines:  # each line matches the expected pattern or the next ones, in order
        while at < len(LINES) and not re.fullmatch(LINES[at], line):
            at += 1
        assert at < len(LINES), f"unexpected line: {line!r}\n{result.stdout}"
        match = re.fullmatch(LINES[at], line)
        if "records read back" in line:  # the sizes' ends in order
            low_w, high_w, low_h, high_h = map(int, match.groups()[1:])
            assert low_w <= high_w and low_h <= high_h
        if line.startswith("dataset card: "):
            assert Path(match[1]).read_bytes().startswith(b"<!DOCTYPE html>")
    assert at == len(LINES) - 1  # every kind of line came, the last one last
    steps = [line for line in lines if line.startswith("==> ")]
    assert len(steps) == 5 and sum(line.startswith("  ") and "records read back" in line for line in lines) == 3


def test_a_failing_step_shows_its_error(tmp_path: Path) -> None:
    """The database migration fails (a SQLite file in a folder that does not exist): its error is shown."""
    result = run_demo(tmp_path / "demo",
                      AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=f"sqlite:///{tmp_path}/no/such/folder/airflow.db")
    assert result.returncode == 1
    assert "==> migrating the Airflow database" in result.stdout
    assert "unable to open database file" in result.stderr
    assert result.stderr.rstrip().endswith("the Airflow database migration failed (exit status 1; its output is above)")
