"""`make bench` in miniature (a 40-image corpus, one round, a few hundred images' incremental nights, the image
options' builds on the 40 images), so the benchmark never rots; its corpus generator."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from PIL import Image

ROOT = Path(__file__).resolve().parents[2]


def test_bench_smoke_measures_every_contender(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    result = subprocess.run([sys.executable, "bench/run.py", "--smoke", "--out", str(out), "--work",
                             str(tmp_path / "work")], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    data = json.loads(out.with_suffix(".json").read_text())
    assert "synthetic" in data["pixels"]  # offline: no package fetched for `make test`
    assert set(data["contenders"]) == {"a", "b", "c", "d1", "d2", "e"}
    for key, contender in data["contenders"].items():
        assert len(contender["seconds"]) == 1 and contender["seconds"][0] > 0
        if key != "c":  # cp of 40 files may end before the first sample
            assert contender["rss_mb"][0] > 10  # a Python process, sampled
    assert data["xcoms"] and all(size > 0 for _, _, size in data["xcoms"])  # from the DAG run's database
    assert {task for task, _, _ in data["xcoms"]} >= {"discover", "plan", "write_shards", "publish"}
    assert sorted(data["scale"]) == ["30", "60"]
    for report in data["scale"].values():
        assert list(report["stages"]) == ["discover", "inspect_images", "clean_stale_staging", "plan",
                                          "write_shards", "gate", "publish"]  # the DAG's tasks, from the DAG
        # (approval and discard_rejected: the branches the gate, off by default, does not take)
        assert report["mapped_tasks"] >= 1 and report["shards"] >= report["mapped_tasks"]
        assert report["mapped"]["inspect_images"] >= 1
    scaling = data["scaling"]  # the CLI at 1 and 2 workers (this machine's cores), with its stage times
    assert scaling["images"] == 200 and "1" in scaling["workers"]
    assert "2" in scaling["workers"] or scaling["cores"] == 1
    for run in scaling["workers"].values():
        assert run["seconds"] > 0 and set(run["stages"]) >= {"discover", "inspect", "split", "plan", "write",
                                                             "validate", "publish"}
    text = out.read_text()
    for label in ("(a) seed-style, 1 process", "(b) seed-style, 2 threads", "(c) cp -r", "--workers 2",
                  "airflow dags test", "## Targets (issues 5 and 13 and 22 and 25 and 50)", "## Scale: 60 images",
                  "## Scaling over cores: 200 images", "## Incremental nights (issues 12 and 22)",
                  "### 5 nights at 300 images", "\n## Image options\n", "\n## What the image signals cost\n"):
        assert label in text
    assert "Compaction on night" in text or "No compaction in 5 nights: " in text
    assert len(data["targets"]) >= 9
    check_incremental(data, text)
    check_options(data, text)
    check_signals(data, text)
    check_s3_path(data, text)
    chart = Image.open(io.BytesIO(out.with_suffix(".png").read_bytes()))
    assert chart.format == "PNG" and chart.size[0] >= 600


def check_s3_path(data: dict[str, Any], text: str) -> None:
    """The smoke run's S3 path: every build measured, requests counted through the proxy, the listings agree."""
    s3 = data["s3path"]
    for run in (s3["local"], s3["s3"], s3["s3_latency"], s3["night"]["night"], s3["night"]["full"]):
        assert run["seconds"] > 0 and run["stages"]
    assert s3["s3"]["server_cpu"] > 0 and s3["s3_latency"]["proxy"]["requests"] >= s3["images"]
    assert s3["listing"]["sequential"]["discovered_sha256"] == s3["listing"]["parallel"]["discovered_sha256"]
    assert "## The S3 path (issue 50): 60 images" in text and "Listing 2,000 keys" in text


