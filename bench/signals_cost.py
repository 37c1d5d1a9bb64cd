"""What the perceptual hash and the image-quality signals cost a build (issue 25): the same code with and
without them.

"Without" runs the same CLI in a process whose inspection skips them (``probe._thumbnail_facts`` replaced
by one that measures nothing; the worker processes are forked from it, so they skip them too): every
image is still decoded and checked as before, and the card finds no signals to summarise. Nothing else
differs, so the difference is what the features cost, measured in the same rounds on the same corpus:
a full build, and a night (the incremental bench's 1% night) on a base built the same way, after one
full build that is not counted.
"""

from __future__ import annotations

import contextlib
import csv
import os
import resource
import shutil
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, Run, corpus_facts, make_corpus, measure, stage_seconds
from bench.incremental import EXTRA_SEED, Nights, night_counts

# the CLI, with inspection's thumbnail measurements switched off (bench only: no build option does this)
WITHOUT = ("import sys; import image_tfrecords.images.probe as p; "
           "p._thumbnail_facts = lambda *a, **k: ('', p._UNMEASURED); "
           "from image_tfrecords.cli import run; run(sys.argv[1:])")
VARIANTS = ("with", "without")
SIGNALS_ROUNDS = 8  # the fewest rounds at up to 20,000 images (bench/run.py)


def _cli(variant: str) -> list[str]:
    return [PY, "-m", "image_tfrecords"] if variant == "with" else [PY, "-c", WITHOUT]


