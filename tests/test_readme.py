"""The README's promises hold: its tf.data snippet runs, and it states the user-facing contract."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def snippet(name: str) -> str:
    match = re.search(rf"<!-- snippet: {name} -->\s*```python\n(.*?)```\s*<!-- /snippet -->", README, re.S)
    assert match, f"README has no snippet {name!r}"
    return match.group(1)


def test_read_split_snippet_runs_on_a_published_dataset(sample_dir: Path, tmp_path: Path) -> None:
    for compression in ("none", "gzip"):
        dest = tmp_path / compression
        build = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(sample_dir),
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
    for text in ("make demo", "make test", "make install", "docker compose up", "dags/image_tfrecords_dag.py",
                 "{split}-{index:05d}-of-{count:05d}.tfrecord", "_SUCCESS", "latest.json", "rejects.csv",
                 "dataset_info.json", "aws_default", "AWS_ENDPOINT_URL"):
        assert text in README, text
    for key in ("image/encoded", "image/format", "image/height", "image/width", "image/channels",
                "image/class/label", "image/class/text", "image/filename", "image/sha256"):
        assert f"`{key}`" in README, key
    for param in ("source", "destination", "dataset", "splits", "salt", "shard_size_mb", "compression"):
        assert f"| `{param}` |" in README, param


FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])")


def cli_help(*args: str) -> str:
    """``image-tfrecords ARGS --help``, unwrapped (a wide terminal: no flag split at a hyphen)."""
    result = subprocess.run([sys.executable, "-m", "image_tfrecords", *args, "--help"], cwd=ROOT,
                            capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "400"})
    assert result.returncode == 0, result.stderr
    return result.stdout


def subcommands() -> list[str]:
    """The subcommands the CLI has, from its own --help (``{build,clean,...}``)."""
    match = re.search(r"\{([a-z,-]+)\}", cli_help())
    assert match, "the CLI's --help lists no subcommands"
    return match.group(1).split(",")


def cli_section() -> str:
    assert "## The command line" in README
    return README.split("## The command line", 1)[1].split("\n## ", 1)[0]


def test_readme_documents_every_subcommand_and_flag() -> None:
    """Every subcommand and every option its --help lists is in the README's command-line section, with a
    usage line; whatever subcommands and flags are added later are covered without editing this test."""
    section, missing = cli_section(), []
    commands = subcommands()
    assert "build" in commands
    for command in commands:
        if f"image-tfrecords {command} " not in section:
            missing.append(f"a usage line `image-tfrecords {command} ...`")
        flags = set(FLAG.findall(cli_help(command))) - {"--help"}
        missing += [f"`{flag}` of `{command}`" for flag in sorted(flags) if not re.search(
            rf"(?<![\w-]){re.escape(flag)}(?![\w-])", section)]
    assert not missing, "README's command-line section does not mention " + "; ".join(missing)


def test_readme_names_no_flag_the_cli_lacks() -> None:
    known = {flag for command in subcommands() for flag in FLAG.findall(cli_help(command))}
    unknown = set(FLAG.findall(cli_section())) - known
    assert not unknown, f"README's command-line section names flags no subcommand has: {sorted(unknown)}"


def test_cli_help_lists_the_contract_flags() -> None:
    options = set(FLAG.findall(cli_help("build")))
    for flag in ("--source", "--destination", "--dataset", "--version", "--splits", "--salt", "--shard-size-mb",
                 "--compression", "--workers"):
        assert flag in options, flag


def test_readme_reader_snippets_are_the_tested_ones() -> None:
    """The README's Keras, TFDS and PyTorch snippets are docs/readers.md's, which
    tests/test_readers_from_pip.py runs from a fresh pip install."""
    pattern = re.compile(r"^<!-- reader: ([\w-]+) -->\n```python\n(.*?)^```$", re.S | re.M)
    readme = dict(pattern.findall(README))
    tested = dict(pattern.findall((ROOT / "docs" / "readers.md").read_text(encoding="utf-8")))
    assert set(readme) == {"keras", "tfds", "pytorch"}
    for name, code in readme.items():
        assert code == tested[name], f"README's {name} snippet differs from docs/readers.md's"