def check_incremental(data: dict[str, Any], text: str) -> None:
    """The smoke run's incremental nights: measured, and the incremental build equal to the full one."""
    assert list(data["incremental"]) == ["300"]
    run = data["incremental"]["300"]
    night, inc, full = run["night"], run["incremental"], run["full"]
    assert night["added"] == 3 and night["deleted"] == night["changed"] == 1 and night["new_bytes"] > 0
    assert run["records_equal"] and run["records"] == run["images"] + 3 - 1
    assert run["unchanged"]["skipped"] and "unchanged since version night01" in run["unchanged"]["says"]
    assert inc["build"]["mode"] == "incremental" and inc["build"]["base_version"] == "night01"
    assert inc["build"]["files_inspected"] == 3 + 1 and inc["build"]["inspections_reused"] == run["images"] - 2
    assert inc["build"]["shards_reused"] >= 1 and inc["build"]["shards_rewritten"] + inc["build"]["shards_written"] >= 1
    assert full["build"]["mode"] == "full" and full["build"]["shards_reused"] == full["build"]["shards_rewritten"] == 0
    # issue 22: only the new records are parsed; a rewritten shard is spliced (its kept bytes taken as they are)
    assert inc["build"]["records_parsed"] == 3 + 1 and full["build"]["records_parsed"] == run["records"]
    assert inc["build"]["shards_spliced"] == inc["build"]["shards_rewritten"]
    assert inc["build"]["bytes_kept"] > 0 and full["build"].get("bytes_kept", 0) == full["build"]["bytes_copied"] == 0
    assert set(inc["stages"]) >= {"discover", "inspect", "split", "plan", "write", "validate", "card", "publish"}
    assert 0 < inc["build"]["source_bytes_read"] <= 2 * night["new_bytes"] < full["build"]["source_bytes_read"] / 10
    assert inc["written"]["linked"] > 0 and full["written"]["linked"] == 0
    assert 0 < inc["written"]["shards"] < full["written"]["shards"] and inc["written"]["other"] > 0
    assert inc["seconds"] > 0 and full["seconds"] > 0 and run["speedup"] == full["seconds"] / inc["seconds"]
    assert run["repeats"] == len(inc["all_seconds"]) == len(full["all_seconds"]) == 3  # medians of 3, taking turns
    assert inc["seconds"] == sorted(inc["all_seconds"])[1] and full["seconds"] == sorted(full["all_seconds"])[1]
    assert run["cold_base"]["seconds"] > 0 and "write" in run["cold_base"]["stages"]  # the base out of the cache
    assert run["memory_mb"]["MemFree"] > 0 and run["memory_mb"]["Cached"] > 0
    assert re.search(r"\| incremental night with the base's shards not in the page cache: seconds \(speedup\) \| "
                     r"\d+\.\d\d \(\d+\.\dx\) \|", text)
    assert re.search(r"\| memory free / page cache when the incremental night started: MB \| \d+ / \d+ \|", text)
    chain = run["chain"]
    assert [r["night"] for r in chain] == [1, 2, 3, 4, 5, 6] and chain[0]["mode"] == "full"
    assert [r["records"] for r in chain] == [run["images"] + 2 * n for n in range(6)]
    assert chain[1]["mode"] == "incremental"
    assert all(r["mode"] == "incremental" or r["full_because"].startswith("compaction") for r in chain[1:])
    assert all(r["shards"] <= 1.5 * r["full_shards"] for r in chain)  # compaction's bound
    s3 = run["s3"]  # the same night with the destination on the S3 server
    assert s3["first"]["build"]["mode"] == "full" and s3["incremental"]["build"]["mode"] == "incremental"
    assert s3["incremental"]["build"]["records_parsed"] == 3 + 1 and s3["full"]["build"]["mode"] == "full"
    assert 0 < s3["incremental"]["build"]["bytes_written"] < s3["full"]["build"]["bytes_written"]
    assert run["disk_mb_per_s"] > 0
    targets = {t["target"]: t for t in data["targets"]}
    assert targets["300 images: an unchanged night skips all work"]["met"]
    assert re.search(r"\| speedup \(full / incremental\) \| \*\*\d+\.\dx\*\* \|", text)
    assert re.search(r"\| records equal \(labels\.csv filename, sha256, label, split\) \| yes \(\d+\) \|", text)


