"""Every ```python snippet of docs/loader.md runs, in order and in one namespace, against a local dataset.

Substitution rule: the docs name their dataset once, on the line ``DATASET = "s3://datasets/image-tfrecords/flowers"``;
the test rewrites that line to a dataset it publishes with the CLI (tests.readers.test_loader.publish_flowers) and
requires the S3 URI nowhere else, so what runs is exactly what the page shows.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.readers.test_loader import publish_flowers

DOC = Path(__file__).resolve().parents[2] / "docs" / "loader.md"
DATASET_LINE = 'DATASET = "s3://datasets/image-tfrecords/flowers"'


def snippets() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", DOC.read_text(), re.S | re.M)


def test_the_docs_name_the_dataset_once() -> None:
    code = "\n".join(snippets())
    assert len(snippets()) >= 3
    assert code.count(DATASET_LINE) == 1 and code.count("s3://datasets/image-tfrecords/flowers") == 1


def test_every_snippet_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dataset = publish_flowers(tmp_path)
    namespace: dict[str, object] = {"__name__": "loader_docs"}
    for i, code in enumerate(snippets()):
        code = code.replace(DATASET_LINE, f"DATASET = {dataset!r}")
        exec(compile(code, f"{DOC}:snippet{i + 1}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "2 batches per epoch" in out  # 40 training records, batches of 32
    assert "2/2" in out and "ran out of data" not in out  # Keras knew the steps
    assert "daisy" in out and "(4, 64, 64, 3)" in out
    assert "(16, 64, 64, 3) int64" in out  # the multi-label snippet on a single-label version
