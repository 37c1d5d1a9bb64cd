"""The cost of the image options (issue 14)."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, corpus_facts, make_corpus, measure, stage_seconds

# -- image options (issue 14) ----------------------------------------------------------------------
# (key, the build's options): the same corpus built as it is and with issue 14's image options
OPTION_BUILDS = (
    ("original", ()),
    ("shortest:256 jpeg", ("--resize", "shortest:256", "--encoding", "jpeg", "--jpeg-quality", "90")),
    ("224x224 raw", ("--resize", "224x224", "--encoding", "raw", "--channels", "3")),
    ("longest:512", ("--resize", "longest:512")),
)


def options_cost(images: int, work: Path, synthetic: bool, rounds: int) -> dict[str, Any]:
    """``image-tfrecords build`` of one corpus with each of ``OPTION_BUILDS``' options, at ``--workers 1``
    (the cost per image on one core) and at the CPU count: a full build into a fresh local folder each time,
    in a rotating order, ``rounds`` rounds; per build the lowest total, CPU (user + system of the build and
    its worker processes), write-stage and card seconds (each its own best; stages from the CLI's ``stages:``
    line), its records and its shards' bytes (manifest)."""
    corpus, pixels = make_corpus(images, work, synthetic=synthetic)
    count, nbytes = corpus_facts(corpus)
    cores = os.cpu_count() or 1
    out = work / "options-out"
    base = ["--dataset", "options", "--version", "v1", "--no-progress"]
    cells = [(key, workers) for workers in sorted({1, cores}) for key, _ in OPTION_BUILDS]
    extra = dict(OPTION_BUILDS)
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {cell: [] for cell in cells}
    load = os.getloadavg()[0]
    for number in range(rounds):
        for key, workers in cells[number % len(cells):] + cells[:number % len(cells)]:
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=False)
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            run = measure([PY, "-m", "image_tfrecords", "build", "--source", str(corpus), "--destination", str(out),
                           *base, "--workers", str(workers), *extra[key]], cwd=ROOT)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the build and its workers, all waited for
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            manifest = json.loads((out / "options" / "v1" / "manifest.json").read_text())
            stages = stage_seconds(run.stdout)
            runs[key, workers].append({
                "seconds": run.seconds, "cpu_seconds": cpu, "rss_mb": run.rss_mb, "stages": stages,
                "records": manifest["num_records"],
                "bytes": sum(s["num_bytes"] for split in manifest["splits"].values() for s in split["shards"])})
            print(f"  round {number + 1}, {key}, --workers {workers}: {run.seconds:.2f} s ({cpu:.2f} s CPU), "
                  f"write {stages.get('write', 0):.2f} s", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    builds = []
    for key, workers in cells:
        done = runs[key, workers]
        builds.append({"key": key, "options": " ".join(extra[key]), "workers": workers,
                       "seconds": min(r["seconds"] for r in done),
                       "cpu_seconds": min(r["cpu_seconds"] for r in done),
                       "write_seconds": min(r["stages"].get("write", 0.0) for r in done),
                       "card_seconds": min(r["stages"].get("card", 0.0) for r in done),
                       "records": done[0]["records"], "output_bytes": done[0]["bytes"],
                       "rss_mb": max(r["rss_mb"] for r in done), "runs": done})
    return {"images": count, "megabytes": nbytes / 1e6, "pixels": pixels, "cores": cores, "rounds": rounds,
            "load_before": load,
            "command": " ".join(["image-tfrecords build --source CORPUS --destination OUT", *base,
                                 "--workers N OPTIONS"]),
            "builds": builds}


def render_options(report: dict[str, Any]) -> list[str]:
    """The "Image options" section (docs/features.md links to BENCHMARKS.md#image-options: keep the heading)."""
    builds = report["builds"]
    original = {b["workers"]: b for b in builds if b["key"] == "original"}

    def ms(b: dict[str, Any]) -> float:  # write stage, ms per image
        return 1000 * b["write_seconds"] / b["records"]

    def cpu_more(b: dict[str, Any]) -> float:  # CPU ms per image more than the original build's
        return 1000 * (b["cpu_seconds"] - original[b["workers"]]["cpu_seconds"]) / b["records"]

    def write_more(b: dict[str, Any]) -> float:  # write ms per image more than the original build's
        return ms(b) - ms(original[b["workers"]])

    lines = [
        "## Image options", "",
        f"Issue 14's options on the {report['images']}-file corpus ({report['megabytes']:.1f} MB, "
        f"{original[1]['records']} records; pixels: {report['pixels']}): `{report['command']}`, a full build "
        f"into a fresh local folder each time, with N = 1 (the cost per image on one core) and "
        f"N = {report['cores']} (this machine's cores; write ms/image is then wall time, not CPU). Best "
        f"of {report['rounds']} round{'s' * (report['rounds'] > 1)} in a rotating order (total, CPU, write and "
        "card seconds each their own lowest). CPU: user + system seconds of the build and its worker "
        "processes, which other load on the machine changes less than wall time. Write: the CLI's `stages:` "
        "line, the stage that reads each image, resizes and encodes it and writes the shards (inspection is "
        "the same for every build); vs original: per image, minus the original build's at the same N. "
        "Output MB: the shards' bytes (the manifest's `num_bytes`). Load average before the runs: "
        f"{report['load_before']:.2f}.", "",
        "| options | workers | seconds | CPU s | CPU ms/image vs original | write s | write ms/image "
        "| write vs original, ms/image | card s | output MB | MB/image |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for b in builds:
        first = b["key"] == "original"
        label = f"`{b['options']}`" if b["options"] else "none (original)"
        cpu, write = ("", "") if first else (f"{cpu_more(b):+.2f}", f"{write_more(b):+.2f}")
        lines.append(f"| {label} | {b['workers']} | {b['seconds']:.2f} | {b['cpu_seconds']:.2f} | {cpu} | "
                     f"{b['write_seconds']:.2f} | {ms(b):.2f} | {write} | {b['card_seconds']:.2f} | "
                     f"{b['output_bytes'] / 1e6:.1f} | {b['output_bytes'] / 1e6 / b['records']:.4f} |")
    base = original[1]
    parts = []
    for b in [b for b in builds if b["workers"] == 1 and b["key"] != "original"]:
        more = write_more(b)
        parts.append(f"`{b['options']}` {'adds' if more >= 0 else 'saves'} {abs(more):.1f} ms per image "
                     f"({ms(b):.1f} ms; {cpu_more(b):+.1f} ms of CPU per image for the whole build) and makes "
                     f"{b['output_bytes'] / base['output_bytes']:.2f}x the original's bytes")
    lines += ["", f"On one core, the write stage costs {ms(base):.2f} ms per image stored as it is; "
              + "; ".join(parts) + "."]
    if report["cores"] > 1:
        many = [b for b in builds if b["workers"] == report["cores"]]
        lines[-1] += (f" With {report['cores']} workers the write stage's wall time per image is "
                      + ", ".join(f"{ms(b):.2f} ms ({b['key']})" for b in many) + ".")
    return [*lines, ""]