def _timed(cmd: list[str]) -> tuple[Run, float]:
    """``measure(cmd)`` and the CPU seconds (user + system) of it and its worker processes."""
    os.sync()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = measure(cmd, cwd=ROOT)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return run, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def signals_cost(images: int, work: Path, synthetic: bool, rounds: int) -> dict[str, Any]:
    """Full builds of the ``images``-image corpus and a 1% night, each with and without the signals,
    alternating (which goes first alternates too), ``rounds`` rounds; wall and CPU seconds and the inspect
    and card stages of each run."""
    corpus, pixels = make_corpus(images, work, synthetic=synthetic)
    count, nbytes = corpus_facts(corpus)
    folder = work / "signals"
    shutil.rmtree(folder, ignore_errors=True)
    counts = night_counts(count)
    need = 2 * counts["added"] + counts["changed"]  # as the incremental section's: its cached corpus
    extras, _ = make_corpus(need + max(20, need // 10), work, synthetic=synthetic, seed=EXTRA_SEED)
    nights = Nights(corpus, extras, folder / "night", 100.0)
    args = ["--dataset", "nightly", "--workers", "2", "--shard-size-mb", "100", "--no-progress"]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {v: {"full": [], "night": []} for v in VARIANTS}

    def build(variant: str, kind: str, source: Path, dest: Path, version: str) -> None:
        run, cpu = _timed([*_cli(variant), "build", "--source", str(source), "--destination", str(dest), *args,
                           "--version", version])
        stages = stage_seconds(run.stdout)
        with open(dest / "nightly" / version / "labels.csv", newline="") as f:
            measured = sum(1 for row in csv.DictReader(f) if row.get("brightness"))  # records with signals
        inspect = stages.get("inspect", 0.0) + stages.get("read", 0.0)  # the stage whole: its passes and its reading
        runs[variant][kind].append({"seconds": run.seconds, "cpu_seconds": cpu, "inspect": inspect,
                                    "card": stages.get("card", 0.0), "measured": measured})
        print(f"  {kind} {variant}: {run.seconds:.2f} s ({cpu:.2f} s CPU), inspect {inspect:.2f} s, "
              f"card {stages.get('card', 0):.2f} s", flush=True)

    # the night's source: the corpus once mutated; each variant's base is built from the corpus itself
    bases = {v: folder / f"base-{v}" for v in VARIANTS}
    for variant in VARIANTS:
        _timed([*_cli(variant), "build", "--source", str(nights.source), "--destination", str(bases[variant]),
                *args, "--version", "night01"])
    nights.mutate(2, counts)
    # not counted: the first full build after the bases measured 13-18% more CPU than its pair at 6,000 and at
    # 100,000 images (2026-11-26; with the signals both times, as round 0 runs them first)
    _timed([*_cli("without"), "build", "--source", str(nights.source), "--destination", str(folder / "warm-up"),
            *args, "--version", "full"])
    shutil.rmtree(folder / "warm-up", ignore_errors=True)
    for number in range(rounds):
        order = VARIANTS if number % 2 == 0 else VARIANTS[::-1]
        for variant in order:
            out = folder / "out"
            shutil.rmtree(out, ignore_errors=True)
            build(variant, "full", nights.source, out, "full")
        for variant in order:
            out = folder / "out"
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["cp", "-al", str(bases[variant]), str(out)], check=True)
            build(variant, "night", nights.source, out, "night02")
    shutil.rmtree(folder, ignore_errors=True)
    from image_tfrecords.images import thumbnail

    return {"images": count, "megabytes": nbytes / 1e6, "pixels": pixels, "rounds": rounds, "runs": runs,
            "load_before": os.getloadavg()[0], "per_image": per_image(corpus, 100 if synthetic else 1000),
            "compiled": thumbnail._thumbstats is not None}


def per_image(corpus: Path, files: int = 1000) -> dict[str, Any]:
    """Inspection's CPU per image with and without the thumbnail measurements, in this process, interleaved
    image by image, which goes first alternating (so the machine's drift, which moves whole builds by 10%
    between rounds, and the caches the first of the two calls warms for the second cancel): the
    first ``files`` images of the corpus in sorted order, each inspected both ways, twice, as a default
    build without the near-duplicate search or quality_reject inspects them (PNGs checked without their pixels)."""
    from image_tfrecords.errors import RejectedImage
    from image_tfrecords.images import probe

    paths = sorted(p for p in corpus.rglob("*") if p.is_file() and not p.name.startswith("."))[:files]
    datas = [p.read_bytes() for p in paths]
    measuring = probe._thumbnail_facts
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for data in datas[:20]:  # warm up: numpy's import and first calls are not an image's cost
        with contextlib.suppress(RejectedImage):
            probe.inspect_image(data, png_pixels=False)
    for _ in range(2):
        for number, data in enumerate(datas):
            # which goes first alternates: the first call on an image pays for its bytes' and the decoder's
            # cold caches (with "with" always first, that alone read as +40 us an image)
            for variant in VARIANTS if number % 2 == 0 else VARIANTS[::-1]:
                probe._thumbnail_facts = measuring if variant == "with" else (lambda *a, **k: ("", probe._UNMEASURED))
                started = time.process_time()
                with contextlib.suppress(RejectedImage):  # a reject costs what it costs, either way
                    probe.inspect_image(data, png_pixels=False)  # as a build without the search: PNGs unmeasured
                times[variant].append(time.process_time() - started)
    probe._thumbnail_facts = measuring
    return {"files": len(datas), **{v: 1e6 * statistics.fmean(t) for v, t in times.items()}}


def _median(values: list[dict[str, Any]], key: str) -> float:
    return statistics.median(v[key] for v in values)


def _more(report: dict[str, Any], kind: str) -> float:
    """The median over rounds of (with / without - 1) of the CPU seconds: each round's two builds ran
    back to back, so the machine's drift between rounds cancels."""
    runs = report["runs"]
    return statistics.median(b["cpu_seconds"] / a["cpu_seconds"] - 1
                             for a, b in zip(runs["without"][kind], runs["with"][kind], strict=True))


def render_signals(report: dict[str, Any]) -> list[str]:
    """The "What the image signals cost" section."""
    runs = report["runs"]
    lines = [
        "## What the image signals cost", "",
        f"Issue 25's perceptual hash and quality signals on the {report['images']}-file corpus "
        f"({report['megabytes']:.1f} MB; pixels: {report['pixels']}), `--workers 2`: a full build into a fresh "
        "folder, and the incremental section's 1% night on a base built the same way; each with the signals "
        "(the CLI as it is) and without them (the same CLI with inspection's thumbnail measurements switched "
        "off, `bench/signals_cost.py`: every image still decoded and checked), alternating, "
        f"{report['rounds']} round{'s' * (report['rounds'] > 1)} after one full build that is not counted; "
        "medians. CPU: user + system seconds of the build and its workers. On this machine the same build's CPU "
        "seconds move by 5-20% from one round to the next, so \"more\" is the median over rounds of each "
        "round's pair (with / without, run back to back), and the per-image line below (one process, "
        "interleaved image by image, which goes first alternating) is the steadier figure.",
        "",
        "| build | without: s | with: s | without: CPU s | with: CPU s | more (CPU, median of pairs) "
        "| inspect s (without / with) | card s (without / with) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind in ("full", "night"):
        a, b = runs["without"][kind], runs["with"][kind]
        wall = (_median(a, "seconds"), _median(b, "seconds"))
        cpu = (_median(a, "cpu_seconds"), _median(b, "cpu_seconds"))
        lines.append(
            f"| {kind} | {wall[0]:.2f} | {wall[1]:.2f} | {cpu[0]:.2f} | {cpu[1]:.2f} | {_more(report, kind):+.1%} | "
            f"{_median(a, 'inspect'):.2f} / {_median(b, 'inspect'):.2f} | "
            f"{_median(a, 'card'):.2f} / {_median(b, 'card'):.2f} |")
    pairs = {kind: ", ".join(f"{b['cpu_seconds'] / a['cpu_seconds'] - 1:+.1%}"
                             for a, b in zip(runs["without"][kind], runs["with"][kind], strict=True))
             for kind in ("full", "night")}
    lines += ["", f"Each round's pair (with / without - 1, CPU), in order: full {pairs['full']}; "
              f"night {pairs['night']}."]
    each = report["per_image"]
    lines += ["", f"Inspection per image (`inspect_image` on the corpus's first {each['files']} files, CPU, "
              f"interleaved): {each['without']:.0f} us without the measurements, {each['with']:.0f} us with them "
              f"(+{each['with'] - each['without']:.0f} us, {each['with'] / each['without'] - 1:+.1%}). The thumbnail's "
              "sums came from " + ("the compiled pass (`images/_thumbstats.c`)." if report.get("compiled", True) else
                                   "the numpy fallback (the package was installed without its C part).")]
    return [*lines, ""]


def signals_targets(report: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 25's cost target, on the CPU seconds (the wall time's medians move more than 5% between rounds)."""
    rows = []
    for kind in ("full", "night"):
        more = _more(report, kind)
        rows.append((f"{kind} build with the image signals: at most 5% more than without (CPU, "
                     f"{report['images']} images)", f"{more:+.1%}", more <= 0.05))
    return rows