def check_options(data: dict[str, Any], text: str) -> None:
    """The smoke run's image options: every build at 1 and (cores) workers, with the write stage's seconds
    and the shards' bytes; raw 224x224 RGB records hold 150528 bytes of pixels each."""
    report = data["options"]
    builds = {(b["key"], b["workers"]): b for b in report["builds"]}
    workers = sorted({1, report["cores"]})
    assert set(builds) == {(key, n) for key in ("original", "shortest:256 jpeg", "224x224 raw", "longest:512")
                           for n in workers}
    records = builds["original", 1]["records"]
    assert records >= 30
    for build in builds.values():
        assert build["records"] == records and build["seconds"] > 0 and 0 < build["write_seconds"] < build["seconds"]
        assert build["output_bytes"] > 0
    original, raw = builds["original", 1]["output_bytes"], builds["224x224 raw", 1]["output_bytes"]
    assert raw > records * 224 * 224 * 3 and builds["shortest:256 jpeg", 1]["output_bytes"] < original
    assert "`image-tfrecords build --source CORPUS --destination OUT" in text
    number, diff = r"[\d.]+", r"[+-][\d.]+"  # seconds, CPU s, CPU vs original, write s, ms/image, write vs original
    assert re.search(r"\n## Image options\n", text)
    assert re.search(rf"\| `--resize 224x224 --encoding raw --channels 3` \| 1 \| {number} \| {number} \| {diff} \| "
                     rf"{number} \| {number} \| {diff} \|", text)
    assert re.search(r"On one core, the write stage costs [\d.]+ ms per image stored as it is; `--resize shortest:256",
                     text)


def check_signals(data: dict[str, Any], text: str) -> None:
    """The image signals' cost: a full build and a night, each with and without them, in one round; the
    builds without them record no signals (the bench really switched them off)."""
    runs = data["signals"]["runs"]
    for variant in ("with", "without"):
        for kind in ("full", "night"):
            assert len(runs[variant][kind]) == 1 and runs[variant][kind][0]["cpu_seconds"] > 0
            assert 0 < runs[variant][kind][0]["inspect"] < runs[variant][kind][0]["seconds"]
            assert (runs[variant][kind][0]["measured"] > 0) == (variant == "with")
    assert re.search(r"\| full \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [\d.]+ \| [+-][\d.]+% \|", text)
    assert re.search(r"Inspection per image .*: \d+ us without the measurements, \d+ us with them", text)
    assert re.search(r"Each round's pair \(with / without - 1, CPU\), in order: full [+-][\d.]+%; night [+-][\d.]+%\.",
                     text)
    assert isinstance(data["signals"]["compiled"], bool) and "The thumbnail's sums came from the " in text
    targets = {t["target"]: t for t in data["targets"]}
    assert any(t.startswith("night build with the image signals") for t in targets)


def corpus_module() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import make_corpus
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return make_corpus


def test_corpus_is_the_projects_own_and_reproducible(tmp_path: Path) -> None:
    make_corpus = corpus_module().make_corpus
    first, again, other = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    count, nbytes, source = make_corpus(str(first), images=12, seed=3, synthetic=True)
    make_corpus(str(again), images=12, seed=3, synthetic=True)
    make_corpus(str(other), images=12, seed=4, synthetic=True)
    files = sorted(p.relative_to(first) for p in first.rglob("*") if p.is_file())
    assert count == len(files) >= 5 and nbytes == sum((first / f).stat().st_size for f in files)
    assert "synthetic" in source
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((first / f).read_bytes() == (again / f).read_bytes() for f in files)
    assert {p.read_bytes() for p in other.rglob("*") if p.is_file()}.isdisjoint((first / f).read_bytes() for f in files)
    for f in files:
        image = Image.open(first / f)
        image.load()
        assert 400 <= max(image.size) <= 640 and image.mode == "RGB"


def test_corpus_falls_back_to_synthetic_photos_offline(tmp_path: Path, monkeypatch: Any) -> None:
    """apt-get that fails (no network): no photos, nothing left in the cache's folder, synthetic pixels."""
    module = corpus_module()
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "apt-get").write_text("#!/bin/sh\necho 'E: no network' >&2\nexit 100\n")
    (fake / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    cache = tmp_path / "bench" / "photos"
    assert module.debian_photos(cache) == []
    assert list(cache.parent.iterdir()) == []  # no half-unpacked package, no empty cache
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))  # no apt-get at all
    assert module.debian_photos(cache) == []
    monkeypatch.setattr(module, "debian_photos", lambda: [])
    count, _, source = module.make_corpus(str(tmp_path / "out"), images=5, seed=0)
    assert count >= 5 and "synthetic" in source and "no photo package" in source
