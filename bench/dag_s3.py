"""The DAG on the product's path: a LocalExecutor stack (PostgreSQL, scheduler, dag-processor, triggerer,
api-server; ``parallelism`` 2) building from an S3 prefix into S3 on a local SeaweedFS server.

The source is a ``make_corpus`` corpus uploaded as users upload theirs (boto3's ``upload_file``, its default
CRC32 checksums, as ``aws s3 sync`` stores them), and ``aws_default`` is a connection in Airflow's database
(not an environment variable), as in a deployment. Three runs from the REST API: a full build, a night that
changes 1% of the source (adds, deletes, changes) and a ``full_rebuild`` of that night. Each run's seconds
(the run's start to its end as Airflow records them), its state, and every task that needed more than one
try are printed and written to ``.bench/dag-s3-<images>.json``.

    .venv/bin/python bench/dag_s3.py --images 3000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ROOT, make_corpus
from bench.incremental import EXTRA_SEED, MUTATION_SEED, image_files, night_counts
from tools import seaweedfs
from tools.airflow_env import POOL, migrate
from tools.airflow_stack import Stack, airflow_env, postgres_server, wait_for

BUCKET, PREFIX = "photos", "incoming"


def upload(client: Any, files: list[tuple[Path, str]]) -> None:
    """``upload_file`` each (path, key), on 8 threads: boto3's default checksums, as users' tools store them."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda item: client.upload_file(str(item[0]), BUCKET, item[1]), files))


def mutate(client: Any, corpus: Path, extras: Path, images: int) -> dict[str, int]:
    """The night's 1%: delete, change (another image's bytes under the same key) and add, reproducibly."""
    counts = night_counts(images)
    rng = random.Random(f"{MUTATION_SEED}-s3")
    keys = [f"{PREFIX}/{p.relative_to(corpus).as_posix()}" for p in image_files(corpus)]
    deleted = rng.sample(keys, counts["deleted"])
    changed = rng.sample(sorted(set(k for k in keys if k.endswith(".jpg")) - set(deleted)), counts["changed"])
    donors = image_files(extras)
    rng.shuffle(donors)
    client.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in deleted]})
    jpegs = [p for p in donors if p.suffix == ".jpg"]
    upload(client, list(zip(jpegs[:len(changed)], changed, strict=True)))
    added = [p for p in donors if p not in set(jpegs[:len(changed)])][:counts["added"]]
    upload(client, [(p, f"{PREFIX}/{p.relative_to(extras).as_posix()}") for p in added])
    return counts


def run_once(stack: Stack, conf: dict[str, Any], when: datetime, timeout: float) -> dict[str, Any]:
    """Trigger a run, wait for it; its seconds, state and the tasks that were tried more than once."""
    run = stack.call("POST", "/dags/image_tfrecords/dagRuns", {"logical_date": when.isoformat(), "conf": conf})
    quoted = run["dag_run_id"].replace("+", "%2B").replace(":", "%3A")
    done = wait_for(lambda: (lambda r: r if r["state"] in ("success", "failed") else None)(
        stack.call("GET", f"/dags/image_tfrecords/dagRuns/{quoted}")), timeout, f"run {run['dag_run_id']}", 1)
    tasks = stack.task_instances(run["dag_run_id"])
    retried = [f"{t['task_id']}[{t['map_index']}] try {t['try_number']}" for t in tasks if t["try_number"] > 1]
    seconds = (datetime.fromisoformat(done["end_date"]) - datetime.fromisoformat(done["start_date"])).total_seconds()
    return {"run_id": run["dag_run_id"], "state": done["state"], "seconds": round(seconds, 1), "retried": retried,
            "tasks": len(tasks), "failed": [f"{t['task_id']}[{t['map_index']}]" for t in tasks
                                            if t["state"] == "failed"],
            "by_task": by_task(tasks, datetime.fromisoformat(done["start_date"]))}


