"""`make bench`: the project's build against the seed-style converters and the copy floor.

    python bench/run.py [--rounds 3] [--scale 10000,100000] [--incremental 6000,100000] [--chain 10]
                        [--out BENCHMARKS.md]
    python bench/run.py --only incremental [--incremental 6000] [--out FILE]  # that section alone
    python bench/run.py --only options [--options 3670] [--rounds 2] [--out FILE]  # likewise
    python bench/run.py --only readers [--readers 3670] [--out FILE]  # likewise
    python bench/run.py --only signals [--signals 6000] [--rounds 3] [--out FILE]  # likewise
    python bench/run.py --only s3path [--s3path 3000] [--s3path-night 6000] [--s3path-list 200000]
                        [--s3path-dag 10000]  # likewise
    python bench/run.py --smoke --out DIR        # tiny corpus, one round: what `make test` runs

Main table, on the flowers-sized corpus of ``bench/make_corpus.py`` (the project's own generator, run
in this process: photo pixels from Debian's mate-backgrounds, fetched once into ``.bench/photos``, or
synthetic photos where that package cannot be fetched; ``--smoke`` always uses the synthetic ones, so
``make test`` needs no network; BENCHMARKS.md names the source), every contender once per round in a
rotating order, the median of ``--rounds``:

(a) ``bench/seed_convert.py --threads 1``: the tutorials' converter, one process;
(b) the same with 2 threads, as build_image_data.py does;
(c) ``cp -r`` of the corpus: the I/O floor;
(d) ``image-tfrecords build`` with ``--workers 1`` and ``--workers 2`` into a local
    folder, validation included;
(e) the DAG end to end into SeaweedFS under ``airflow dags test``.

Scale runs (``--scale``) run each stage as its own process, as the DAG's tasks run (write tasks two at
a time), and record wall time and peak RSS per stage, the XCom each task would return, and the
number of mapped tasks. Peak RSS is the largest single process of a command (its VmHWM, sampled every 20 ms).

Incremental nights (``--incremental``, issue 12): for each size, a first version, an unchanged night,
then one night of changes (1% added, 0.1% deleted, 0.05% changed) built incrementally and with
``--full``: wall time, bytes read from the source and written, shards reused, rewritten and written,
and whether both give the same records; at the smallest size, a chain of ``--chain`` such nights
shows when the plan compacts. The 100k corpus is the scale runs' one.
Scaling over cores (``--scaling``, issue 13): ``image-tfrecords build --workers N`` for N = 1, 2, 4 ...
the CPU count on a 20k-image corpus, per-stage seconds from the CLI's ``stages:`` line, beside ``cp -r`` +
``sync``; then (``--dag-stack``) the DAG through a real scheduler (PostgreSQL, LocalExecutor with
parallelism = cores, ``tools/airflow_stack.py``) on 10k images beside the CLI with the same cores.
``--only scaling`` runs that section alone.
Image options (``--options``, issue 14; BENCHMARKS.md#image-options): ``image-tfrecords build`` of the main
table's corpus (``--options`` images, default ``--images``) as it is, with ``--resize shortest:256 --encoding
jpeg --jpeg-quality 90``, with ``--resize 224x224 --encoding raw --channels 3`` and with ``--resize
longest:512``, at ``--workers 1`` and at the CPU count, the best of ``--rounds``: total, CPU and write-stage
seconds, write ms per image and its difference from the original build's, output MB and MB per image.
``--only options`` runs that section alone.
What the image signals cost (``--signals``, issue 25; ``bench/signals_cost.py``): full builds and a 1% night of
one corpus (``--signals`` images, default ``--images``) with the perceptual hash and quality signals and, in
the same rounds, without them (inspection's thumbnail measurements switched off in the bench's process); at
least 8 rounds up to 20,000 images (one pair of builds moves by 5-15% here), ``--rounds`` above that.
``--only signals`` runs that section alone.
Random-access readers (``--readers``, issue 26; ``bench/readers.py``): records/s of one version built from the
main table's corpus, read by ``RecordSource`` alone, through PyTorch's DataLoader (0 and 2 workers) and Grain,
against ``tfrecord``'s ``MultiTFRecordDataset`` (0 and 2 workers) and ``tf.data``, with and without decoding
(torch, Grain and tfrecord in a venv of their own, made once in the work folder). ``--only readers`` runs
that section alone; ``--smoke`` skips it (it would install torch).
The S3 path (``--s3path``, issue 50; ``bench/s3_path.py``): the same corpus local -> local, S3 -> S3 on loopback
and with 20 ms added to every request, the 1% night on S3, listing many keys; then the DAG on a LocalExecutor
stack, S3 -> S3, beside the CLI's same builds (``--s3path-dag``, ``bench/dag_s3.py``; ``--smoke`` skips it).
``--only s3path`` runs that section alone.
Corpora and outputs live in ``.bench/`` (not committed).

One module per section: ``common`` (measuring a command, the corpora), ``main_table``, ``dag_tasks`` (the
scale runs: the DAG's own tasks, taken from the DAG), ``scaling``, ``image_options``, ``incremental``; this
module reads the command line and writes the report.
"""


