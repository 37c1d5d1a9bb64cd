"""The publish gate on the command line: a version whose class shares moved too far is not published (exit 3,
the report on stdout, the staging kept) until it is accepted; thresholds, and the gate off by default; publish refuses a
tripped build until it is approved (what the DAG's approval does)."""

from __future__ import annotations

import html
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from image_tfrecords import stages
from image_tfrecords.cli import GATE_TRIPPED
from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import GateTripped
from image_tfrecords.storage import Storage
from tests.support import one_line, run_cli


def build(src: Path, dest: Path, version: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``build`` of dataset d with the gate on (its default is off), and ``extra`` flags."""
    return run_cli("build", "--source", str(src), "--destination", str(dest), "--dataset", "d", "--version", version,
                   "--workers", "2", "--no-progress", "--gate", *extra)


def manifest(dest: Path, version: str) -> dict:
    return json.loads((dest / "d" / version / "manifest.json").read_text())


def card_gate(dest: Path, version: str) -> str:
    """The publish-gate section of the published card.md (checked the same in card.html)."""
    md, page = ((dest / "d" / version / name).read_text() for name in ("card.md", "card.html"))
    section = md.split("<!-- section publish-gate -->\n", 1)[1].split("<!-- end of section publish-gate -->")[0]
    verdict = section.splitlines()[2]
    assert section.startswith("## Publish gate\n") and html.escape(verdict.replace("\\", "")) in page
    assert "Not evaluated yet" not in md + page
    return section


def latest(dest: Path) -> str:
    return json.loads((dest / "d" / "latest.json").read_text())["version"]


@pytest.fixture
def shifted(sample_dir: Path, tmp_path: Path) -> tuple[Path, Path]:
    """Version v1 of the sample (20 images in each of 3 classes) published; then 14 of the 20 circles
    removed from the source (circles' share: 33% -> 13%). Returns (source, destination)."""
    src, dest = tmp_path / "src", tmp_path / "out"
    shutil.copytree(sample_dir, src)
    first = build(src, dest, "v1")
    assert first.returncode == 0, first.stderr
    assert "publish gate: passed (no previous version)" in first.stdout
    gate = manifest(dest, "v1")["build"]["gate"]
    assert gate["verdict"] == "passed" and gate["previous_version"] is None
    assert manifest(dest, "v1")["build"]["class_records"] == {"circles": 20, "squares": 20, "triangles": 20}
    assert "Passed: there is no previous version to compare with." in card_gate(dest, "v1")
    for path in sorted((src / "circles").iterdir())[:14]:
        path.unlink()
    return src, dest


def test_a_tripped_gate_publishes_nothing_until_the_build_is_accepted(shifted: tuple[Path, Path]) -> None:
    src, dest = shifted
    tripped = build(src, dest, "v2")
    assert tripped.returncode == GATE_TRIPPED == 3, tripped.stderr
    report = tripped.stdout.splitlines()
    assert report[0].startswith("publish gate: tripped 3 of ") and "against v1 (class share: circles" in report[0]
    circles = next(line for line in report[1:] if "class share: circles" in line)
    assert circles.split()[0] == "TRIPPED" and "33.3% -> 13.0%" in circles and "limit \u00b110.0" in circles
    assert any(line.split()[0] == "ok" and "reject share" in line for line in report)
    error = one_line(tripped.stderr)
    assert error.startswith("error: publish gate: tripped") and "nothing was published" in error
    assert "--version v2 --accept-gate" in error
    assert not (dest / "d" / "v2").exists() and latest(dest) == "v1"
    staged = json.loads((dest / "d" / "_staging" / "v2" / "gate.json").read_text())
    assert staged["verdict"] == "tripped" and "class share: circles" in staged["tripped"]

    accepted = build(src, dest, "v2", "--accept-gate")
    assert accepted.returncode == 0, accepted.stderr
    assert "publish gate: accepted (6 checks against v1, tripped class share: circles" in accepted.stdout
    assert "files inspected 0" in accepted.stdout  # the kept staging's inspections and shards were reused
    gate = manifest(dest, "v2")["build"]["gate"]
    assert gate["verdict"] == "accepted" and gate["previous_version"] == "v1"
    assert gate["tripped"] == ["class share: circles", "class share: squares", "class share: triangles"]
    circles_check = next(c for c in gate["checks"] if c.get("of") == "circles")
    assert circles_check == {"check": "class_share", "of": "circles", "before": 0.333333, "now": 0.130435,
                             "threshold": 0.1, "tripped": True}
    assert latest(dest) == "v2" and not (dest / "d" / "_staging").exists()
    card = card_gate(dest, "v2")  # the card states the verdict it was published with, and the checks
    assert "published anyway: accept_gate was set" in card
    assert "| class share | circles | 33.3% | 13.0% | ±10.0 points | TRIPPED |" in card


def test_thresholds_and_the_gate_switch_decide_what_trips(shifted: tuple[Path, Path]) -> None:
    src, dest = shifted
    loose = build(src, dest, "v2", "--gate-class-share", "0.25")
    assert loose.returncode == 0, loose.stderr
    assert "publish gate: passed (6 checks against v1, nothing tripped)" in loose.stdout
    assert manifest(dest, "v2")["build"]["gate"]["thresholds"]["class_share"] == 0.25

    for path in sorted((src / "squares").iterdir())[:15]:  # squares: 43% -> 16% of the records
        path.unlink()
    off = run_cli("build", "--source", str(src), "--destination", str(dest), "--dataset", "d", "--version", "v3",
                  "--workers", "2", "--no-progress")  # the gate is off by default
    assert off.returncode == 0, off.stderr
    assert "publish gate: off" in off.stdout
    assert "Off (the gate option)" in card_gate(dest, "v3")
    assert manifest(dest, "v3")["build"]["gate"] == {
        "verdict": "off", "thresholds": {"reject_share": 0.05, "class_share": 0.1, "quality_share": 0.1,
                                         "near_duplicates_across_labels": 0}}
    bad = build(src, dest, "v4", "--gate-class-share", "1.5")
    assert bad.returncode == 2
    assert one_line(bad.stderr) == "error: gate_class_share must be a number in [0, 1], not 1.5"


def test_publish_refuses_a_tripped_build_until_a_person_approves_it(shifted: tuple[Path, Path]) -> None:
    src, dest = shifted
    assert build(src, dest, "v2").returncode == GATE_TRIPPED
    cfg, storage = BuildConfig(source=str(src), destination=str(dest), dataset="d", version="v2"), Storage()
    with pytest.raises(GateTripped, match="the publish gate tripped and nobody approved or accepted it"):
        stages.publish_stage(cfg, storage)
    assert not (dest / "d" / "v2").exists()

    class CardWriteFails(Storage):
        def write_bytes(self, uri: str, data: bytes) -> None:
            if uri.endswith("card.html"):
                raise OSError("the store is down")
            super().write_bytes(uri, data)

    with pytest.raises(OSError, match="the store is down"):  # the approval task fails half-way, and retries
        stages.approve_gate(cfg, CardWriteFails(), by="Ada")
    staged_manifest = json.loads((dest / "d" / "_staging" / "v2" / "manifest.json").read_text())
    assert staged_manifest["build"]["gate"]["verdict"] == "tripped"  # the manifest is written last
    assert stages.approve_gate(cfg, storage, by="Ada") == {"verdict": "approved"}
    stages.publish_stage(cfg, storage)
    gate = manifest(dest, "v2")["build"]["gate"]
    assert (gate["verdict"], gate["approved_by"]) == ("approved", "Ada")
    assert "published because Ada approved it in the Airflow UI" in card_gate(dest, "v2")
    assert latest(dest) == "v2"
