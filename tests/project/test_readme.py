"""The README's promises hold: its tf.data snippet runs, it stays a short read, and it and the pages under
docs/ state the user-facing contract (the CLI's flags, the DAG's params, the published layout)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCS = {path.name: path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").glob("*.md"))}
README_MAX_BYTES = 15_000  # a newcomer's ten-minute read; the rest is a page under docs/


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
        assert f"`{key}`" in DOCS["published-format.md"], key
    for param in ("source", "destination", "dataset", "splits", "salt", "shard_size_mb", "compression"):
        assert f"| `{param}` |" in DOCS["dag.md"], param


def test_readme_is_short_and_links_resolve() -> None:
    """The README stays a short read, and every relative link in it and in docs/ names a file that exists
    (and, with an anchor, a heading of that file)."""
    assert len(README.encode()) <= README_MAX_BYTES, f"README.md is {len(README.encode())} bytes"
    broken = []
    for where, text in [("README.md", README), *((f"docs/{name}", body) for name, body in DOCS.items())]:
        base = (ROOT / where).parent
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (base / path).resolve() if path else ROOT / where
            if not file.exists():
                broken.append(f"{where}: {target}")
            elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text(encoding="utf-8")):
                broken.append(f"{where}: {target} (no such heading)")
    assert not broken, broken


def anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a markdown text's headings."""
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#+ (.*)$", markdown, re.M)}


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
    return DOCS["cli.md"]


def test_cli_page_documents_every_subcommand_and_flag() -> None:
    """Every subcommand and every option its --help lists is in docs/cli.md, with a
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
    assert not missing, "docs/cli.md does not mention " + "; ".join(missing)


def test_cli_page_names_no_flag_the_cli_lacks() -> None:
    known = {flag for command in subcommands() for flag in FLAG.findall(cli_help(command))}
    unknown = set(FLAG.findall(cli_section())) - known
    assert not unknown, f"docs/cli.md names flags no subcommand has: {sorted(unknown)}"


def test_cli_help_lists_the_contract_flags() -> None:
    options = set(FLAG.findall(cli_help("build")))
    for flag in ("--source", "--destination", "--dataset", "--version", "--splits", "--salt", "--shard-size-mb",
                 "--compression", "--workers"):
        assert flag in options, flag


def test_generated_docs_are_current() -> None:
    """docs/'s generated blocks (the DAG's params table, from options.py) are what the code makes now."""
    sys.path.insert(0, str(ROOT))
    try:
        from tools.docs import render
    finally:
        sys.path.remove(str(ROOT))
    stale = [name for name, text in DOCS.items() if render(text) != text]
    assert not stale, f"docs/{stale} out of date: run `make docs`"
    assert "<!-- generated: params -->" in DOCS["dag.md"]


def test_every_python_snippet_in_the_docs_is_run_by_a_test() -> None:
    """A Python snippet in docs/ or the README is run from where it stands: docs/loader.md's all
    (tests/readers/test_loader_docs.py), docs/readers.md's marked ones (tests/readers/test_readers_from_pip.py),
    the README's tf.data one (above) and its import line (here). A new snippet elsewhere fails this test until a
    test runs it."""
    runners = {"loader.md": "every snippet", "readers.md": "<!-- reader: "}
    for name, text in DOCS.items():
        blocks = re.findall(r"(.{0,80})\n```python\n", text, re.S)
        if not blocks:
            continue
        assert name in runners, f"docs/{name} has Python snippets no test runs"
        if name == "readers.md":
            assert all(runners[name] in before for before in blocks), "a docs/readers.md snippet is not marked"
    readme_blocks = re.findall(r"^```python\n(.*?)^```$", README, re.S | re.M)
    assert snippet("read-split") in readme_blocks
    for code in readme_blocks:
        if code != snippet("read-split"):
            run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
            assert run.returncode == 0, run.stderr[-2000:]
