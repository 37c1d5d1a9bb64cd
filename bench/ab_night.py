"""The incremental night of two package codes side by side, in one run (issue 49's "before and after").

``--other`` is a second checkout of this project (e.g. ``git worktree add ../before <commit>``) whose
compiled parts are built in place (``python -c "from setuptools import setup; setup()" build_ext --inplace``
in that checkout). Both codes run from this venv, the other by ``PYTHONPATH=<other>/include``, on the same
corpus and the same night's changes (``bench/incremental.py``'s ``Nights``): each builds its own first
version, then night 2 incrementally and with ``--full``, taking turns round by round. With ``--s3`` the same
night on a SeaweedFS server (a destination prefix per code and round). Prints a markdown table; medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, compile_package, make_corpus, measure, stage_seconds
from bench.incremental import EXTRA_SEED, Nights, night_counts, page_cache, shard_files


def code_of(checkout: Path) -> str:
    return subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h"], capture_output=True,
                          text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--other", required=True, help="the other checkout (its include/ is run by PYTHONPATH)")
    parser.add_argument("--this", default=str(ROOT), help="the checkout to run as this side (default: this one)")
    parser.add_argument("--images", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--s3", type=int, default=0, help="also the night on SeaweedFS at this many images")
    parser.add_argument("--work", default=str(ROOT / ".bench"))
    args = parser.parse_args()
    work, this, other = Path(args.work).resolve(), Path(args.this).resolve(), Path(args.other).resolve()
    compile_package()
    for checkout in {this, other}:
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(checkout / "include")], check=True)
    sides = {f"this ({code_of(this)})": {**os.environ, "PYTHONPATH": str(this / "include")},
             f"other ({code_of(other)})": {**os.environ, "PYTHONPATH": str(other / "include")}}
    results = {name: {"incremental": [], "full": [], "stages": []} for name in sides}
    local_night(args, work, sides, results)
    lines = table(f"{args.images} images, `--workers {args.workers}`, {args.rounds} rounds taking turns (seconds):",
                  results)
    for name, r in results.items():
        lines.append(f"\n{name}, the median night's stages: {r['stages'][len(r['stages']) // 2]}")
    if args.s3:
        lines += ["", *s3_night(args, work, sides)]
    print("\n".join(lines), flush=True)


def table(title: str, results: dict[str, dict[str, list]]) -> list[str]:
    """A markdown table of each side's median night and ``--full``, their ratio and every run."""
    lines = [title, "", "| code | night, incremental | `--full` | speedup | runs (incremental; full) |",
             "|---|---:|---:|---:|---|"]
    for name, r in results.items():
        inc, full = statistics.median(r["incremental"]), statistics.median(r["full"])
        lines.append(f"| {name} | {inc:.2f} | {full:.2f} | {full / inc:.1f}x | "
                     f"{', '.join(f'{s:.2f}' for s in r['incremental'])}; {', '.join(f'{s:.2f}' for s in r['full'])} |")
    return lines


def local_night(args: argparse.Namespace, work: Path, sides: dict[str, dict[str, str]],
                results: dict[str, dict[str, list]]) -> None:
    counts = night_counts(args.images)
    corpus, _ = make_corpus(args.images, work, parts=1 if args.images <= 20_000 else 2)
    extras, _ = make_corpus(2 * (counts["added"] + counts["changed"]) + 20, work, seed=EXTRA_SEED)
    nights = Nights(corpus, extras, work / f"ab-{args.images}", 100.0, args.workers)
    bases = {}
    for index, (name, env) in enumerate(sides.items()):
        dest = nights.folder / f"out{index}"
        run = measure(nights.command("night01", str(dest)), env=env, cwd=ROOT)
        print(f"  {name}: first version {run.seconds:.2f} s", flush=True)
        bases[name] = dest
    nights.mutate(2, counts)
    for round_ in range(args.rounds):
        for name, env in (list(sides.items()) if round_ % 2 == 0 else list(sides.items())[::-1]):
            again = nights.folder / "again"
            shutil.copytree(bases[name], again, copy_function=os.link)
            page_cache(shard_files(again / "nightly" / "night01"), cached=True)
            os.sync()
            run = measure(nights.command("night02", str(again)), env=env, cwd=ROOT)
            results[name]["incremental"].append(run.seconds)
            results[name]["stages"].append(stage_seconds(run.stdout))
            shutil.rmtree(again)
            os.sync()
            full = measure(nights.command("night02", str(again), full=True), env=env, cwd=ROOT)
            results[name]["full"].append(full.seconds)
            shutil.rmtree(again)
            print(f"  {name}: night {run.seconds:.2f} s, --full {full.seconds:.2f} s", flush=True)
    shutil.rmtree(nights.folder)


def s3_night(args: argparse.Namespace, work: Path, sides: dict[str, dict[str, str]]) -> list[str]:
    """Night 2 on SeaweedFS: a first version per code and round, then the night and ``--full`` of it."""
    from tools import seaweedfs

    counts = night_counts(args.s3)
    corpus, _ = make_corpus(args.s3, work)
    extras, _ = make_corpus(2 * (counts["added"] + counts["changed"]) + 20, work, seed=EXTRA_SEED)
    data = tempfile.mkdtemp(prefix="ab-s3-")
    server = seaweedfs.start(data)
    runs: dict[str, dict[str, list[float]]] = {name: {"incremental": [], "full": []} for name in sides}
    try:
        server.create_bucket("bench")
        for round_ in range(args.rounds):
            order = list(sides.items()) if round_ % 2 == 0 else list(sides.items())[::-1]
            nights = Nights(corpus, extras, work / f"ab-s3-{args.s3}", 100.0, args.workers)
            for index, (_, env) in enumerate(order):
                env = {**{k: v for k, v in env.items() if not k.startswith("AWS_")}, **server.env()}
                measure(nights.command("night01", f"s3://bench/r{round_}s{index}"), env=env, cwd=ROOT)
            nights.mutate(2, counts)
            for index, (name, env) in enumerate(order):
                env = {**{k: v for k, v in env.items() if not k.startswith("AWS_")}, **server.env()}
                dest = f"s3://bench/r{round_}s{index}"
                inc = measure(nights.command("night02", dest), env=env, cwd=ROOT)
                full = measure(nights.command("night02-full", dest, full=True), env=env, cwd=ROOT)
                runs[name]["incremental"].append(inc.seconds)
                runs[name]["full"].append(full.seconds)
                print(f"  S3, {name}: night {inc.seconds:.2f} s, --full {full.seconds:.2f} s", flush=True)
            shutil.rmtree(nights.folder)
    finally:
        seaweedfs.stop(server)
        shutil.rmtree(data, ignore_errors=True)
    return table(f"S3 (SeaweedFS on loopback), {args.s3} images, {args.rounds} rounds taking turns (seconds):", runs)


if __name__ == "__main__":
    main()
