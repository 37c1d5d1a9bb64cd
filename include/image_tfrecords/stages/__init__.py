"""The pipeline's stages, in order: the one definition the DAG, the command line and the benchmark use.

    discover -> inspect (plan_inspection, inspect_chunk per chunk, gather_inspection) -> split -> plan
             -> reuse (copy the previous version's kept shards)
             -> write (one per shard: write, then check) -> validate -> card -> gate -> publish

``gate`` compares the build with the previous published version (``rules.publish_gate``); when it trips and
nobody accepted it, ``run_pipeline`` raises ``GateTripped`` and the DAG fails or asks a person.

Each stage is a function ``(cfg, storage, ...) -> small dict`` in a module of its own. It reads
its inputs from the build's staging prefix in the store and writes its outputs there (see
``staging``), so a stage can run on any worker; run again on the same inputs, it writes the same
bytes. The DAG runs each stage as a task (``inspect_chunk`` as one mapped task per chunk of the
listing, ``write`` as one per group of shards, each using its machine's cores through a process
pool); ``run_pipeline`` runs them all in one process, with one process pool for the per-image work.
The reuse, write and validate stages are built on ``shards`` (writing, splicing and checking one shard).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError, GateTripped
from ..rules.publish_gate import TRIPPED
from ..shards.checks import validate_shard
from ..shards.writer import write_shard
from ..staging import (
    DISCOVER_REJECTS,
    DISCOVERED,
    INSPECT_REJECTS,
    INSPECTED,
    LABELS,
    MANIFEST,
    MAX_MAP_LENGTH,
    PLAN,
    REJECTS,
    TMP_PREFIX,
    Progress,
    no_progress,
)
from ..storage import Storage, is_s3
from .card import card_facts, card_stage
from .discover import discard_stage, discover_stage
from .gate import approve_gate, gate_stage
from .inspect import (
    chunk_label,
    gather_inspection,
    inspect_chunk,
    inspect_chunks,
    inspect_in_place,
    inspect_small,
    inspect_stage,
    plan_inspection,
)
from .plan import all_shards, plan_stage, task_shards
from .publish import publish_stage
from .reuse import reuse_shard, reuse_stage
from .split import split_stage
from .validate import validate_stage
from .write import costliest_first, shard_task, write_and_check, write_few, write_task

__all__ = [
    "DISCOVERED",
    "DISCOVER_REJECTS",
    "INSPECTED",
    "INSPECT_REJECTS",
    "LABELS",
    "MANIFEST",
    "MAX_MAP_LENGTH",
    "PIPELINE",
    "PLAN",
    "REJECTS",
    "TMP_PREFIX",
    "BuildError",
    "GateTripped",
    "Stage",
    "approve_gate",
    "card_stage",
    "chunk_label",
    "discard_stage",
    "discover_stage",
    "gate_stage",
    "gather_inspection",
    "inspect_chunk",
    "inspect_chunks",
    "inspect_in_place",
    "inspect_small",
    "inspect_stage",
    "plan_inspection",
    "plan_stage",
    "publish_stage",
    "reuse_shard",
    "reuse_stage",
    "run_pipeline",
    "shard_task",
    "split_stage",
    "task_shards",
    "validate_shard",
    "validate_stage",
    "write_and_check",
    "write_shard",
    "write_task",
]


@dataclass(frozen=True)
class Stage:
    """One step of the pipeline.

    ``per_shard``: runs once per planned shard (the DAG maps it over write tasks; ``run_pipeline``
    over a process pool). ``per_image``: one call that spreads its images over ``workers`` (threads,
    or the ``processes`` pool) and reports ``progress``. Otherwise: one call, ``(cfg, storage)``.
    """

    name: str
    run: Callable[..., Any]
    per_shard: bool = False
    per_image: bool = False


CARD_IN_POOL_WORKERS = 4  # from this many processes on, the card's pass over the rows runs in the pool

PIPELINE: tuple[Stage, ...] = (
    Stage("discover", discover_stage),
    Stage("inspect", inspect_stage, per_image=True),
    Stage("split", split_stage),
    Stage("plan", plan_stage),
    Stage("reuse", reuse_stage),
    Stage("write", write_and_check, per_shard=True),
    Stage("validate", validate_stage),
    Stage("card", card_stage),
    Stage("gate", gate_stage),
    Stage("publish", publish_stage),
)

ProgressFactory = Callable[[str, int], AbstractContextManager[Progress]]


@contextlib.contextmanager
def _silent(_name: str, _total: int) -> Iterator[Progress]:
    yield no_progress


def run_pipeline(cfg: BuildConfig, storage: Storage, *, pool: Executor | None = None, workers: int = 1,
                 progress: ProgressFactory = _silent, force: bool = False,
                 before_publish: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """Run every stage of ``PIPELINE`` in this process; per-image work goes to ``pool`` (``workers`` processes;
    None: ``workers`` threads here, one meaning everything on this thread). With a pool, the card's pass over the
    rows (``card_facts``) runs on a thread of this process while the pool writes the shards: this process only
    waits for them then, and the card stage is left with rendering.

    When the source listing and params are those of the previous published version, nothing is
    built (the staging is dropped) unless ``force`` or ``cfg.full``: returns ``{"unchanged_since": VERSION, ...}``.
    ``progress(stage, total)`` gives a callback counting images done; ``before_publish`` may raise to
    stop the build before anything is published (the CLI checks it still holds its lock). Staged files are
    made durable together, by the publish (``Storage.defer_sync``). When the publish
    gate trips (and ``cfg.accept_gate`` is off), raises ``GateTripped`` with its report: nothing is published,
    the staging is kept (a rerun of the version with ``accept_gate`` reuses its finished shards). The result
    (publish's) also gives ``stage_seconds`` and ``gate`` (the verdict); its ``read`` is the inspection's reading
    and decoding of files, its ``inspect`` the rest of that stage (the passes over the listing). The pool writes
    the costliest shards first (``costliest_first``).
    """
    results: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    storage.defer_sync(cfg.staging_uri)  # one syncfs before the publish, not an fsync per staged file
    with ThreadPoolExecutor(1, thread_name_prefix="card") as beside:
        card_ahead: Future[Any] | None = None
        for stage in PIPELINE:
            if stage.run is publish_stage:
                before_publish()
            started = time.perf_counter()
            if stage.per_shard:
                shards = costliest_first(cfg, storage, all_shards(cfg, storage))
                with progress(stage.name, results["plan"]["records_to_write"]) as done:
                    if pool is not None and len(shards) < 2 * workers:  # too few shards to keep the pool busy:
                        write_few(cfg, storage, shards, done, workers, pool, stage.run)  # spliced ones side by side
                    else:  # a shard per process (4 threads each for S3's latency; one locally), or all here
                        mapper = pool.map if pool is not None else map
                        threads = (4 if is_s3(cfg.source) else 1) if pool is not None else workers
                        for result in mapper(partial(stage.run, cfg, storage, read_workers=threads), shards):
                            done(result["num_records"])
            elif stage.per_image:
                with progress(stage.name, results["discover"]["candidates"]) as done:
                    results[stage.name] = stage.run(cfg, storage, workers=workers, progress=done,
                                                    processes=pool if pool is not None and workers > 1 else None)
            elif stage.run is card_stage:
                results[stage.name] = stage.run(cfg, storage, facts=card_ahead.result() if card_ahead else None)
            else:
                results[stage.name] = stage.run(cfg, storage)
            seconds[stage.name] = round(time.perf_counter() - started, 3)
            if stage.per_image:  # inspection: its passes over the listing, and the reading of files apart
                seconds["read"] = results[stage.name].pop("read_seconds")
                seconds[stage.name] = round(seconds[stage.name] - seconds["read"], 3)
            if stage.run is plan_stage and pool is not None:  # the card's pass over the rows, beside the writing: with
                # cores to spare in a process of the pool (on a thread here it would hold validate up: a short write)
                card_ahead = (pool if workers >= CARD_IN_POOL_WORKERS else beside).submit(card_facts, cfg, storage)
            unchanged = results.get("discover", {}).get("unchanged_since")
            if stage.run is discover_stage and unchanged and not (force or cfg.full):
                discard_stage(cfg, storage)
                return {"unchanged_since": unchanged, "version": unchanged}
            if stage.run is gate_stage and results["gate"]["verdict"] == TRIPPED:
                storage.sync(cfg.staging_uri)  # kept for a rerun that accepts it: on disk now, not at a publish
                lines = results["gate"]["report"]
                raise GateTripped(f"{lines[0]}: nothing was published", "\n".join(lines))
    return {**results["publish"], "stage_seconds": seconds, "gate": results["gate"]["verdict"]}
