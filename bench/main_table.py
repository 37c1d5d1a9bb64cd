"""The main table (issue 5): the seed-style converters, ``cp -r``, the CLI and the DAG under ``airflow dags test``."""

from __future__ import annotations

import json
import re
import shutil
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from bench.common import PY, ROOT, Run, measure, preamble
from tools.airflow_env import AIRFLOW

# -- the DAG under `airflow dags test` ------------------------------------------------------------
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


class DagRunner:
    """A migrated SQLite AIRFLOW_HOME and a SeaweedFS server, for `airflow dags test` runs."""

    def __init__(self, work: Path) -> None:
        from tools import airflow_env, seaweedfs

        self.work = work
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        self.server = seaweedfs.start(str(work / "seaweedfs"))
        self.server.create_bucket("bench")
        self.env = airflow_env.environment(work / "airflow", self.server, unit_test_mode=False, drop=("AWS_",))
        airflow_env.migrate(self.env)

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


def render(contenders: list[Contender], corpus: tuple[int, int], rounds: int, xcoms: list[tuple[str, int, int]],
           chart_name: str, command: str, pixels: str = "") -> str:
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
    return "\n".join(lines) + "\n"


def targets(contenders: list[Contender], xcoms: list[tuple[str, int, int]],
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
    return rows