def by_task(tasks: list[dict[str, Any]], run_start: datetime) -> dict[str, dict[str, float]]:
    """Each task's instances (mapped ones together): how many, the seconds from the run's start to the first one's
    start, their seconds queued (queued to started) and running (Airflow's ``duration``: the task process, its start
    and imports included), summed; skipped tasks left out."""
    out: dict[str, dict[str, float]] = {}
    for task in tasks:
        if not task.get("start_date") or task["state"] == "skipped":
            continue
        started = datetime.fromisoformat(task["start_date"])
        queued = datetime.fromisoformat(task["queued_when"]) if task.get("queued_when") else started
        row = out.setdefault(task["task_id"], {"instances": 0, "first_start_s": 1e9, "queued_s": 0.0, "running_s": 0.0})
        row["instances"] += 1
        row["first_start_s"] = round(min(row["first_start_s"], (started - run_start).total_seconds()), 2)
        row["queued_s"] = round(row["queued_s"] + max(0.0, (started - queued).total_seconds()), 2)
        row["running_s"] = round(row["running_s"] + float(task.get("duration") or 0), 2)
    return dict(sorted(out.items(), key=lambda item: item[1]["first_start_s"]))


def late_ends(logs: Path) -> dict[str, Any]:
    """Task processes whose end the worker's supervisor reported late: its "Workload finished" line (the scheduler's
    log, where a LocalExecutor's supervisors write) more than half a second after the task's own last log line.
    Airflow 3.3.2's supervisor can miss a task process's exit until its next look, ``[workers]
    min_heartbeat_interval`` later, and the task's slot stays taken meanwhile (bench/NOTES.md)."""
    import re

    last: dict[str, tuple[str, datetime]] = {}  # task instance id -> (task, its last log line's time)
    for path in logs.glob("dag_id=image_tfrecords/**/*.log"):
        lines = [json.loads(line) for line in path.read_text(errors="replace").splitlines() if line.startswith("{")]
        ti = next((line["ti_id"] for line in lines if line.get("ti_id")), None)
        if ti and lines:
            last[ti] = (path.parts[-3].removeprefix("task_id=") if "map_index=" in path.parts[-2] else
                        path.parts[-2].removeprefix("task_id="), datetime.fromisoformat(lines[-1]["timestamp"]))
    late, seconds, seen = [], 0.0, 0
    scheduler = logs / "scheduler.log"
    for line in scheduler.read_text(errors="replace").splitlines() if scheduler.exists() else []:
        found = re.search(r"^(\S+) \[info\s*\] Workload finished .*workload_id=(\S+)", line)
        if found and found.group(2) in last:
            task, ended = last[found.group(2)]
            after = (datetime.fromisoformat(found.group(1)) - ended).total_seconds()
            seen += 1
            if after > 0.5:
                late.append(f"{task} {after:.2f} s")
                seconds += after
    return {"tasks": seen, "late": len(late), "late_seconds": round(seconds, 1), "which": late}


def cli_build(server: Any, dest: str, version: str, full: bool = False) -> dict[str, Any]:
    """The command line's build of the same source into ``dest`` (``--workers 2``, as the stack's parallelism):
    its seconds and stage seconds, to set beside the DAG's run."""
    import os
    import subprocess

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **server.env()}
    command = [sys.executable, "-m", "image_tfrecords", "build", "--source", f"s3://{BUCKET}/{PREFIX}",
               "--destination", dest, "--dataset", "photos", "--version", version, "--workers", "2", "--no-progress",
               *(["--full"] if full else [])]
    started = time.perf_counter()
    done = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode:
        raise RuntimeError(f"the CLI build failed: {done.stderr[-3000:]}")
    return {"seconds": round(seconds, 2)}


