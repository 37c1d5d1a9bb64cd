"""`make bench`: the project's build against the seed-style converters and the copy floor.

    python bench/run.py [--rounds 3] [--scale 10000,100000] [--incremental 6000,100000] [--chain 10]
                        [--out BENCHMARKS.md]
    python bench/run.py --only incremental [--incremental 6000] [--out FILE]  # that section alone
    python bench/run.py --only options [--options 3670] [--rounds 2] [--out FILE]  # likewise
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
Corpora and outputs live in ``.bench/`` (not committed).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import os
import platform
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
AIRFLOW = str(Path(PY).with_name("airflow"))
sys.path.insert(0, str(ROOT))

from bench import make_corpus as corpus_maker  # noqa: E402 - the project root is importable only now


@dataclass
class Run:
    seconds: float
    rss_mb: float
    stdout: str = ""


TASK_LOG = re.compile(r"^(\S+?)Z? \[info\s*\] \[DAG TEST\] (?:starting task_id|end task task_id)", re.M)


def task_span(output: str) -> float | None:
    """Seconds from the first task's start to the last task's end in `airflow dags test` output."""
    stamps = [datetime.fromisoformat(m.group(1)) for m in TASK_LOG.finditer(output)]
    return (max(stamps) - min(stamps)).total_seconds() if stamps else None


@dataclass
class Contender:
    key: str
    label: str
    runs: list[Run] = field(default_factory=list)

    @property
    def seconds(self) -> float:
        return statistics.median(r.seconds for r in self.runs)

    @property
    def rss_mb(self) -> float:
        return max(r.rss_mb for r in self.runs)


def _hwm_mb(pid: int) -> float:
    """VmHWM (peak resident set) of one live process, in MB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), 0.0)
    except OSError:
        return 0.0


