"""Stage 5: write each planned shard (and its ``.tfindex``) into staging, then check it.

A write task writes its shards one after another: a new shard from the source
(``shards.writer.write_shard``), a rewritten one spliced from its base shard
(``shards.splice.splice_shard``) or, gzip, rewritten record by record (``shards.writer.rewrite_shard``).
Each shard is checked right after it is staged by ``shards.checks.validate_shard`` (an independent
re-read from the store), so the reduce step that follows only adds up per-shard results.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, as_completed
from contextlib import ExitStack
from typing import Any

from ..config import BuildConfig
from ..parallel import task_pool, task_processes
from ..progress import ProgressLog
from ..records.example import parse_example
from ..shards.checks import member_names, validate_shard
from ..shards.splice import can_splice, splice_shard
from ..shards.writer import rewrite_shard, write_shard
from ..staging import MEMBERS, PLAN, Progress, no_progress, staged
from ..storage import Storage
from ..storage.documents import read_json
from .reuse import reuse_stage


def write_task(cfg: BuildConfig, storage: Storage, task_index: int) -> list[dict[str, Any]]:
    """Write and check every shard of one write task: the DAG's mapped task. Each shard's records are
    made on a process pool of this machine's cores (``parallel.task_pool``; threads for a few records);
    progress goes to the log. Returns the shards' small results."""
    plan = read_json(storage, staged(cfg, PLAN))
    records = plan.get("task_records") or [0] * len(plan["tasks"])  # a plan staged by 0.3.0 has no counts
    with task_pool(records[task_index]) as pool:
        return [write_and_check(cfg, storage, shard, None, max(4, task_processes()), pool)
                for shard in plan["tasks"][task_index]]


def shard_task(cfg: BuildConfig, storage: Storage, task_index: int) -> dict[str, Any]:
    """The DAG's mapped shard task ``task_index`` (``plan_stage``'s ``shard_tasks``): the plan's write task of that
    index (``write_task``), or, one past the last, the copy of every reused shard (``reuse_stage``: one task for
    them all, as their copies are server-side and a task's start costs more than a copy). Returns the shards, their
    records and bytes, and a ``label`` for the task's name in the UI."""
    tasks = read_json(storage, staged(cfg, PLAN))["tasks"]
    if task_index == len(tasks):
        reused = reuse_stage(cfg, storage)
        return {"shards": reused["reused"], "num_records": reused["num_records"], "num_bytes": reused["num_bytes"],
                "label": f"reuse {reused['reused']} shards"}
    receipts = write_task(cfg, storage, task_index)
    files = [r["file"] for r in receipts]
    return {"shards": len(files), "num_records": sum(r["num_records"] for r in receipts),
            "num_bytes": sum(r["num_bytes"] for r in receipts),
            "label": files[0] if len(files) == 1 else f"{files[0]} .. {files[-1]}"}


def write_and_check(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress | None = no_progress,
                    read_workers: int = 4, processes: Executor | None = None) -> dict[str, Any]:
    """Write one shard (from the source, or rewritten from the previous version's), then re-read and
    check it (the result is staged for the validate stage). ``progress`` None: progress lines go to the log."""
    origin = read_json(storage, staged(cfg, PLAN))["rewrite"].get(shard)
    with ExitStack() as stack:
        if progress is None:
            records = len(member_names(storage.read_bytes(staged(cfg, MEMBERS, shard + ".csv"))))
            progress = stack.enter_context(ProgressLog(f"write {shard}", records, "records"))
        if origin is None:
            write_shard(cfg, storage, shard, progress, read_workers, processes)
        elif can_splice(cfg, origin):
            result = splice_shard(cfg, storage, shard, origin, progress, read_workers, processes)
            if not result.get("fallback"):
                return result  # checked while spliced: kept records' framing and CRCs, new records parsed
        else:
            rewrite_shard(cfg, storage, shard, origin, progress, read_workers, processes)
    return validate_shard(cfg, storage, shard, processes=processes, workers=read_workers)


def costliest_first(cfg: BuildConfig, storage: Storage, shards: list[str]) -> list[str]:
    """``shards`` in the order a pool should take them so that its processes end together: those made from the
    source first (every record read, encoded and parsed), then the spliced ones, the largest bases first."""
    rewrite = read_json(storage, staged(cfg, PLAN))["rewrite"]

    def work(shard: str) -> tuple[int, int]:
        origin = rewrite.get(shard)
        if origin is None or not can_splice(cfg, origin):
            return 0, 0
        return 1, -int(origin.get("num_bytes") or 0)

    return sorted(shards, key=work)


def warm_up() -> None:
    """Import and build what a pool process's first shard would (protobuf's Example parser, which checks every new
    record: about 35 ms of CPU a process). The command line calls it before its pool forks, so every process
    shares it: built then, not beside the stages of its main process (on 2 cores, split's)."""
    parse_example(b"")


def write_few(cfg: BuildConfig, storage: Storage, shards: list[str], done: Progress, workers: int,
              processes: Executor, run: Callable[..., dict[str, Any]] = write_and_check) -> None:
    """Write a few shards (fewer than twice the ``workers`` of the ``processes`` pool). The spliced ones go
    side by side, a whole shard per pool process: their work is copying and hashing in C
    (``os.copy_file_range``, ``hashlib``) plus their few new records, made in that process, so a many-core
    night splices them all at once without the threads of one process taking turns at its lock. The others
    follow one at a time from this process, each shard's records made by the whole pool (side by side, their
    in-flight records would multiply). When one fails or the build is interrupted (SIGTERM raises in this
    thread), the pool's processes are ended with the shards they were splicing (``parallel.process_pool``)."""
    plan = read_json(storage, staged(cfg, PLAN))
    spliced = [s for s in shards if (origin := plan["rewrite"].get(s)) is not None and can_splice(cfg, origin)]
    if len(spliced) < 2:  # nothing to put side by side: in this process, where a SIGTERM stops it at once
        spliced = []
    if spliced:  # on an error or a signal, ``parallel.process_pool`` ends the pool's processes, and their shards
        jobs = [processes.submit(run, cfg, storage, shard, read_workers=1) for shard in spliced]
        for job in as_completed(jobs):
            done(job.result()["num_records"])
    for shard in shards:
        if shard not in spliced:
            run(cfg, storage, shard, done, read_workers=workers, processes=processes)
