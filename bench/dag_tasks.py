"""The scale runs: the DAG's tasks, each its own process, as a LocalExecutor runs them.

The tasks come from the DAG itself (``dags/image_tfrecords_dag.py``): its topological order, which
tasks are mapped and over which task's XCom, and each task's own callable, called with the context
of a manual run (the DAG's param defaults and the run's conf). So the bench times exactly what the
DAG runs, records the XComs the tasks really return, and times a task added to the DAG unchanged.
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import shutil
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.common import PY, ROOT, Run, measure

DAG_FILE = ROOT / "dags" / "image_tfrecords_dag.py"
DAG_ID = "image_tfrecords"
TASK_CODE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from bench.dag_tasks import call_task
print("RESULT" + json.dumps(call_task(sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]))))
"""


def load_dag() -> Any:
    """A fresh DAG object from the DAG file (its ``@dag`` function called once more)."""
    spec = importlib.util.spec_from_file_location("image_tfrecords_dag", DAG_FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, DAG_ID)()


def call_task(task_id: str, conf: dict[str, Any], args: dict[str, Any]) -> Any:
    """Run one task's callable, as the task runner would, in a manual run with ``conf``; its XCom.

    ``args``: the task's arguments, by name (``op_args`` by position under ``"*"``)."""
    from airflow.sdk.execution_time.context import set_current_context

    dag = load_dag()
    task = dag.get_task(task_id)
    params = {name: dag.params[name] for name in dag.params} | conf
    context = {"params": params, "dag": dag, "run_id": "bench", "logical_date": None,
               "dag_run": SimpleNamespace(run_type="manual"), "ti": SimpleNamespace(task_id=task_id, try_number=1),
               "outlet_events": defaultdict(SimpleNamespace)}
    with set_current_context(context):  # type: ignore[arg-type]
        return task.python_callable(*args.pop("*", []), **args)


def upstream_task(arg: Any) -> str:
    """The task id whose XCom an argument of the DAG's wiring is."""
    return arg.operator.task_id


def run_tasks(corpus: Path, work: Path, parallel: int = 2) -> dict[str, Any]:
    """The DAG's tasks in order, one process each, mapped tasks ``parallel`` at a time (each with its own
    process pool) as a LocalExecutor with ``parallelism`` = ``parallel`` runs them; per task: seconds,
    peak RSS, XCom bytes, and the number of mapped tasks; the shards of the published version."""
    from image_tfrecords.published import layout
    from image_tfrecords.storage import Storage
    from tools import airflow_env

    dest = work / "stages-out"
    shutil.rmtree(dest, ignore_errors=True)
    conf = {"source": str(corpus), "destination": str(dest), "dataset": "scale", "version": "v1"}
    env = airflow_env.environment(work / "airflow-tasks")  # the project importable; no database: none is used

    def call(task_id: str, args: dict[str, Any]) -> tuple[Run, Any]:
        run = measure([PY, "-c", TASK_CODE, str(ROOT), task_id, json.dumps(conf), json.dumps(args)], env=env,
                      cwd=ROOT)
        return run, json.loads(run.stdout.split("RESULT", 1)[1].splitlines()[0])

    report: dict[str, Any] = {"stages": {}, "mapped": {}}
    xcoms: dict[str, Any] = {}
    started = time.perf_counter()
    skipped: set[str] = set()  # tasks of the branches not taken (the gate's approval and discard, when it passes)
    for task in load_dag().topological_sort():
        if task.task_id in skipped or (task.upstream_task_ids and task.upstream_task_ids <= skipped):
            skipped.add(task.task_id)
            continue
        task_started = time.perf_counter()
        if task.is_mapped:
            ((name, arg),) = task.op_kwargs_expand_input.value.items()  # one mapped argument per task here
            values = xcoms[upstream_task(arg)]
            with concurrent.futures.ThreadPoolExecutor(parallel) as pool:
                runs = list(pool.map(lambda v, n=name, t=task.task_id: call(t, {n: v}), values))
            report["mapped"][task.task_id] = len(runs)
            xcoms[task.task_id] = [result for _, result in runs]
        else:
            runs = [call(task.task_id, {"*": [xcoms[upstream_task(a)] for a in task.op_args]})]
            xcoms[task.task_id] = runs[0][1]
        report["stages"][task.task_id] = {"seconds": time.perf_counter() - task_started,
                                          "rss_mb": max((r.rss_mb for r, _ in runs), default=0.0),
                                          "xcom_bytes": max((len(json.dumps(x)) for _, x in runs), default=0)}
        kinds = {kind.__name__ for kind in type(task).__mro__}
        result = xcoms[task.task_id]
        if "BaseBranchOperator" in kinds and isinstance(result, str | list):  # a branch
            chosen = {result} if isinstance(result, str) else set(result)
            follow = chosen | {d for c in chosen for d in task.dag.get_task(c).get_flat_relative_ids(upstream=False)}
            skipped |= set(task.downstream_task_ids) - follow
    report["seconds"] = time.perf_counter() - started
    report["mapped_tasks"] = report["mapped"].get("write_shards", 0)
    report["shards"] = len(layout.read_manifest(Storage(), str(dest / "scale" / "v1")).shard_files)
    shutil.rmtree(dest, ignore_errors=True)
    return report


def write_alone(corpus: Path, work: Path) -> float:
    """Seconds of the write stage alone (the tasks before it done first), two processes."""
    return run_tasks(corpus, work)["stages"]["write_shards"]["seconds"]


def render_scale(scale: dict[int, Any]) -> list[str]:
    """The "Scale" sections: one table of the DAG's tasks per corpus size."""
    lines: list[str] = []
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
    return lines


def scale_targets(scale: dict[int, Any]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) of issue 5's scale targets: the largest corpus against the smallest."""
    rows: list[tuple[str, str, bool]] = []
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