class PeakSampler(threading.Thread):
    """Samples the VmHWM of a process and its descendants every ``interval`` seconds (from its start).

    Not ``wait4``'s ``ru_maxrss``: that counts the parent's memory copied at fork (before exec),
    so every small child of a large harness would look as large as the harness.
    """

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            try:
                pids = [self.pid] + [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
            except psutil.Error:
                pids = [self.pid]
            self.peak = max([self.peak] + [_hwm_mb(pid) for pid in pids])
            if self.done.wait(self.interval):
                return


def measure(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    """Run ``cmd``; wall seconds and the peak RSS of its largest process (children included, sampled)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        sampler = PeakSampler(proc.pid)
        sampler.start()
        proc.wait()
        seconds = time.perf_counter() - started
        sampler.done.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return Run(seconds, sampler.peak, stdout + stderr)


# -- corpora ---------------------------------------------------------------------------------------
def make_corpus(images: int, work: Path, parts: int = 1, synthetic: bool = False, seed: int = 0) -> tuple[Path, str]:
    """The make_corpus.py corpus of ``images`` images (cached) and where its pixels came from.

    Debian's photos unless ``synthetic`` or they cannot be had (a corpus of synthetic photos has a
    name of its own, so a cached one is never taken for a real one); big ones are made in ``parts``
    processes with seeds 1..parts and merged by hard links (file names are random, so they do not
    collide). A ``seed`` other than 0 (one process only) gives other images, cached under a name of
    their own."""
    if seed and parts > 1:
        raise ValueError("a seed of its own is for a corpus made in one process")
    work = work.resolve()
    target = work / (f"corpus-{images}" + (f"-seed{seed}" if seed else ""))
    # a cached photo corpus needs no photos at hand; otherwise they are fetched once, before any worker
    synthetic = synthetic or not ((target / ".complete").exists() or corpus_maker.debian_photos())
    if synthetic:
        target = target.with_name(target.name + "-synthetic")
    done = target / ".complete"
    if done.exists():
        return target, done.read_text().strip() or "not recorded (made before the source was)"
    shutil.rmtree(target, ignore_errors=True)
    if parts <= 1:
        _, _, source = corpus_maker.make_corpus(str(target), images, seed=seed, synthetic=synthetic)
    else:
        pieces = [work / f"corpus-{images}.part{i}" for i in range(parts)]
        with concurrent.futures.ProcessPoolExecutor(parts) as pool:
            jobs = [pool.submit(corpus_maker.make_corpus, str(piece), images // parts, seed=i + 1,
                                synthetic=synthetic) for i, piece in enumerate(pieces)]
            results = [job.result() for job in jobs]  # every part, so a failure in any raises
        source = results[0][2]
        for piece in pieces:
            for path in piece.rglob("*"):
                if path.is_file():
                    dest = target / path.relative_to(piece)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.link(path, dest)
            shutil.rmtree(piece)
    done.write_text(source + "\n")
    print(f"  {corpus_facts(target)[0]} images in {target} (pixels: {source})", flush=True)
    return target, source


def corpus_facts(corpus: Path) -> tuple[int, int]:
    files = [p for p in corpus.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return len(files), sum(p.stat().st_size for p in files)


# -- the DAG under `airflow dags test` ------------------------------------------------------------
class DagRunner:
    """A migrated SQLite AIRFLOW_HOME and a SeaweedFS server, for `airflow dags test` runs."""

    def __init__(self, work: Path) -> None:
        from tools import seaweedfs

        self.work = work
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        self.server = seaweedfs.start(str(work / "seaweedfs"))
        self.server.create_bucket("bench")
        self.env = {
            **{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
            "AIRFLOW_HOME": str(work / "airflow"), "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
            "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"), "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "false", "PYTHONPATH": str(ROOT),
            "AIRFLOW_CONN_AWS_DEFAULT": self.server.airflow_connection(),
        }
        subprocess.run([AIRFLOW, "db", "migrate"], env=self.env, check=True, capture_output=True, timeout=600)

    def command(self, corpus: Path, version: str) -> list[str]:
        conf = {"source": str(corpus), "destination": "s3://bench/dag", "dataset": "flowers", "version": version,
                "force": True}
        return [AIRFLOW, "dags", "test", "image_tfrecords", "2026-11-22T00:00:00+00:00", "-c", json.dumps(conf)]

    def xcom_sizes(self) -> list[tuple[str, int, int]]:
        """(task_id, map_index, bytes) of every XCom in the database."""
        import sqlite3

        with sqlite3.connect(self.work / "airflow" / "airflow.db") as db:
            return db.execute("SELECT task_id, map_index, length(value) FROM xcom").fetchall()

    def close(self) -> None:
        from tools import seaweedfs

        seaweedfs.stop(self.server)


# -- main table ------------------------------------------------------------------------------------
def main_table(corpus: Path, work: Path, rounds: int, dag: DagRunner | None) -> list[Contender]:
    out = work / "out"
    cli = [PY, "-m", "image_tfrecords", "build", "--source", str(corpus), "--dataset", "flowers",
           "--no-progress"]
    contenders = {
        "a": (Contender("a", "(a) seed-style, 1 process"),
              lambda d: [PY, "bench/seed_convert.py", "--source", str(corpus), "--output", str(d), "--threads", "1"]),
        "b": (Contender("b", "(b) seed-style, 2 threads"),
              lambda d: [PY, "bench/seed_convert.py", "--source", str(corpus), "--output", str(d), "--threads", "2"]),
        "c": (Contender("c", "(c) cp -r (I/O floor)"), lambda d: ["cp", "-r", str(corpus), str(d)]),
        "d1": (Contender("d1", "(d) our CLI, --workers 1"),
               lambda d: [*cli, "--destination", str(d), "--workers", "1"]),
        "d2": (Contender("d2", "(d) our CLI, --workers 2"),
               lambda d: [*cli, "--destination", str(d), "--workers", "2"]),
    }
    if dag is not None:
        contenders["e"] = (Contender("e", "(e) DAG, airflow dags test, to SeaweedFS"), None)  # type: ignore[assignment]
    keys = list(contenders)
    for number in range(rounds):
        order = keys[number % len(keys):] + keys[:number % len(keys)]  # rotate, so no contender always goes first
        for key in order:
            contender, command = contenders[key]
            shutil.rmtree(out, ignore_errors=True)
            if key == "e":
                assert dag is not None
                run = measure(dag.command(corpus, f"r{number}"), env=dag.env, cwd=ROOT)
            else:
                run = measure(command(out), cwd=ROOT)
            contender.runs.append(run)
            print(f"  round {number + 1} {contender.label}: {run.seconds:.2f} s, {run.rss_mb:.0f} MB", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return [c for c, _ in contenders.values()]


# -- stages, each its own process ------------------------------------------------------------------
STAGE_CODE = """
import json, sys
from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.storage import Storage
cfg = BuildConfig(**json.loads(sys.argv[1]))
steps, args = sys.argv[2].split("+"), json.loads(sys.argv[3])
for step in steps:
    result = getattr(stages, step)(cfg, Storage(), **args)
print("RESULT" + json.dumps(result))
"""
# The DAG's tasks, in order: (task id, stage functions it calls, mapped over what the task before returns)
DAG_TASKS = (("discover", "discover_stage", False), ("plan_inspection", "plan_inspection", False),
             ("inspect_images", "inspect_chunk", True), ("split", "gather_inspection+split_stage", False),
             ("plan", "plan_stage", False), ("reuse_shards", "reuse_stage", False),
             ("write_shards", "write_task", True), ("validate", "validate_stage", False),
             ("card", "card_stage", False), ("publish", "publish_stage", False))


def xcom_of(task: str, result: Any) -> Any:
    """What the DAG task returns (so stores as its XCom)."""
    if task == "plan":
        return list(range(result["num_tasks"]))
    if task == "plan_inspection":
        return list(range(result["chunks"]))
    if task == "write_shards":
        return {"shards": len(result), "num_records": sum(r["num_records"] for r in result),
                "num_bytes": sum(r["num_bytes"] for r in result)}
    return result


def run_stages(corpus: Path, work: Path, parallel: int = 2) -> dict[str, Any]:
    """The DAG's tasks, one process each, as a LocalExecutor with ``parallelism`` = ``parallel`` runs them
    (mapped tasks ``parallel`` at a time, each with its own process pool); per task: seconds, peak RSS,
    XCom bytes, and the number of mapped tasks."""
    dest = work / "stages-out"
    shutil.rmtree(dest, ignore_errors=True)
    cfg = json.dumps({"source": str(corpus), "destination": str(dest), "dataset": "scale", "version": "v1"})
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def stage(steps: str, **args: Any) -> tuple[Run, Any]:
        run = measure([PY, "-c", STAGE_CODE, cfg, steps, json.dumps(args)], env=env, cwd=ROOT)
        return run, json.loads(run.stdout.split("RESULT", 1)[1])

    report: dict[str, Any] = {"stages": {}, "mapped": {}}
    started = time.perf_counter()
    expand: list[int] = []
    for task, steps, mapped in DAG_TASKS:
        task_started = time.perf_counter()
        if mapped:
            key = "chunk" if task == "inspect_images" else "task_index"
            with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                runs = list(pool.map(lambda i, k=key, st=steps: stage(st, **{k: i}), expand))
            report["mapped"][task] = len(runs)
        else:
            runs = [stage(steps)]
        report["stages"][task] = {"seconds": time.perf_counter() - task_started,
                                  "rss_mb": max(r.rss_mb for r, _ in runs),
                                  "xcom_bytes": max(len(json.dumps(xcom_of(task, res))) for _, res in runs)}
        last = runs[-1][1]
        if task in ("plan", "plan_inspection"):
            expand = xcom_of(task, last)
        if task == "plan":
            report["mapped_tasks"] = last["num_tasks"]
            report["shards"] = last["num_shards"]
    report["seconds"] = time.perf_counter() - started
    shutil.rmtree(dest, ignore_errors=True)
    return report


# -- scaling over cores (issue 13) -----------------------------------------------------------------
STAGES_LINE = re.compile(r"^\s*stages: (.+)$", re.M)


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4 ... up to ``cores``, and ``cores`` itself."""
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == cores else [*counts, cores]


def stage_seconds(output: str) -> dict[str, float]:
    """The CLI summary's ``stages: discover 0.10 s, inspect 9.30 s, ...`` line as a dict."""
    found = STAGES_LINE.search(output)
    if not found:
        return {}
    return {name: float(seconds) for name, seconds in
            (part.strip().rsplit(" ", 2)[:2] for part in found.group(1).split(","))}


def scaling(images: int, work: Path, synthetic: bool, rounds: int = 1) -> dict[str, Any]:
    """``image-tfrecords build --workers N`` for N = 1, 2, 4 ... cores on one corpus (a full build into
    a fresh local folder each time; the median of ``rounds``), beside ``cp -r`` + ``sync``; per-stage seconds
    from the CLI's summary."""
    corpus, pixels = make_corpus(images, work, parts=1 if images <= 20_000 else 2, synthetic=synthetic)
    count, nbytes = corpus_facts(corpus)
    out = work / "scaling-out"
    floor = []
    for _ in range(rounds):
        shutil.rmtree(out, ignore_errors=True)
        floor.append(measure(["sh", "-c", 'cp -r "$0" "$1" && sync', str(corpus), str(out)]).seconds)
    report: dict[str, Any] = {"images": count, "megabytes": nbytes / 1e6, "pixels": pixels,
                              "cores": os.cpu_count(), "copy_seconds": statistics.median(floor), "workers": {},
                              "rounds": rounds}
    for workers in worker_counts(os.cpu_count() or 1):
        runs = []
        for _ in range(rounds):
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=False)
            runs.append(measure([PY, "-m", "image_tfrecords", "build", "--source", str(corpus), "--destination",
                                 str(out), "--dataset", "scaling", "--version", "v1", "--workers", str(workers),
                                 "--no-progress"], cwd=ROOT))
        best = sorted(runs, key=lambda r: r.seconds)[len(runs) // 2]
        report["workers"][workers] = {"seconds": best.seconds, "rss_mb": best.rss_mb,
                                      "stages": stage_seconds(best.stdout)}
        print(f"  --workers {workers}: {best.seconds:.2f} s", flush=True)
    shutil.rmtree(out, ignore_errors=True)
    return report


def render_scaling(report: dict[str, Any]) -> list[str]:
    one = report["workers"][min(report["workers"])]["seconds"]
    names = list(next(iter(report["workers"].values()))["stages"])
    lines = [f"## Scaling over cores: {report['images']} images, {report['megabytes']:.0f} MB, "
             f"{report['cores']} cores", "",
             "`image-tfrecords build --workers N` (a full build into a fresh local folder; one worker is one "
             f"process and one thread; the median of {report.get('rounds', 1)} rounds), beside `cp -r` + `sync` "
             "of the corpus "
             f"({report['copy_seconds']:.2f} s). Stage seconds are the CLI's own (`stages:` line).", "",
             "| workers | seconds | speedup | vs cp+sync | " + " | ".join(names) + " |",
             "|---:|---:|---:|---:|" + "---:|" * len(names)]
    for workers, run in sorted(report["workers"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"| {workers} | {run['seconds']:.2f} | {one / run['seconds']:.2f}x | "
                     f"{run['seconds'] / report['copy_seconds']:.1f}x | "
                     + " | ".join(f"{run['stages'].get(n, 0):.2f}" for n in names) + " |")
    return [*lines, ""]


def scaling_targets(report: dict[str, Any]) -> list[tuple[str, str, bool]]:
    runs = {int(k): v for k, v in report["workers"].items()}
    one, cores = runs[1]["seconds"], max(runs)
    if cores >= 16:
        sixteen = runs[16]["seconds"]
        return [("CLI: 16 workers >= 10x one worker", f"{one / sixteen:.2f}x", one / sixteen >= 10),
                ("CLI: 16 workers <= 2x cp -r + sync", f"{sixteen / report['copy_seconds']:.2f}x",
                 sixteen <= 2 * report["copy_seconds"])]
    if cores >= 2:
        two = runs[2]["seconds"]
        return [("CLI: 2 workers >= 1.8x one worker", f"{one / two:.2f}x", one / two >= 1.8)]
    return []


def dag_on_stack(images: int, work: Path, synthetic: bool) -> dict[str, Any]:
    """The DAG through a real scheduler (LocalExecutor, parallelism = cores, PostgreSQL) on ``images`` images,
    local folder to local folder, beside ``image-tfrecords build --workers CORES`` on the same corpus: wall
    seconds from the trigger to the run's end, its tasks' spans, the largest XCom and the mapped task counts."""
    from tools import airflow_stack, seaweedfs

    corpus, _ = make_corpus(images, work, synthetic=synthetic)
    cores = os.cpu_count() or 1
    base = work / "dag-stack"
    shutil.rmtree(base, ignore_errors=True)
    (base / "logs").mkdir(parents=True)
    cli_out = base / "cli-out"

    def cli() -> float:
        shutil.rmtree(cli_out, ignore_errors=True)
        run = measure([PY, "-m", "image_tfrecords", "build", "--source", str(corpus), "--destination",
                       str(cli_out), "--dataset", "stack", "--version", "cli", "--workers", str(cores),
                       "--no-progress"], cwd=ROOT)
        shutil.rmtree(cli_out, ignore_errors=True)
        return run.seconds

    cli_seconds = [cli()]  # before the DAG run and after it (the page cache warm for both): the faster
    server = seaweedfs.start(str(base / "seaweedfs"))
    try:
        with airflow_stack.postgres_server() as database:
            api_port = seaweedfs.free_ports(1)[0]
            env = airflow_stack.airflow_env(base / "airflow", database, api_port, server, "LocalExecutor",
                                            parallelism=cores)
            subprocess.run([AIRFLOW, "db", "migrate"], env=env, check=True, capture_output=True, timeout=600)
            stack = airflow_stack.Stack(env, api_port, base / "logs")
            stack.start()
            try:
                airflow_stack.wait_for(lambda: stack.call("GET", "/dags/image_tfrecords")["is_paused"] is False,
                                       180, "the DAG to be parsed")
                conf = {"source": str(corpus), "destination": str(base / "dag-out"), "dataset": "stack",
                        "version": "dag", "force": True}
                started = time.perf_counter()
                run = stack.call("POST", "/dags/image_tfrecords/dagRuns",
                                 {"dag_run_id": "bench", "logical_date": None, "conf": conf})
                stack.wait_run(run["dag_run_id"], timeout=3600)
                seconds = time.perf_counter() - started
                tis = stack.task_instances(run["dag_run_id"])
            finally:
                stack.stop()
            xcoms = airflow_stack.xcom_sizes(database)
    finally:
        seaweedfs.stop(server)
    cli_seconds.append(cli())
    spans: dict[str, float] = {}
    for ti in tis:
        if ti["start_date"] and ti["end_date"]:
            spans[ti["task_id"]] = spans.get(ti["task_id"], 0.0) + (
                datetime.fromisoformat(ti["end_date"]) - datetime.fromisoformat(ti["start_date"])).total_seconds()
    mapped = {task: sum(1 for ti in tis if ti["task_id"] == task) for task in ("inspect_images", "write_shards")}
    shutil.rmtree(base, ignore_errors=True)
    return {"images": images, "cores": cores, "cli_seconds": min(cli_seconds), "cli_runs": cli_seconds,
            "dag_seconds": seconds,
            "task_seconds": spans, "mapped": mapped, "largest_xcom": max((x[2] for x in xcoms), default=0)}


def render_dag_on_stack(report: dict[str, Any]) -> list[str]:
    ratio = report["dag_seconds"] / report["cli_seconds"]
    busy = sum(report["task_seconds"].values())
    lines = [f"## The DAG on a real scheduler: {report['images']} images, {report['cores']} cores", "",
             "A manual run through the REST API of a stack of this machine's own (PostgreSQL, scheduler, "
             f"dag-processor, triggerer, api-server; LocalExecutor with parallelism {report['cores']}), local "
             "folder to local folder, beside `image-tfrecords build --workers "
             f"{report['cores']}` of the same corpus.", "",
             "| | seconds |", "|---|---:|",
             f"| CLI (the faster of a run before and one after the DAG's) | {report['cli_seconds']:.1f} |",
             f"| DAG, trigger to end of run | {report['dag_seconds']:.1f} ({ratio:.2f}x the CLI) |",
             f"| DAG, sum of task run times | {busy:.1f} |", "",
             f"Mapped tasks: {report['mapped']['inspect_images']} `inspect_images`, "
             f"{report['mapped']['write_shards']} `write_shards`; largest XCom {report['largest_xcom']} bytes. "
             "Task run times (summed over map indexes): "
             + ", ".join(f"{k} {v:.1f} s" for k, v in report["task_seconds"].items()) + ".", ""]
    return lines


def dag_targets(report: dict[str, Any]) -> list[tuple[str, str, bool]]:
    ratio = report["dag_seconds"] / report["cli_seconds"]
    return [(f"DAG (LocalExecutor, {report['images']} images) <= 1.5x the CLI with the same cores",
             f"{ratio:.2f}x", ratio <= 1.5),
            ("DAG on the stack: no XCom over 10 KB", f"{report['largest_xcom']} bytes",
             report["largest_xcom"] <= 10_240)]


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


# -- incremental nights (issue 12) -----------------------------------------------------------------
NIGHT = {"added": 0.01, "deleted": 0.001, "changed": 0.0005}  # shares of the first version's images
EXTRA_SEED = 101  # make_corpus seed of the second corpus: the images nights add, and changed images' new bytes
MUTATION_SEED = 12  # which images a night deletes and changes
SHARD_SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfindex")


def night_counts(images: int) -> dict[str, int]:
    """How many images a night adds, deletes and changes (at least one of each)."""
    return {kind: max(1, round(images * share)) for kind, share in NIGHT.items()}


def image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def written_bytes(version: Path, base: Path | None) -> dict[str, int]:
    """Bytes of the files of a published version that are not hard links of ``base``'s files (reused
    shards are): ``shards`` (.tfrecord and .tfindex), ``other`` (labels.csv, inspected.csv, rejects.csv,
    manifest, TFDS metadata, card) and ``linked`` (the reused, not written)."""
    shared = set()
    for path in image_files(base) if base else []:
        st = path.stat()
        shared.add((st.st_dev, st.st_ino))
    result = {"shards": 0, "other": 0, "linked": 0}
    for path in [p for p in version.rglob("*") if p.is_file()]:
        st = path.stat()
        kind = ("linked" if (st.st_dev, st.st_ino) in shared
                else "shards" if path.name.endswith(SHARD_SUFFIXES) else "other")
        result[kind] += st.st_size
    return result


def label_rows(version: Path) -> list[dict[str, str]]:
    with open(version / "labels.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def full_shard_count(rows: list[dict[str, str]], shard_size_mb: float) -> int:
    """The shards a full build of these records makes (``planning.shard_count`` per split)."""
    from image_tfrecords.rules import shards as planning

    sizes: dict[str, list[int]] = {}
    for row in rows:
        sizes.setdefault(row["split"], []).append(int(row["encoded_bytes"]))
    return sum(planning.shard_count(sum(s), len(s), shard_size_mb) for s in sizes.values())


class Nights:
    """A copy of a corpus that changes night by night, and ``image-tfrecords build`` runs on it.

    The copy is hard links (``cp -al``), so it costs nothing; a night never writes a file in place
    (it unlinks first), so the cached corpus is never changed."""

    def __init__(self, corpus: Path, extras: Path, folder: Path, shard_size_mb: float) -> None:
        self.folder, self.extras, self.shard_size_mb = folder, extras, shard_size_mb
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.source, self.out = folder / "source", folder / "out"
        subprocess.run(["cp", "-al", str(corpus), str(self.source)], check=True)
        (self.source / ".complete").unlink(missing_ok=True)
        self.pool = image_files(extras)
        random.Random(EXTRA_SEED).shuffle(self.pool)

    def take(self, count: int, suffix: str | None = None) -> list[Path]:
        """``count`` images of the second corpus (of ``suffix``) never taken before."""
        chosen = [p for p in self.pool if suffix is None or p.suffix == suffix][:count]
        if len(chosen) < count:
            raise RuntimeError(f"the second corpus ({self.extras}) has too few images left")
        taken = set(chosen)
        self.pool = [p for p in self.pool if p not in taken]
        return chosen

    def mutate(self, night: int, counts: dict[str, int]) -> dict[str, int]:
        """Night ``night``'s changes, reproducibly: delete, change (a JPEG's bytes become another JPEG's,
        unlinked and written anew, so a new size and mtime) and add (into the class folders, as in the
        second corpus). Returns the counts and ``new_bytes``, the bytes of the added and changed images."""
        rng = random.Random(f"{MUTATION_SEED}-{night}")
        files = image_files(self.source)
        deleted = rng.sample(files, counts["deleted"])
        gone = set(deleted)
        changed = rng.sample([p for p in files if p.suffix == ".jpg" and p not in gone], counts["changed"])
        for path in deleted:
            path.unlink()
        new_bytes = 0
        for path, donor in zip(changed, self.take(counts["changed"], ".jpg"), strict=True):
            data = donor.read_bytes()
            path.unlink()  # never in place: the file is a hard link into the cached corpus
            path.write_bytes(data)
            new_bytes += len(data)
        for donor in self.take(counts["added"]):
            target = self.source / donor.relative_to(self.extras)
            if target.exists():  # names are random: this does not happen, but an add must not replace
                target = target.with_name(f"n{night}-{target.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(donor, target)
            new_bytes += target.stat().st_size
        return {**counts, "new_bytes": new_bytes}

    def build(self, version: str, dest: Path | None = None, full: bool = False) -> tuple[Run, dict[str, Any] | None]:
        """Run the CLI; its run and the published version's manifest (None when nothing was published).
        The page cache's dirty pages are written out first (``sync``): no build waits on another's writes."""
        dest = dest or self.out
        os.sync()
        run = measure(self.command(version, str(dest), full), cwd=ROOT)
        folder = dest / "nightly" / version
        published = (folder / "_SUCCESS").exists()
        return run, json.loads((folder / "manifest.json").read_text()) if published else None

    def command(self, version: str, dest: str, full: bool = False) -> list[str]:
        return [PY, "-m", "image_tfrecords", "build", "--source", str(self.source), "--destination", dest,
                "--dataset", "nightly", "--version", version, "--workers", "2",
                "--shard-size-mb", f"{self.shard_size_mb:g}", "--no-progress", *(["--full"] if full else [])]


def s3_night(corpus: Path, extras: Path, work: Path, counts: dict[str, int], shard_size_mb: float) -> dict[str, Any]:
    """The same first version and night 2 with the destination on a local SeaweedFS server: what a spliced
    shard costs when its kept runs are copied by the store (``UploadPartCopy``) instead of the kernel."""
    from tools import seaweedfs

    nights = Nights(corpus, extras, work / "incremental-s3", shard_size_mb)
    data = tempfile.mkdtemp(prefix="bench-s3-")  # short: SeaweedFS's unix socket path must fit in 108 bytes
    server = seaweedfs.start(data)
    try:
        server.create_bucket("bench")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **server.env()}
        dest = "s3://bench/out"
        runs: dict[str, Any] = {}
        for name, version, full in (("first", "night01", False), ("incremental", "night02", False),
                                    ("full", "night02-full", True)):
            if name == "incremental":
                nights.mutate(2, counts)
            os.sync()
            run = measure(nights.command(version, dest, full), env=env, cwd=ROOT)
            manifest = json.loads(server.client().get_object(
                Bucket="bench", Key=f"out/nightly/{version}/manifest.json")["Body"].read())
            runs[name] = {"seconds": run.seconds, "build": manifest["build"], "shards": shard_total(manifest)}
            print(f"  S3 destination, {name}: {run.seconds:.2f} s", flush=True)
    finally:
        seaweedfs.stop(server)
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(nights.folder, ignore_errors=True)
    runs["speedup"] = runs["full"]["seconds"] / runs["incremental"]["seconds"]
    return runs


def disk_write_rate(work: Path, megabytes: int = 1000) -> float:
    """MB/s of writing ``megabytes`` to a new file in ``work`` and fsyncing it: the floor under any night
    that must rewrite shards on a file system without reflinks."""
    path = work / "disk-write-rate.tmp"
    block = os.urandom(1 << 20)
    os.sync()
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return megabytes / seconds


def shard_total(manifest: dict[str, Any]) -> int:
    return sum(len(split["shards"]) for split in manifest["splits"].values())


def night_row(night: int, run: Run, manifest: dict[str, Any], shard_size_mb: float, version: Path) -> dict[str, Any]:
    build = manifest["build"]
    return {"night": night, "records": manifest["num_records"], "seconds": run.seconds, "mode": build["mode"],
            "full_because": build["full_because"], "shards": shard_total(manifest),
            "full_shards": full_shard_count(label_rows(version), shard_size_mb),
            "reused": build["shards_reused"], "rewritten": build["shards_rewritten"],
            "spliced": build.get("shards_spliced", 0), "records_parsed": build.get("records_parsed"),
            "written": build["shards_written"], "source_bytes_read": build["source_bytes_read"]}


def incremental_nights(images: int, work: Path, synthetic: bool, shard_size_mb: float = 100.0,
                       chain: int = 0) -> dict[str, Any]:
    """A first version of ``images`` images, an unchanged night, then night 2 built incrementally and with
    ``--full`` into an empty destination; then ``chain`` - 1 more nights (``chain`` nights in all)."""
    counts = night_counts(images)
    corpus, pixels = make_corpus(images, work, parts=1 if images <= 20_000 else 2, synthetic=synthetic)
    need = max(1, chain) * (counts["added"] + counts["changed"]) + counts["added"]  # + the additions-only night
    extras, _ = make_corpus(need + max(20, need // 10), work, synthetic=synthetic, seed=EXTRA_SEED)
    nights = Nights(corpus, extras, work / f"incremental-{images}", shard_size_mb)

    def say(what: str, run: Run) -> None:
        print(f"  {images} images, {what}: {run.seconds:.2f} s", flush=True)

    first, m1 = nights.build("night01")
    say("first version", first)
    assert m1 is not None
    unchanged, published = nights.build("night02")
    say("unchanged night", unchanged)
    skipped = (published is None and "unchanged since version night01" in unchanged.stdout
               and not (nights.out / "nightly" / "night02").exists())
    night = nights.mutate(2, counts)
    incremental, m2 = nights.build("night02")
    say("night 2, incremental", incremental)
    full_dest = nights.folder / "full"
    full, mf = nights.build("night02", dest=full_dest, full=True)
    say("night 2, --full", full)
    assert m2 is not None and mf is not None
    v1, v2, vf = (nights.out / "nightly" / "night01", nights.out / "nightly" / "night02",
                  full_dest / "nightly" / "night02")
    keys = ("filename", "sha256", "label", "split")
    inc_rows, full_rows = label_rows(v2), label_rows(vf)
    inc_records, full_records = ({tuple(r[k] for k in keys) for r in rows} for rows in (inc_rows, full_rows))
    report: dict[str, Any] = {
        "images": m1["num_records"], "megabytes": corpus_facts(corpus)[1] / 1e6, "pixels": pixels,
        "shard_size_mb": shard_size_mb, "night": night,
        "first": {"seconds": first.seconds, "rss_mb": first.rss_mb, "shards": shard_total(m1)},
        "unchanged": {"seconds": unchanged.seconds, "skipped": skipped, "says": unchanged.stdout.strip()[-300:]},
        "incremental": {"seconds": incremental.seconds, "rss_mb": incremental.rss_mb, "build": m2["build"],
                        "shards": shard_total(m2), "written": written_bytes(v2, v1),
                        "stages": stage_seconds(incremental.stdout)},
        "full": {"seconds": full.seconds, "rss_mb": full.rss_mb, "build": mf["build"], "shards": shard_total(mf),
                 "written": written_bytes(vf, None), "stages": stage_seconds(full.stdout)},
        "records": len(inc_records),
        "records_equal": inc_records == full_records and len(inc_rows) == len(full_rows) == len(
            image_files(nights.source)),
    }
    report["speedup"] = full.seconds / incremental.seconds
    report["rows"] = len(inc_rows)
    report["source_ratio"] = m2["build"]["source_bytes_read"] / night["new_bytes"]
    shutil.rmtree(full_dest)
    if chain:
        rows = [night_row(1, first, m1, shard_size_mb, v1), night_row(2, incremental, m2, shard_size_mb, v2)]
        for number in range(3, chain + 2):
            nights.mutate(number, counts)
            run, manifest = nights.build(f"night{number:02d}")
            assert manifest is not None
            rows.append(night_row(number, run, manifest, shard_size_mb, nights.out / "nightly" / f"night{number:02d}"))
            say(f"night {number}, {rows[-1]['mode']}, {rows[-1]['shards']} shards", run)
            shutil.rmtree(nights.out / "nightly" / f"night{number - 2:02d}")  # no build needs it now: disk
        report["chain"] = rows
    # A night that only adds images: every shard keeps its records, so shards are reused (hard links)
    # and only each split's tail is rewritten with the new images appended.
    adds = nights.mutate(99, {"added": counts["added"], "deleted": 0, "changed": 0})
    add_run, ma = nights.build("night99")
    say("an additions-only night, incremental", add_run)
    add_full, maf = nights.build("night99", dest=full_dest, full=True)
    say("the additions-only night, --full", add_full)
    assert ma is not None and maf is not None
    report["additions_only"] = {
        "night": adds, "speedup": add_full.seconds / add_run.seconds,
        "incremental": {"seconds": add_run.seconds, "build": ma["build"], "shards": shard_total(ma)},
        "full": {"seconds": add_full.seconds, "build": maf["build"], "shards": shard_total(maf)}}
    shutil.rmtree(nights.folder)
    report["disk_mb_per_s"] = disk_write_rate(work, 50 if synthetic else 1000)
    if images <= 20_000:
        report["s3"] = s3_night(corpus, extras, work, counts, shard_size_mb)
    return report


def render_incremental(runs: dict[int, dict[str, Any]]) -> list[str]:
    """The "Incremental nights" section of BENCHMARKS.md."""
    if not runs:
        return []
    sizes = sorted(runs)
    any_run = runs[sizes[0]]
    mb = lambda n: f"{n / 1e6:.1f}"  # noqa: E731

    def row(label: str, cell: Any) -> str:
        return f"| {label} | " + " | ".join(cell(runs[n]) for n in sizes) + " |"

    def shards(side: dict[str, Any]) -> str:
        b = side["build"]
        return (f"{b['shards_reused']} / {b.get('shards_spliced', 0)} / "
                f"{b['shards_rewritten'] - b.get('shards_spliced', 0)} / {b['shards_written']} "
                f"({side['shards']} in all)")

    def new_images(r: dict[str, Any]) -> int:
        return r["night"]["added"] + r["night"]["changed"]

    def per_row(r: dict[str, Any], stage: str) -> str:
        seconds = r["incremental"].get("stages", {}).get(stage)
        return "?" if seconds is None else f"{seconds:.2f} s ({seconds / r['rows'] * 1e6:.1f} us/row)"

    def written(side: dict[str, Any]) -> str:
        w = side["written"]
        return f"{mb(w['shards'] + w['other'])} ({mb(w['shards'])} + {mb(w['other'])})"

    lines = [
        "## Incremental nights (issues 12 and 22)", "",
        f"A night, counted on the first version's images: {NIGHT['added']:.0%} added (images of a second "
        f"`make_corpus` corpus, seed {EXTRA_SEED}, into the class folders), {NIGHT['deleted']:.1%} deleted, "
        f"{NIGHT['changed']:.2%} changed (a JPEG's bytes replaced by another JPEG's, written as a new file: "
        "new size and mtime). The source is a hard-link copy of the cached corpus (`cp -al`; a night "
        "unlinks before it writes). Every build is `image-tfrecords build --workers 2 "
        f"--shard-size-mb {any_run['shard_size_mb']:g} --no-progress` into a local folder: night01 (the "
        "first version, a full build), the same source again (an unchanged night), night02 after one "
        "night's changes, incremental on night01, and `--full` of the same night02 source into an empty "
        "destination, in that order, one run each (not a median; the page cache is warm for both). Last, "
        "a night that only adds images (built after the others), incremental and `--full`.", "",
        "| | " + " | ".join(f"{n} images" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
        row("first version: MB, shards, seconds",
            lambda r: f"{r['megabytes']:.0f} MB, {r['first']['shards']} shards, {r['first']['seconds']:.1f} s"),
        row("unchanged night: seconds",
            lambda r: f"{r['unchanged']['seconds']:.2f} s, "
                      + ("skipped" if r["unchanged"]["skipped"] else "**built**")),
        row("night: added / deleted / changed",
            lambda r: f"{r['night']['added']} / {r['night']['deleted']} / {r['night']['changed']}"),
        row("MB of the added and changed images", lambda r: mb(r["night"]["new_bytes"])),
        row("incremental night: seconds (peak RSS MB)",
            lambda r: f"**{r['incremental']['seconds']:.2f}** ({r['incremental']['rss_mb']:.0f})"),
        row("`--full`, same source: seconds (peak RSS MB)",
            lambda r: f"**{r['full']['seconds']:.2f}** ({r['full']['rss_mb']:.0f})"),
        row("speedup (full / incremental)", lambda r: f"**{r['speedup']:.1f}x**"),
        row("MB read from the source: incremental / full",
            lambda r: f"{mb(r['incremental']['build']['source_bytes_read'])} / "
                      f"{mb(r['full']['build']['source_bytes_read'])}"),
        row("source read / added and changed MB", lambda r: f"**{r['source_ratio']:.2f}x**"),
        row("files inspected (reused): incremental",
            lambda r: f"{r['incremental']['build']['files_inspected']} "
                      f"({r['incremental']['build']['inspections_reused']})"),
        row("shards reused / spliced / rewritten record by record / written: incremental",
            lambda r: shards(r["incremental"])),
        row("shards reused / spliced / rewritten record by record / written: full", lambda r: shards(r["full"])),
        row("records parsed: incremental / full (added and changed images)",
            lambda r: f"{r['incremental']['build'].get('records_parsed', '?')} / "
                      f"{r['full']['build'].get('records_parsed', '?')} ({new_images(r)})"),
        row("MB of base shards read (hashed) by a worker: incremental",
            lambda r: mb(r["incremental"]["build"].get("base_bytes_read", 0))),
        row("MB of shards copied by the kernel or the store / written by a worker: incremental",
            lambda r: f"{mb(r['incremental']['build'].get('bytes_copied', 0))} / "
                      f"{mb(r['incremental']['build'].get('bytes_written', 0))}"),
        row("MB of shards copied / written by a worker: full",
            lambda r: f"{mb(r['full']['build'].get('bytes_copied', 0))} / "
                      f"{mb(r['full']['build'].get('bytes_written', 0))}"),
        row("S3 destination (SeaweedFS on this machine): incremental / `--full` seconds",
            lambda r: f"{r['s3']['incremental']['seconds']:.2f} / {r['s3']['full']['seconds']:.2f} "
                      f"(**{r['s3']['speedup']:.1f}x**)" if "s3" in r else "not run"),
        row("S3: MB of base shards read by a worker / copied by the store / uploaded by a worker",
            lambda r: " / ".join(mb(r["s3"]["incremental"]["build"].get(k, 0)) for k in
                                 ("base_bytes_read", "bytes_copied", "bytes_written")) if "s3" in r else "not run"),
        row("disk: MB/s writing 1 GB with fsync; seconds to write the night's copied shard bytes at that rate",
            lambda r: f"{r['disk_mb_per_s']:.0f} MB/s; "
                      f"{r['incremental']['build'].get('bytes_copied', 0) / 1e6 / r['disk_mb_per_s']:.1f} s"
            if "disk_mb_per_s" in r else "not measured"),
        row("incremental night by stage: discover / inspect / split / plan",
            lambda r: " / ".join(per_row(r, s) for s in ("discover", "inspect", "split", "plan"))),
        row("incremental night by stage: reuse / write / validate / card / publish",
            lambda r: " / ".join(per_row(r, s) for s in ("reuse", "write", "validate", "card", "publish"))),
        row("MB written: incremental (shards + other)", lambda r: written(r["incremental"])),
        row("MB written: full (shards + other)", lambda r: written(r["full"])),
        row("records equal (labels.csv filename, sha256, label, split)",
            lambda r: f"{'yes' if r['records_equal'] else '**no**'} ({r['records']})"),
        row("additions-only night (1% added, nothing deleted or changed): incremental / `--full` seconds",
            lambda r: f"{r['additions_only']['incremental']['seconds']:.2f} / "
                      f"{r['additions_only']['full']['seconds']:.2f} (**{r['additions_only']['speedup']:.1f}x**)"
            if "additions_only" in r else "not run"),
        row("additions-only night: shards reused / spliced / rewritten record by record / written",
            lambda r: shards(r["additions_only"]["incremental"]) if "additions_only" in r else "not run"),
        "",
        "MB read from the source: the manifest's `build.source_bytes_read` (inspection's reads plus the "
        "writers' reads; a full build reads every image twice, once to inspect it and once to write it). "
        "MB written: the files of the published version that are not hard links of the previous "
        "version's files (reused shards are): shards with their `.tfindex`, plus the other files "
        "(labels.csv, inspected.csv, rejects.csv, manifest.json, TFDS metadata, the card); staging's "
        "temporary files (member lists, receipts) are not counted. Records parsed, MB of base shards "
        "read, copied and written: the manifest's `build` (`records_parsed`, `base_bytes_read`, `bytes_copied`, "
        "`bytes_written`). A spliced shard is its base shard's kept byte ranges (`os.copy_file_range`) plus "
        "its new records; the base is read once, to prove its SHA-256 and to take the new shard's. Stage "
        "seconds are the CLI summary's, per row of the version's labels.csv.", "",
    ]
    for n in sizes:
        chain = runs[n].get("chain")
        if not chain:
            continue
        lines += [f"### {len(chain) - 1} nights at {n} images", "",
                  "Each night the same changes (as counted on the first version), incremental unless the plan "
                  "compacts; \"full build's shards\" is what a full build of that night's records would make.", "",
                  "| night | records | mode | shards | full build's shards | reused / spliced / rewritten / "
                  "written | records parsed | seconds | MB read |", "|---|---:|---|---:|---:|---|---:|---:|---:|"]
        for r in chain:
            mode = r["mode"] + (f" ({r['full_because']})" if r["mode"] == "full" else "")
            lines.append(f"| {r['night']:02d} | {r['records']} | {mode} | {r['shards']} | {r['full_shards']} | "
                         f"{r['reused']} / {r.get('spliced', 0)} / {r['rewritten'] - r.get('spliced', 0)} / "
                         f"{r['written']} | {r.get('records_parsed', '?')} | {r['seconds']:.2f} | "
                         f"{mb(r['source_bytes_read'])} |")
        compactions = [i for i, r in enumerate(chain) if i and r["full_because"].startswith("compaction")]
        lines.append("")
        for i in compactions:
            lines.append(f"Compaction on night {chain[i]['night']:02d}: {chain[i - 1]['shards']} shards the night "
                         f"before, {chain[i]['shards']} after.")
        if not compactions:
            from image_tfrecords.rules.base_version import COMPACTION_FACTOR

            counts = [r["shards"] for r in chain[1:]]
            lines.append(f"No compaction in {len(chain) - 1} nights: {min(counts)} to {max(counts)} shards, "
                         f"{chain[-1]['full_shards']} for a full build of the last night's records (the plan "
                         f"compacts above {COMPACTION_FACTOR:g}x that).")
        lines.append("")
    return lines


def incremental_targets(runs: dict[int, dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for the targets of issues 12 and 22."""
    rows = []
    for n in sorted(runs):
        r = runs[n]
        goal = 10 if n >= 100_000 else 5
        parsed = r["incremental"]["build"].get("records_parsed")
        new = r["night"]["added"] + r["night"]["changed"]
        rows += [
            (f"{n} images: records parsed in the 1% night <= 2x the added and changed images",
             f"{parsed} for {new} images", parsed is not None and parsed <= 2 * new),
            (f"{n} images: the 1% night >= {goal}x faster than `--full`",
             f"{r['speedup']:.1f}x ({r['incremental']['seconds']:.1f} s vs {r['full']['seconds']:.1f} s, "
             f"{os.cpu_count()} cores)", r["speedup"] >= goal),
            (f"{n} images: source bytes read <= 2x the added and changed images'",
             f"{r['source_ratio']:.2f}x ({r['incremental']['build']['source_bytes_read'] / 1e6:.1f} MB of "
             f"{r['night']['new_bytes'] / 1e6:.1f} MB)", r["source_ratio"] <= 2),
            *([(f"{n} images, S3: kept runs copied by the store; through the worker at most the base read "
                "once plus the new records",
                f"{s3['bytes_copied'] / 1e6:.1f} MB copied by the store; {s3['base_bytes_read'] / 1e6:.1f} MB read "
                f"+ {s3['bytes_written'] / 1e6:.1f} MB uploaded ({r['night']['new_bytes'] / 1e6:.1f} MB of new "
                "images)", s3["bytes_copied"] > 0 and s3["bytes_written"] <= 1.05 * r["night"]["new_bytes"])]
              if (s3 := r.get("s3", {}).get("incremental", {}).get("build")) else []),
            (f"{n} images: an unchanged night skips all work",
             f"{'skipped' if r['unchanged']['skipped'] else 'built'} in {r['unchanged']['seconds']:.2f} s",
             r["unchanged"]["skipped"]),
        ]
    return rows


# -- report ----------------------------------------------------------------------------------------
def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    mem = next((int(line.split()[1]) // 1024 // 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem} GiB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}; corpora on the local disk (page cache warm after the first round)")


def preamble(command: str) -> list[str]:
    return ["# Benchmarks", "", f"Made by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())}.",
            f"Machine: {machine()}.", ""]


def chart(contenders: list[Contender], images: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    labels = [c.label for c in contenders][::-1]
    seconds = [c.seconds for c in contenders][::-1]
    colours = ["#4c72b0" if c.key.startswith(("d", "e")) else "#999999" for c in contenders][::-1]
    bars = ax.barh(labels, seconds, color=colours)
    for bar, value in zip(bars, seconds, strict=True):
        ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {value:.1f} s ({images / value:.0f} img/s)",
                va="center", fontsize=8)
    ax.set_xlabel("seconds, median (lower is better)")
    ax.set_xlim(0, max(seconds) * 1.35)
    ax.set_title(f"{images} images to validated TFRecords", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, metadata={"Software": None})
    plt.close(fig)


def render(contenders: list[Contender], corpus: tuple[int, int], rounds: int, scale: dict[int, Any],
           xcoms: list[tuple[str, int, int]], chart_name: str, command: str, pixels: str = "") -> str:
    images, nbytes = corpus
    by_key = {c.key: c for c in contenders}
    a, c = by_key["a"].seconds, by_key["c"].seconds
    lines = [
        *preamble(command),
        f"## {images} images, {nbytes / 1e6:.1f} MB (`bench/make_corpus.py`, flowers-sized)", "",
        *([f"Pixels: {pixels}.", ""] if pixels else []),
        f"Median of {rounds} rounds, contenders in a rotating order. Peak RSS: the largest single process "
        "(VmHWM, sampled every 20 ms).", "",
        "| contender | seconds | images/s | MB/s | vs (a) | vs (c) | peak RSS MB |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for x in contenders:
        lines.append(f"| {x.label} | {x.seconds:.2f} | {images / x.seconds:.0f} | {nbytes / 1e6 / x.seconds:.1f} | "
                     f"{a / x.seconds:.2f}x | {x.seconds / c:.2f} | {x.rss_mb:.0f} |")
    lines += ["", f"![seconds per contender]({chart_name})", ""]
    if "e" in by_key:
        spans = [span for r in by_key["e"].runs if (span := task_span(r.stdout)) is not None]
        if spans:
            lines += [f"(e): of its {by_key['e'].seconds:.1f} s, the tasks ran for {statistics.median(spans):.1f} s "
                      "(median, first task start to last task end); the rest is `airflow dags test` starting "
                      "(imports, parsing the DAG, the metadata database, the in-process execution API).", ""]
    if xcoms:
        biggest = max(xcoms, key=lambda x: x[2])
        lines += [f"XComs of the (e) runs: {len(xcoms)}, the largest {biggest[2]} bytes "
                  f"(`{biggest[0]}`{'' if biggest[1] < 0 else f' map {biggest[1]}'}).", ""]
    for images_n, report in sorted(scale.items()):
        lines += [f"## Scale: {images_n} images ({report['megabytes']:.0f} MB), one process per task", "",
                  f"{report['seconds']:.1f} s in all, {images_n / report['seconds']:.0f} images/s; "
                  f"{report['mapped'].get('inspect_images', 1)} mapped inspection tasks; "
                  f"{report['shards']} shards in {report['mapped_tasks']} mapped write tasks; mapped tasks two "
                  "at a time, each with its own process pool, as the DAG's run on a LocalExecutor with "
                  "parallelism 2.", "",
                  "| stage | seconds | peak RSS MB | XCom bytes |", "|---|---:|---:|---:|"]
        for name, s in report["stages"].items():
            lines.append(f"| {name} | {s['seconds']:.2f} | {s['rss_mb']:.0f} | {s['xcom_bytes']} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def targets(contenders: list[Contender], scale: dict[int, Any], xcoms: list[tuple[str, int, int]],
            write_seconds: float | None) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for each of issue 5's targets that this run measured."""
    k = {c.key: c.seconds for c in contenders}
    rows = [("CLI (--workers 2) >= 10x faster than (a)", f"{k['a'] / k['d2']:.2f}x", k["a"] / k["d2"] >= 10),
            ("CLI (--workers 2) >= 5x faster than (b)", f"{k['b'] / k['d2']:.2f}x", k["b"] / k["d2"] >= 5)]
    if write_seconds is not None:
        rows.append(("shard writing within 3x of (c)", f"{write_seconds / k['c']:.2f}x", write_seconds <= 3 * k["c"]))
    if "e" in k:
        rows.append(("DAG under dags test <= 2x the CLI", f"{k['e'] / k['d2']:.2f}x", k["e"] <= 2 * k["d2"]))
    if xcoms:
        biggest = max(x[2] for x in xcoms)
        rows.append(("no XCom over 10 KB (the (e) runs)", f"{biggest} bytes", biggest <= 10_240))
    if len(scale) >= 2:
        small, big = (scale[n] for n in sorted(scale)[:1] + sorted(scale)[-1:])
        n_small, n_big = sorted(scale)[0], sorted(scale)[-1]
        worst = max(s["rss_mb"] for s in big["stages"].values())
        growth = max(big["stages"][n]["rss_mb"] / small["stages"][n]["rss_mb"] for n in big["stages"])
        rate_small, rate_big = n_small / small["seconds"], n_big / big["seconds"]
        rows += [(f"{n_big}: every stage's peak RSS <= 1 GB", f"{worst:.0f} MB", worst <= 1024),
                 (f"{n_big}: peak RSS within 20% of {n_small}", f"x{growth:.2f} (worst stage)", growth <= 1.2),
                 (f"{n_big}: images/s within 20% of {n_small}", f"{rate_big:.0f} vs {rate_small:.0f}",
                  rate_big >= 0.8 * rate_small),
                 (f"{n_big}: XCom <= 10 KB, mapped tasks <= 1024 per task",
                  f"{max(s['xcom_bytes'] for s in big['stages'].values())} bytes, "
                  f"{max(big['mapped'].values())} tasks",
                  max(s["xcom_bytes"] for s in big["stages"].values()) <= 10_240
                  and max(big["mapped"].values()) <= 1024)]
    return rows


def write_alone(corpus: Path, work: Path) -> float:
    """Seconds of the write stage alone (the stages before it done first), two processes."""
    report = run_stages(corpus, work)
    return report["stages"]["write_shards"]["seconds"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=3670, help="main table corpus size (default: 3670)")
    parser.add_argument("--scale", default="10000,100000", help="image counts of the scale runs ('' for none)")
    parser.add_argument("--incremental", default="6000,100000",
                        help="image counts of the incremental nights ('' for none; default: 6000,100000)")
    parser.add_argument("--chain", type=int, default=10,
                        help="nights in the chain, at the smallest --incremental size (0 for none; default: 10)")
    parser.add_argument("--scaling", type=int, default=20_000,
                        help="corpus size of the scaling over cores (0 for none; default: 20000)")
    parser.add_argument("--dag-stack", type=int, default=10_000,
                        help="images of the DAG run on a real LocalExecutor stack, with --scaling (0 for none)")
    parser.add_argument("--options", type=int, default=None,
                        help="corpus size of the image options' builds (0 for none; default: --images)")
    parser.add_argument("--only", choices=("all", "incremental", "scaling", "options"), default="all",
                        help="incremental, scaling or options: only that section (default --out: WORK/SECTION.md)")
    parser.add_argument("--no-dag", action="store_true", help="skip (e)")
    parser.add_argument("--out", help="markdown file to write (default: BENCHMARKS.md)")
    parser.add_argument("--work", default=str(ROOT / ".bench"), help="corpora and scratch space")
    parser.add_argument("--smoke", action="store_true", help="tiny corpus, one round, small scale: for tests")
    args = parser.parse_args(argv)
    shard_size_mb = 100.0
    if args.smoke:  # small shards, so that the few hundred images of a night have shards to reuse
        args.rounds, args.images, args.scale, args.incremental, args.chain = 1, 40, "30,60", "300", 5
        args.scaling, args.dag_stack, args.options = 200, 0, 40
        shard_size_mb = 4.0
    if args.options is None:
        args.options = args.images
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out = Path(args.out or (work / f"{args.only}.md" if args.only != "all" else ROOT / "BENCHMARKS.md"))
    command = "make bench" if not args.smoke else "bench/run.py --smoke"
    if args.only == "incremental":
        command = (f"bench/run.py{' --smoke' * args.smoke} --only incremental --incremental {args.incremental} "
                   f"--chain {args.chain}")
    if args.only == "scaling":
        command = f"bench/run.py{' --smoke' * args.smoke} --only scaling --scaling {args.scaling}"
    if args.only == "options":
        command = (f"bench/run.py{' --smoke' * args.smoke} --only options --options {args.options} "
                   f"--rounds {args.rounds}")
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
            scale[images] = run_stages(scaled, work)
            scale[images]["megabytes"] = corpus_facts(scaled)[1] / 1e6
        chart_path = out.with_name("benchmarks.png") if not args.smoke else out.with_suffix(".png")
        chart(contenders, args.images, chart_path)
        text = render(contenders, corpus_facts(corpus), args.rounds, scale, xcoms, chart_path.name, command, pixels)
        rows += targets(contenders, scale, xcoms, write_seconds)
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
                                                 chain=args.chain if images == sizes[0] else 0)
    if incremental:
        text += "\n".join(render_incremental(incremental)) + "\n"
        rows += incremental_targets(incremental)
        issues.append("22")
        data["incremental"] = incremental
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
