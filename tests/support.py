"""Helpers the test modules share: running the CLI, reading CSV files, checking one-line errors, and
checking a published version against its source."""

from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m image_tfrecords ARGS`` in the project root; its output captured."""
    return subprocess.run([sys.executable, "-m", "image_tfrecords", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file with a header, as dicts."""
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def one_line(stderr: str) -> str:
    """The one non-empty line of ``stderr`` (AssertionError if there are more, or a traceback)."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one line on stderr, got {len(lines)}:\n{stderr}"
    assert "Traceback" not in stderr
    return lines[0]


def assert_matches_source(manifest: dict, splits: dict, source: Path) -> None:
    """Every source image is one record, with its bytes, label, id, dimensions and split."""
    sources = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    seen = []
    for split, records in splits.items():
        assert len(records) == manifest["splits"][split]["num_records"]
        for record in records:
            filename = record["image/filename"].decode()
            seen.append(filename)
            data = (source / filename).read_bytes()
            assert record["image/encoded"] == data
            assert record["image/sha256"].decode() == hashlib.sha256(data).hexdigest()
            label = filename.split("/")[0]
            assert record["image/class/text"].decode() == label
            assert record["image/class/label"] == manifest["classes"].index(label)
            assert record["decoded_shape"] == (record["image/height"], record["image/width"],
                                               record["image/channels"])
            assert record["image/format"] == (b"png" if filename.endswith(".png") else b"jpeg")
    assert sorted(seen) == sources
    assert manifest["num_records"] == len(sources)