from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a script: the project root is importable only now

from bench import dag_s3  # noqa: E402
from bench.common import compile_package, corpus_facts, make_corpus, preamble  # noqa: E402
from bench.dag_tasks import render_scale, run_tasks, scale_targets, write_alone  # noqa: E402
from bench.image_options import options_cost, render_options  # noqa: E402
from bench.incremental import incremental_nights, incremental_targets, render_incremental  # noqa: E402
from bench.main_table import DagRunner, chart, main_table, render, targets  # noqa: E402
from bench.readers import readers, readers_targets, render_readers  # noqa: E402
from bench.s3_path import render_s3_path, s3_path, s3_path_targets  # noqa: E402
from bench.scaling import dag_on_stack, dag_targets, render_dag_on_stack, render_scaling, scaling, scaling_targets  # noqa: E402
from bench.signals_cost import SIGNALS_ROUNDS, render_signals, signals_cost, signals_targets  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=3670, help="main table corpus size (default: 3670)")
    parser.add_argument("--scale", default="10000,100000", help="image counts of the scale runs ('' for none)")
    parser.add_argument("--incremental", default="6000,100000",
                        help="image counts of the incremental nights ('' for none; default: 6000,100000)")
    parser.add_argument("--chain", type=int, default=10,
                        help="nights in the chain, at the smallest --incremental size (0 for none; default: 10)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2,
                        help="--workers of the incremental nights' builds (default: this machine's cores)")
    parser.add_argument("--no-s3", action="store_true",
                        help="incremental nights without the night on a SeaweedFS server")
    parser.add_argument("--scaling", type=int, default=20_000,
                        help="corpus size of the scaling over cores (0 for none; default: 20000)")
    parser.add_argument("--dag-stack", type=int, default=10_000,
                        help="images of the DAG run on a real LocalExecutor stack, with --scaling (0 for none)")
    parser.add_argument("--options", type=int, default=None,
                        help="corpus size of the image options' builds (0 for none; default: --images)")
    parser.add_argument("--readers", type=int, default=None,
                        help="corpus size of the random-access readers' version (0 for none; default: --images)")
    parser.add_argument("--signals", type=int, default=None,
                        help="corpus size of the image signals' cost (0 for none; default: --images)")
    parser.add_argument("--s3path", type=int, default=3000,
                        help="images of the S3 path's builds (issue 50; 0 for none; default: 3000)")
    parser.add_argument("--s3path-night", type=int, default=6000, help="images of the S3 path's night (default 6000)")
    parser.add_argument("--s3path-list", type=int, default=200_000,
                        help="keys of the S3 path's listing (default 200000)")
    parser.add_argument("--s3path-dag", type=int, default=10_000,
                        help="images of the S3 path's DAG runs on a LocalExecutor stack beside the CLI (0 for none; "
                             "default 10000)")
    parser.add_argument("--only", choices=("all", "incremental", "scaling", "options", "readers", "signals",
                                           "s3path"),
                        default="all",
                        help="incremental, scaling, options or readers: only that section (default --out: "
                             "WORK/SECTION.md)")
    parser.add_argument("--no-dag", action="store_true", help="skip (e)")
    parser.add_argument("--out", help="markdown file to write (default: BENCHMARKS.md)")
    parser.add_argument("--work", default=str(ROOT / ".bench"), help="corpora and scratch space")
    parser.add_argument("--smoke", action="store_true", help="tiny corpus, one round, small scale: for tests")
    args = parser.parse_args(argv)
    shard_size_mb = 100.0
    if args.smoke:  # small shards, so that the few hundred images of a night have shards to reuse
        args.rounds, args.images, args.scale, args.incremental, args.chain = 1, 40, "30,60", "300", 5
        args.scaling, args.dag_stack, args.options, args.readers, args.signals = 200, 0, 40, 0, 40
        args.s3path, args.s3path_night, args.s3path_list, args.s3path_dag = 60, 300, 2000, 0
        shard_size_mb = 4.0
    if args.options is None:
        args.options = args.images
    if args.readers is None:
        args.readers = args.images
    if args.signals is None:
        args.signals = args.images
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    compile_package()
    out = Path(args.out or (work / f"{args.only}.md" if args.only != "all" else ROOT / "BENCHMARKS.md"))
    command = "make bench" if not args.smoke else "bench/run.py --smoke"
    if args.only == "incremental":
        command = (f"bench/run.py{' --smoke' * args.smoke} --only incremental --incremental {args.incremental} "
                   f"--chain {args.chain} --workers {args.workers}{' --no-s3' * args.no_s3}")
    if args.only == "scaling":
        command = f"bench/run.py{' --smoke' * args.smoke} --only scaling --scaling {args.scaling}"
    if args.only == "options":
        command = (f"bench/run.py{' --smoke' * args.smoke} --only options --options {args.options} "
                   f"--rounds {args.rounds}")
    if args.only == "readers":
        command = f"bench/run.py --only readers --readers {args.readers}"
    if args.only == "signals":
        command = (f"bench/run.py{' --smoke' * args.smoke} --only signals --signals {args.signals} "
                   f"--rounds {args.rounds}")
    if args.only == "s3path":
        command = (f"bench/run.py{' --smoke' * args.smoke} --only s3path --s3path {args.s3path} --s3path-night "
                   f"{args.s3path_night} --s3path-list {args.s3path_list}")
    data: dict[str, Any] = {}
    rows: list[tuple[str, str, bool]] = []
    issues = []
    if args.only == "all":
        print(f"corpus of {args.images} images ...", flush=True)
        corpus, pixels = make_corpus(args.images, work, synthetic=args.smoke)
        dag = None if args.no_dag else DagRunner(work / "dag")
        try:
            contenders = main_table(corpus, work, args.rounds, dag)
            xcoms = dag.xcom_sizes() if dag else []
        finally:
            if dag:
                dag.close()
                shutil.rmtree(dag.work, ignore_errors=True)
        print("write stage alone ...", flush=True)
        write_seconds = write_alone(corpus, work)
        scale: dict[int, Any] = {}
        for images in [int(n) for n in args.scale.split(",") if n.strip()]:
            print(f"scale run: {images} images ...", flush=True)
            scaled, _ = make_corpus(images, work, parts=1 if images <= 20_000 else 2, synthetic=args.smoke)
            scale[images] = run_tasks(scaled, work)
            scale[images]["megabytes"] = corpus_facts(scaled)[1] / 1e6
        chart_path = out.with_name("benchmarks.png") if not args.smoke else out.with_suffix(".png")
        chart(contenders, args.images, chart_path)
        text = render(contenders, corpus_facts(corpus), args.rounds, xcoms, chart_path.name, command, pixels)
        text += "\n".join(render_scale(scale)) + "\n" if scale else ""
        rows += targets(contenders, xcoms, write_seconds) + scale_targets(scale)
        issues.append("5")
        data = {"pixels": pixels, "contenders": {c.key: {"label": c.label, "seconds": [r.seconds for r in c.runs],
                                                         "rss_mb": [r.rss_mb for r in c.runs]} for c in contenders},
                "write_seconds": write_seconds, "scale": scale, "xcoms": xcoms}
    else:
        text = "\n".join(preamble(command)) + "\n"
    if args.options and args.only in ("all", "options"):
        print(f"image options: {args.options} images ...", flush=True)
        data["options"] = options_cost(args.options, work, args.smoke, args.rounds)
        text += "\n".join(render_options(data["options"])) + "\n"
    if args.scaling and args.only in ("all", "scaling"):
        print(f"scaling over cores: {args.scaling} images ...", flush=True)
        data["scaling"] = scaling(args.scaling, work, args.smoke, rounds=min(args.rounds, 2))
        text += "\n".join(render_scaling(data["scaling"])) + "\n"
        rows += scaling_targets(data["scaling"])
        issues.append("13")
        if args.dag_stack:
            print(f"the DAG on a real scheduler: {args.dag_stack} images ...", flush=True)
            data["dag_stack"] = dag_on_stack(args.dag_stack, work, args.smoke)
            text += "\n".join(render_dag_on_stack(data["dag_stack"])) + "\n"
            rows += dag_targets(data["dag_stack"])
    incremental: dict[int, Any] = {}
    sizes = (sorted(int(n) for n in args.incremental.split(",") if n.strip())
             if args.only in ("all", "incremental") else [])
    for images in sizes:
        print(f"incremental nights: {images} images ...", flush=True)
        incremental[images] = incremental_nights(images, work, args.smoke, shard_size_mb,
                                                 chain=args.chain if images == sizes[0] else 0,
                                                 workers=args.workers, s3=not args.no_s3)
    if incremental:
        text += "\n".join(render_incremental(incremental)) + "\n"
        rows += incremental_targets(incremental)
        issues.append("22")
        data["incremental"] = incremental
    if args.readers and args.only in ("all", "readers"):
        print(f"random-access readers: {args.readers} images ...", flush=True)
        data["readers"] = readers(args.readers, work, args.smoke)
        text += "\n".join(render_readers(data["readers"])) + "\n"
        rows += readers_targets(data["readers"])
        issues.append("26")
    if args.signals and args.only in ("all", "signals"):
        print(f"image signals' cost: {args.signals} images ...", flush=True)
        # a pair of builds moves by 5-15% on this machine: 8 pairs at up to 20,000 images for a median within ~2%
        rounds = args.rounds if args.smoke or args.signals > 20_000 else max(args.rounds, SIGNALS_ROUNDS)
        data["signals"] = signals_cost(args.signals, work, args.smoke, rounds)
        text += "\n".join(render_signals(data["signals"])) + "\n"
        rows += signals_targets(data["signals"])
        issues.append("25")
    if args.s3path and args.only in ("all", "s3path"):
        print(f"the S3 path: {args.s3path} images ...", flush=True)
        data["s3path"] = s3_path(args.s3path, work, args.smoke, args.s3path_night, args.s3path_list,
                                 workers=min(args.workers, os.cpu_count() or 2))
        text += "\n".join(render_s3_path(data["s3path"])) + "\n"
        rows += s3_path_targets(data["s3path"])
        if args.s3path_dag:
            print(f"the S3 path through the DAG: {args.s3path_dag} images ...", flush=True)
            data["s3path_dag"] = dag_s3.measure(args.s3path_dag, work, synthetic=args.smoke)
            text += "\n".join(dag_s3.render(data["s3path_dag"])) + "\n"
            rows += dag_s3.targets(data["s3path_dag"])
        issues.append("50")
    if rows:
        text += (f"\n## Targets (issue{'s' if len(issues) > 1 else ''} {' and '.join(issues)})\n\n"
                 "| target | measured | met |\n|---|---|---|\n") + "".join(
            f"| {t} | {m} | {'yes' if ok else '**no**'} |\n" for t, m, ok in rows)
    notes = Path(__file__).with_name("NOTES.md")
    if not args.smoke and args.only == "all" and notes.exists():
        text += "\n" + notes.read_text()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    data["targets"] = [{"target": t, "measured": m, "met": ok} for t, m, ok in rows]
    (out.with_suffix(".json")).write_text(json.dumps(data, indent=1) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
