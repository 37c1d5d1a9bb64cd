"""The README's promises hold: its tf.data snippet runs, and it states the user-facing contract."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def snippet(name: str) -> str:
    match = re.search(rf"<!-- snippet: {name} -->\s*```python\n(.*?)```\s*<!-- /snippet -->", README, re.S)
    assert match, f"README has no snippet {name!r}"
    return match.group(1)


def test_read_split_snippet_runs_on_a_published_dataset(sample_dir: Path, tmp_path: Path) -> None:
    for compression in ("none", "gzip"):
        dest = tmp_path / compression
        build = subprocess.run([sys.executable, "-m", "include.image_tfrecords", "build", "--source", str(sample_dir),
                                "--destination", str(dest), "--dataset", "shapes", "--compression", compression],
                               cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert build.returncode == 0, build.stderr
        run = subprocess.run([sys.executable, "-c", snippet("read-split")], capture_output=True, text=True,
                             timeout=300, env={**os.environ, "DATASET_ROOT": str(dest / "shapes"),
                                               "TF_CPP_MIN_LOG_LEVEL": "2"})
        assert run.returncode == 0, run.stderr[-3000:]
        shape, classes = run.stdout.strip().splitlines()[-1].split(") ", 1)
        assert shape == "(32, 224, 224, 3"
        assert set(ast.literal_eval(classes)) <= {"circles", "squares", "triangles"}


def test_readme_states_commands_and_layout() -> None:
    for text in ("make demo", "make test", "make install", "docker compose up", "dags/image_tfrecords.py",
                 "{split}-{index:05d}-of-{count:05d}.tfrecord", "_SUCCESS", "latest.json", "rejects.csv",
                 "dataset_info.json", "aws_default", "AWS_ENDPOINT_URL"):
        assert text in README, text
    for key in ("image/encoded", "image/format", "image/height", "image/width", "image/channels",
                "image/class/label", "image/class/text", "image/filename", "image/sha256"):
        assert f"`{key}`" in README, key
    for param in ("source", "destination", "dataset", "splits", "salt", "shard_size_mb", "compression"):
        assert f"| `{param}` |" in README, param


@pytest.mark.parametrize("command", ["build", "clean", "sample"])
def test_readme_documents_every_cli_flag(command: str) -> None:
    """Every option `--help` lists is in the README's command-line section, and every flag it names exists."""
    section = README.split("## The command line", 1)[1].split("\n## ", 1)[0]
    result = subprocess.run([sys.executable, "-m", "include.image_tfrecords", command, "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    flags = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", result.stdout)) - {"--help"}
    missing = sorted(flag for flag in flags if flag not in section)
    assert not missing, f"README's command-line section does not mention {missing} of `{command}`"
    assert f"python -m include.image_tfrecords {command} " in section


def test_readme_names_no_flag_the_cli_lacks() -> None:
    section = README.split("## The command line", 1)[1].split("\n## ", 1)[0]
    known: set[str] = set()
    for command in ("build", "clean", "sample"):
        result = subprocess.run([sys.executable, "-m", "include.image_tfrecords", command, "--help"], cwd=ROOT,
                                capture_output=True, text=True, timeout=60)
        known |= set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", result.stdout))
    assert set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", section)) <= known


def test_cli_help_lists_the_contract_flags() -> None:
    result = subprocess.run([sys.executable, "-m", "include.image_tfrecords", "build", "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0
    for flag in ("--source", "--destination", "--dataset", "--version", "--splits", "--salt", "--shard-size-mb",
                 "--compression", "--workers"):
        assert flag in result.stdout, flag
