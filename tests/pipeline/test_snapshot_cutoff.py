"""A snapshot cutoff (``as_of``: scheduled runs and backfills) that leaves files out says so, with how to build them."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import BuildError
from image_tfrecords.storage import Storage

CUTOFF = "2020-01-01T00:00:00+00:00"  # before every sample file was written
OLDER = 1_500_000_000  # 2017: before the cutoff


def _config(source: str, dest: Path) -> BuildConfig:
    return BuildConfig(source=source, destination=str(dest), dataset="d", version="v1", as_of=CUTOFF)


def _assert_says_the_cutoff(message: str, newer: int, listed: int) -> None:
    assert f"({listed} files listed, 0 rejected)" in message, message
    assert f"{newer} files were modified after this build's snapshot cutoff {CUTOFF} and left out" in message
    assert "trigger the DAG manually (a manual run sees every file)" in message and "--as-of" in message


def test_a_folder_newer_than_the_cutoff_fails_naming_the_cutoff(sample_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(sample_dir, source)
    with pytest.raises(BuildError) as raised:
        stages.discover_stage(_config(str(source), tmp_path / "out"), Storage())
    message = str(raised.value)
    assert message.startswith(f"no labelled images found under {source} ")
    _assert_says_the_cutoff(message, newer=60, listed=0)
    assert "expected one folder per class" not in message  # the layout is not what is wrong


def test_an_s3_prefix_newer_than_the_cutoff_fails_naming_the_cutoff(sample_dir: Path, tmp_path: Path, bucket: str,
                                                                      s3_storage: Storage) -> None:
    source = f"s3://{bucket}/sample"
    for path in sample_dir.rglob("*"):
        if path.is_file():
            s3_storage.write_bytes(f"{source}/{path.relative_to(sample_dir).as_posix()}", path.read_bytes())
    with pytest.raises(BuildError) as raised:
        stages.discover_stage(_config(source, tmp_path / "out"), s3_storage)
    _assert_says_the_cutoff(str(raised.value), newer=60, listed=0)


def test_files_left_out_beside_older_ones_are_logged(sample_dir: Path, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "src"
    shutil.copytree(sample_dir, source)
    old = sorted(p for p in (source / "circles").iterdir())
    for path in old:
        os.utime(path, (OLDER, OLDER))
    with caplog.at_level(logging.INFO, logger="image_tfrecords"):
        summary = stages.discover_stage(_config(str(source), tmp_path / "out"), Storage())
    assert summary["candidates"] == len(old) == 20 and summary["after_cutoff"] == 40 and summary["listed"] == 20
    lines = [r.getMessage() for r in caplog.records if "snapshot cutoff" in r.getMessage()]
    assert len(lines) == 1, lines
    assert f"40 files were modified after this build's snapshot cutoff {CUTOFF} and left out" in lines[0]
    assert "trigger the DAG manually" in lines[0]
