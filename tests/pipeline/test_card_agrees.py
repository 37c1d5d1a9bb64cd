"""The card adds up (issue 51, item 3): on a version built by the command line from PNGs and JPEGs, the card's
counts are the datasets page's (the page rendered as tests/airflow/test_plugin.py renders it, with FastAPI's
TestClient, here on a local root), the card says what "measured" covers and why PNGs are not, every table of
the card explains its columns, and the card's "Load this version" snippets run against the version."""

from __future__ import annotations

import html as html_lib
import io
import json
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from image_tfrecords.storage import Storage
from tests.pipeline.test_card import md_table, number, read_manifest
from tests.support import run_cli

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "plugins"))  # as Airflow does with its plugins folder

from image_tfrecords_ui.app import create_app  # noqa: E402


@pytest.fixture(scope="module")
def built(sample_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """shapes v1 from the 60 sample images (48 JPEGs, 12 PNGs) and a broken JPEG (rejected); the version's folder.
    Without the near-duplicate search or a quality reject policy, so the build checks PNGs without decoding them:
    they are not measured (docs/quality.md), which the card must say."""
    tmp = tmp_path_factory.mktemp("agrees")
    source = tmp / "source"
    shutil.copytree(sample_dir, source)
    (source / "circles" / "broken.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    result = run_cli("build", "--source", str(source), "--destination", str(tmp / "out"), "--dataset", "shapes",
                     "--version", "v1", "--workers", "1", "--no-progress", "--near-duplicate-bits", "0")
    assert result.returncode == 0, result.stderr
    return tmp / "out" / "shapes" / "v1"


@pytest.fixture(scope="module")
def page(built: Path) -> Iterator[str]:
    """The datasets page's row of the version."""
    with TestClient(create_app([str(built.parent.parent)], Storage)) as client:
        response = client.get("/")
    assert response.status_code == 200
    yield html_lib.unescape(response.text.split('data-version="v1"', 1)[1].split("</tr>", 1)[0])


def cell(row: str, name: str) -> str:
    """The text of the row's ``<td class="name ...">``, tags removed."""
    found = re.search(rf'<td class="[^"]*\b{name}\b[^"]*"[^>]*>(.*?)</td>', row, re.S)
    assert found, name
    return re.sub(r"<[^>]+>", "", found.group(1)).strip()


def test_the_cards_counts_are_the_datasets_pages(built: Path, page: str) -> None:
    md = (built / "card.md").read_text()
    manifest = read_manifest(built)
    header = dict(md_table(md, "# Dataset card: shapes v1")[1])
    assert number(cell(page, "records")) == number(header["Records"]) == manifest["num_records"] == 60
    assert number(cell(page, "rejected")) == number(header["Rejected"]) == manifest["num_rejected"] == 1
    assert cell(page, "classes").split(":")[0] == header["Classes"].split(":")[0] == "3"
    head, body = md_table(md, "## Records per split and class")
    card_splits = dict(zip(head[2:-1], map(number, body[-1][2:-1]), strict=True))
    page_splits = dict(re.findall(r"(\w+) ([\d,]+)", cell(page, "splits")))
    assert card_splits == {split: number(n) for split, n in page_splits.items()}
    assert sum(card_splits.values()) == 60

    # quality flags: the same records and the same share, of all 60 records, on the card and the page
    flags = manifest["build"]["quality_flags"]
    assert flags, "the sample should have some flagged images"
    _, flagged = md_table(md, "## Image quality", 1)
    card_flags = {flag: (number(records), share) for flag, records, share, _ in flagged}
    page_flags = {flag: (number(records), share)
                  for flag, records, share in re.findall(r"(\w+) ([\d,]+) \(([\d.]+%)\)", cell(page, "checks"))}
    assert card_flags == page_flags == {flag: (n, f"{100 * n / 60:.1f}%") for flag, n in flags.items()}

    # what "measured" covers: the 12 PNGs are not measured by default, and the card says why
    quality = md[md.index("## Image quality"):md.index("## Near-duplicates")]
    assert "48 of 60 records measured." in quality
    assert "The 12 not measured are PNGs stored as they are" in quality
    assert "near_duplicate_bits above 0 or a quality_reject policy" in quality
    _, classes = md_table(md, "## Image quality")
    records_by_class = {name: number(total) for _, name, *_, total in md_table(md, "## Records per split and class")[1]}
    assert {name: number(records) for _, name, records, *_ in classes} == {
        name: n for name, n in records_by_class.items() if name != "total"}
    assert sum(number(row[3]) for row in classes) == 48  # measured


def test_every_table_of_the_card_explains_its_columns(built: Path) -> None:
    lines = (built / "card.md").read_text().split("\n")
    tables = [i for i, line in enumerate(lines) if line.startswith("|") and not lines[i - 1].startswith("|")]
    assert len(tables) >= 10
    for start in tables:
        header = [re.sub(r"\\(.)", r"\1", c.strip()) for c in re.split(r"(?<!\\)\|", lines[start])[1:-1]]
        end = next(i for i in range(start, len(lines)) if not lines[i].startswith("|"))
        legend = re.sub(r"\\(.)", r"\1", lines[end + 1])
        assert lines[end] == "" and legend.startswith("Columns: "), (header, legend)
        assert all(f"{name}: " in legend for name in header), (header, legend)
    assert "MP: mean size in megapixels" in "\n".join(lines)


def snippets(card_md: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", card_md, re.S | re.M)


def test_the_card_shows_a_keras_and_a_pytorch_snippet_with_the_versions_uri(built: Path) -> None:
    md, page = (built / "card.md").read_text(), (built / "card.html").read_text()
    keras, torch = snippets(md[md.index("## Load this version"):])[:2]
    assert f"VERSION = {json.dumps(str(built))}\n" in keras and "load_split(VERSION, \"train\"" in keras
    assert "RecordSource(VERSION, \"train\"" in torch and "DataLoader(" in torch
    for code in (keras, torch):  # card.html shows the same code
        assert html_lib.escape(code.rstrip("\n"), quote=True).replace("://", "&#58;//") in page


def test_the_cards_keras_snippet_runs(built: Path) -> None:
    keras = snippets((built / "card.md").read_text())[0]
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(keras, f"{built}/card.md:keras", "exec"), {"__name__": "card_snippet"})
    manifest = read_manifest(built)
    batches = -(-manifest["splits"]["train"]["num_records"] // 32)
    assert f"{batches} batches per epoch;" in out.getvalue() and ", 224, 224, 3) int64" in out.getvalue()


def test_the_cards_pytorch_snippet_runs(built: Path) -> None:
    """Needs torch, which the dev venv does not install (the ``torch`` extra): tests/readers/test_readers_from_pip.py
    runs the card's snippets in a fresh venv that has it, on every ``make test``."""
    pytest.importorskip("torch", reason="torch is not installed here; test_readers_from_pip.py runs this snippet")
    torch_code = snippets((built / "card.md").read_text())[1]
    out = io.StringIO()
    with redirect_stdout(out):
        exec(compile(torch_code, f"{built}/card.md:pytorch", "exec"), {"__name__": "card_snippet"})
    assert "batches per epoch; (32, 3, 224, 224) torch.int64" in out.getvalue()


@pytest.mark.parametrize("uri", ["s3://bucket/datasets/pets/v2", '/data/a "quoted" ```fenced``` path\nv1'])
def test_the_snippets_hold_the_uri_whatever_its_characters(uri: str) -> None:
    """The URI is a Python string literal in the code, and the fenced block holds the code whole."""
    from image_tfrecords.card.load_snippets import load_blocks
    from image_tfrecords.card.render import render_md
    from image_tfrecords.published.manifest import as_manifest
    from tests.pipeline.test_card import make_dataset, make_manifest

    rows, _ = make_dataset({"cats": 4, "dogs": 3})
    md = render_md(load_blocks(uri, as_manifest(make_manifest(rows, ["cats", "dogs"]))))
    fence = re.search(r"^(`{3,})python$", md, re.M)
    assert fence is not None
    codes = re.findall(rf"^{fence.group(1)}python\n(.*?)^{fence.group(1)}$", md, re.S | re.M)
    assert len(codes) == 2
    for code in codes:
        namespace: dict[str, object] = {}
        first = code.index("VERSION = ")
        exec(code[first:code.index("\n", first)], namespace)  # the line that names the version
        assert namespace["VERSION"] == uri
        compile(code, "snippet", "exec")
