"""Scaling over cores (issue 13) and the DAG on a real scheduler."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, corpus_facts, make_corpus, measure, stage_seconds

# -- scaling over cores (issue 13) -----------------------------------------------------------------


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4 ... up to ``cores``, and ``cores`` itself."""
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts if counts[-1] == cores else [*counts, cores]


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
    from tools import airflow_env, airflow_stack, seaweedfs

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
            airflow_env.migrate(env)
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