def measure(images: int, work: Path, synthetic: bool = False, cli: bool = True, idle_sleep: float | None = None,
            keep_logs: Path | None = None, timeout: float = 1800, heartbeat: int | None = None) -> dict[str, Any]:
    """The three runs on a stack of their own (see the module), each beside the CLI's same build unless ``cli`` is
    False; the results, as written to ``.bench/dag-s3-<images>.json``."""
    corpus, pixels = make_corpus(images, work, synthetic=synthetic)
    extras, _ = make_corpus(3 * sum(night_counts(images).values()), work, synthetic=synthetic, seed=EXTRA_SEED)
    results: dict[str, Any] = {"images": images, "pixels": pixels, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="dag-s3-") as scratch, postgres_server() as database:
        server = seaweedfs.start(str(Path(scratch) / "s3"))
        try:
            server.create_bucket(BUCKET)
            client = server.client()
            started = time.monotonic()
            upload(client, [(p, f"{PREFIX}/{p.relative_to(corpus).as_posix()}") for p in image_files(corpus)])
            print(f"uploaded {images} images with upload_file in {time.monotonic() - started:.1f} s", flush=True)
            home, api_port = Path(scratch) / "airflow", seaweedfs.free_ports(1)[0]
            (home / "logs").mkdir(parents=True)
            env = {**airflow_env(home, database, api_port, server, "LocalExecutor", parallelism=2, pool=POOL),
                   "IMAGE_TFRECORDS_SOURCE": f"s3://{BUCKET}/{PREFIX}",
                   "IMAGE_TFRECORDS_DESTINATION": f"s3://{BUCKET}/datasets", "IMAGE_TFRECORDS_DATASET": "photos"}
            if idle_sleep is not None:
                env["AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME"] = str(idle_sleep)
            results["scheduler_idle_sleep_time"] = idle_sleep
            if heartbeat is not None:
                env["AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL"] = str(heartbeat)
            results["min_heartbeat_interval"] = heartbeat
            connection = json.loads(env.pop("AIRFLOW_CONN_AWS_DEFAULT"))  # in the database, as deployments have it
            migrate(env, pool_slots=2)
            stack = Stack(env, api_port, home / "logs")
            try:
                stack.start()
                wait_for(lambda: stack.call("GET", "/dags/image_tfrecords"), 180, "the DAG to be parsed", 2)
                stack.call("POST", "/connections", {"connection_id": "aws_default", "conn_type": "aws",
                                                    "login": connection["login"], "password": connection["password"],
                                                    "extra": json.dumps(connection["extra"])})
                stack.call("PATCH", "/dags/image_tfrecords", {"is_paused": False})  # REST runs of a paused DAG wait
                # Unpausing makes the latest nightly run, which sees only objects older than its logical date: none
                # here (they were uploaded just now). It ends before the measured runs start.
                scheduled = wait_for(lambda: stack.call("GET", "/dags/image_tfrecords/dagRuns?run_type=scheduled")[
                    "dag_runs"], 180, "the scheduled run", 2)[0]
                results["scheduled"] = wait_for(lambda: (lambda r: r["state"] if r["state"] in ("success", "failed")
                                                         else None)(stack.call("GET", "/dags/image_tfrecords/dagRuns/"
                                                         + scheduled["dag_run_id"].replace("+", "%2B"))), 600,
                                                "the scheduled run's end", 2)
                print(f"the scheduled run made by unpausing: {results['scheduled']}", flush=True)
                day = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)
                plan = (("full build", {}, None), ("1% night", {}, "mutate"), ("full_rebuild", {"full_rebuild": True},
                                                                               None))
                for number, (name, conf, before) in enumerate(plan):
                    if before == "mutate":
                        results["night"] = mutate(client, corpus, extras, images)
                    result = run_once(stack, conf, day + timedelta(minutes=number), timeout)
                    results["runs"][name] = result
                    print(f"{name}: {result['state']} in {result['seconds']:.1f} s, {result['tasks']} tasks, "
                          f"retried: {', '.join(result['retried']) or 'none'}", flush=True)
                    if result["state"] != "success":
                        print(json.dumps(stack.tails(3000), indent=1)[-8000:])
                        break
                    for task, row in result["by_task"].items():
                        print(f"  {task:22} x{row['instances']:<3} starts at {row['first_start_s']:6.1f} s, queued "
                              f"{row['queued_s']:6.1f} s, running {row['running_s']:6.1f} s", flush=True)
                    if cli:  # the same build on the command line, the scheduler idle
                        beside = cli_build(server, f"s3://{BUCKET}/cli-datasets", f"v{number + 1}",
                                        full=bool(conf.get("full_rebuild")))
                        result["cli_seconds"] = beside["seconds"]
                        ratio = result["seconds"] / beside["seconds"]
                        print(f"  the CLI, same build: {beside['seconds']:.1f} s (the DAG {ratio:.1f}x)", flush=True)
            finally:
                stack.stop()
                results["late_ends"] = late_ends(home / "logs")
                if keep_logs is not None:
                    import shutil

                    shutil.copytree(home / "logs", keep_logs, dirs_exist_ok=True)
        finally:
            seaweedfs.stop(server)
    return results


def render(data: dict[str, Any]) -> list[str]:
    """The S3 path section's lines on the DAG: each run's seconds beside the CLI's, and its tasks."""
    lines = [f"\nThe DAG on a LocalExecutor stack (PostgreSQL, `parallelism` 2 = the cores), S3 -> S3, "
             f"{data['images']} images (`bench/dag_s3.py`): each run from the REST API, its seconds as Airflow "
             "records them, beside the command line's same build (`--workers 2`) with the scheduler idle.\n",
             "| run | the DAG (s) | the CLI (s) | the DAG / the CLI | tasks: first start / running (s, summed) |",
             "|---|---:|---:|---:|---|"]
    for name, run in data["runs"].items():
        tasks = []
        for task, row in run["by_task"].items():
            times = "x" + str(row["instances"]) + " " if row["instances"] > 1 else ""
            tasks.append(f"{task} {times}{row['first_start_s']:.1f} / {row['running_s']:.1f}")
        cli = run.get("cli_seconds")
        ratio = f"{run['seconds'] / cli:.1f}x" if cli else "-"
        lines.append(f"| {name} ({run['state']}) | {run['seconds']:.1f} | {cli or '-'} | {ratio} | "
                     f"{', '.join(tasks)} |")
    late = data.get("late_ends")
    if late:
        lines.append(f"\nTask processes whose end their supervisor reported more than 0.5 s after their last log line "
                     f"(the slot taken meanwhile): {late['late']} of {late['tasks']}, {late['late_seconds']:.1f} s in "
                     f"all (`[workers] min_heartbeat_interval` {data.get('min_heartbeat_interval') or 1} s).")
    return lines


def targets(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 50's targets for the DAG: a full build at most 1.5x the CLI's, the 1% night at most 2x."""
    rows = []
    for name, limit in (("full build", 1.5), ("1% night", 2.0)):
        run = data["runs"].get(name)
        if not run or not run.get("cli_seconds"):
            continue
        ratio = run["seconds"] / run["cli_seconds"]
        rows.append((f"the DAG's {name} on a LocalExecutor stack at most {limit:g}x the CLI's ({data['images']} "
                     "images, S3 -> S3)", f"{ratio:.1f}x ({run['seconds']:.1f} s vs {run['cli_seconds']:.1f} s)",
                     run["state"] == "success" and ratio <= limit))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=3000)
    parser.add_argument("--synthetic", action="store_true", help="synthetic photos (offline)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a run may take")
    parser.add_argument("--no-cli", dest="cli", action="store_false",
                        help="do not run the command line's build beside each run")
    parser.add_argument("--idle-sleep", type=float, default=None,
                        help="the scheduler's [scheduler] scheduler_idle_sleep_time (default: Airflow's, 1 s)")
    parser.add_argument("--heartbeat", type=int, default=None,
                        help="the workers' [workers] min_heartbeat_interval (default: the stack's)")
    parser.add_argument("--keep-logs", type=Path, default=None,
                        help="copy the stack's logs (the tasks' logs included) into this folder before it stops")
    args = parser.parse_args(argv)
    work = ROOT / ".bench"
    results = measure(args.images, work, args.synthetic, args.cli, args.idle_sleep, args.keep_logs, args.timeout,
                      args.heartbeat)
    out = work / (f"dag-s3-{args.images}{'' if args.idle_sleep is None else f'-idle{args.idle_sleep:g}'}"
                  f"{'' if args.heartbeat is None else f'-heartbeat{args.heartbeat}'}.json")
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"written {out}")
    print("\n".join(render(results)))
    ok = all(r["state"] == "success" and not r["retried"] for r in results["runs"].values())
    return 0 if ok and len(results["runs"]) == 3 else 1


if __name__ == "__main__":
    sys.exit(main())
