"""Stage 2: hash, identify and fully decode every candidate (the label CSV's facts), in chunks.

Inspection is the build's largest per-image cost, so it is split into *chunks* of the listing that
run anywhere (the DAG maps one task over each; the command line streams every chunk through one
process pool):

1. ``plan_inspection`` (metadata only) joins the listing with the previous version's
   ``inspected.csv``: a file with the same name, size and stamp is not read again, its row is taken
   over (``base_version``; ``inspect/carried.csv`` gives each one's listing number and where its row is in
   that table). The files to read are cut, in listing order, into chunks of at most ``cfg.chunk_files``
   files or ``cfg.chunk_mb`` MB (bigger when that would make more than ``MAX_MAP_LENGTH`` chunks):
   ``inspect/todo-NNNNN.csv`` and ``inspect/chunks.json``.
2. ``inspect_chunk`` reads one chunk's files and stages its rows (``inspect/done-NNNNN.csv``).
3. ``gather_inspection`` (metadata only) merges the rows taken over (the previous version's text of them, its
   table checked to be the one planned on) and the inspected ones back into listing order: ``inspected.csv``
   and the rejects, as one pass over the listing would.

Every row carries its listing number, so the merged tables do not depend on how the listing was
cut or on which worker read what.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import time
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from contextlib import ExitStack
from functools import partial
from typing import TYPE_CHECKING, Any

from ..config import BuildConfig
from ..errors import BuildError
from ..images.probe import MODERN_FORMATS, RejectedImage, inspect_image, sniff_format
from ..parallel import batched_map, forked, io_threads, ordered_map, preload, task_pool, task_processes
from ..progress import ProgressLog, log, summarized
from ..published import layout
from ..records.schema import REJECTS_FIELDS
from ..rules.base_version import (
    INSPECTION_FIELDS,
    Base,
    base_of,
    carried_inspections,
    why_not_reuse_inspection,
)
from ..rules.shards import MB
from ..source import spool
from ..source.listing import DISCOVERED_FIELDS
from ..source.reading import read_source
from ..staging import (
    DISCOVER_SUMMARY,
    DISCOVERED,
    INSPECT_REJECTS,
    INSPECT_SUMMARY,
    INSPECTED,
    MAX_MAP_LENGTH,
    Progress,
    no_progress,
    staged,
)
from ..storage import Storage, join
from ..storage.documents import RowWriter, read_json, read_rows, write_json
from ..storage.tables import header_line, polars, read_table, table_rows, write_table

if TYPE_CHECKING:
    import polars as pl

CHUNKS = "inspect/chunks.json"
CARRIED = "inspect/carried.csv"  # the files whose row is taken over: listing number, and where the row is in the base
CARRIED_FIELDS = ("number", "begin", "end", "rejected")
TODO_FIELDS = ("number", "filename", "label", "num_bytes", "stamp")
DONE_FIELDS = ("number", "label", *INSPECTION_FIELDS)
# What inspecting the first image imports (the thumbnails' measurements need numpy, split needs it here too; Pillow
# imports its common format plugins on its first open): imported before the pool forks, every worker shares them
INSPECTION_MODULES = ("numpy", "PIL.Image", "PIL.JpegImagePlugin", "PIL.PngImagePlugin", "PIL.GifImagePlugin",
                      "PIL.BmpImagePlugin", "PIL.PpmImagePlugin", "PIL.ImageChops")


def _todo(chunk: int) -> str:
    return f"inspect/todo-{chunk:05d}.csv"


def _done(chunk: int) -> str:
    return f"inspect/done-{chunk:05d}.csv"


def fetch_one(storage: Storage, cfg: BuildConfig, row: dict[str, str]) -> bytes | RejectedImage:
    """A candidate's bytes, or why they cannot become a record (for ``inspect_one``, fetched ahead)."""
    try:
        return read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
    except RejectedImage as exc:
        return exc


def inspect_one(storage: Storage, cfg: BuildConfig, row: dict[str, str],
                fetched: bytes | RejectedImage | None = None) -> dict[str, Any]:
    """One candidate's facts, or its reject row; its bytes ``fetched`` ahead (``fetch_one``), or read here."""
    try:
        data = fetch_one(storage, cfg, row) if fetched is None else fetched
        if isinstance(data, RejectedImage):
            raise data
        if not cfg.modern_formats and sniff_format(data) in MODERN_FORMATS:
            raise RejectedImage("unsupported_format", f"{sniff_format(data)}: HEIC/HEIF, AVIF and JPEG XL are "
                                "turned off (modern_formats)")
        facts = inspect_image(data, cfg.max_pixels, cfg.png_pixels)
    except RejectedImage as exc:
        return {"filename": row["filename"], "reason": exc.reason, "detail": exc.detail}
    spool.keep(facts.sha256, data)  # the command line's copy for the write stage (nothing elsewhere)
    return {"filename": row["filename"], "label": row["label"], **vars(facts)}


def chunk_limits(cfg: BuildConfig, files: int, num_bytes: int, max_chunks: int = MAX_MAP_LENGTH) -> tuple[int, int]:
    """Files and bytes per chunk: ``cfg.chunk_files`` and ``cfg.chunk_mb``, raised so that at most
    ``max_chunks`` chunks are cut (a chunk ends at either limit, so each limit alone gives half)."""
    half = max(1, max_chunks // 2)
    return (max(cfg.chunk_files, math.ceil(files / half)),
            max(int(cfg.chunk_mb * MB), math.ceil(num_bytes / half)))


@summarized
def plan_inspection(cfg: BuildConfig, storage: Storage, max_chunks: int = MAX_MAP_LENGTH) -> dict[str, Any]:
    """Take over what the previous version inspected, and cut the files to read into chunks (at least one,
    perhaps empty, so the steps after it always run). Returns ``{"chunks": n, ...}``."""
    base = base_of(cfg, storage, read_json(storage, staged(cfg, DISCOVER_SUMMARY))["previous_version"])
    why_not = why_not_reuse_inspection(cfg, base)
    if base is not None and not why_not and not storage.exists(join(base.uri, layout.INSPECTED)):
        why_not = f"version {base.version} is damaged: its {layout.INSPECTED} is missing"
        log.warning("%s: every file is read again", why_not)
    plan = _plan(cfg, storage, None if why_not else base, max_chunks)
    plan["not_reused_because"] = why_not or plan["not_reused_because"]
    plan["base_version"] = base.version if base else None
    write_json(storage, staged(cfg, CHUNKS), plan)
    return {"chunks": len(plan["chunks"]), **{key: plan[key] for key in ("files_to_read", "bytes_to_read",
                                                                         "files_reused")}}


def _listed(cfg: BuildConfig, storage: Storage) -> pl.DataFrame:
    """discovered.csv, each row with its listing ``number``."""
    pl = polars()

    listed = read_table(storage, staged(cfg, DISCOVERED))
    if tuple(listed.columns) != DISCOVERED_FIELDS:
        raise BuildError(f"{staged(cfg, DISCOVERED)} has columns {listed.columns}, expected {DISCOVERED_FIELDS}")
    return listed.with_row_index("number").with_columns(pl.col("number").cast(pl.Int64))


def _plan(cfg: BuildConfig, storage: Storage, base: Base | None, max_chunks: int) -> dict[str, Any]:
    """Stage the rows taken over from ``base`` (``CARRIED``) and the files left to read, cut into chunks (``todo``
    tables). Returns chunks.json's facts: the chunks, the files listed, the files and bytes to read, the files
    carried, the SHA-256 of the base's inspected.csv they come from, and why nothing was taken over from a base
    whose inspected.csv is damaged (a damaged base never stops a build: its files are read again)."""
    pl = polars()

    listed = _listed(cfg, storage)
    carried = pl.DataFrame(schema=dict.fromkeys(CARRIED_FIELDS, pl.Int64))
    damaged = base_sha256 = ""
    if base is not None:
        try:  # (the whole table read: a damaged one is found here, before any file would not be read)
            found, base_sha256 = carried_inspections(storage, base, listed)
            carried = found.select("number", "begin", "end", rejected=(~is_image()).cast(pl.Int64))
        except BuildError as exc:
            damaged = f"version {base.version} is damaged: {exc}"
            log.warning("%s: every file is read again", damaged)
    write_table(storage, staged(cfg, CARRIED), carried)
    unread = listed.join(carried.select("number"), on="number", how="anti").sort("number")
    try:
        sizes = unread["num_bytes"].cast(pl.Int64).to_list()
    except pl.exceptions.InvalidOperationError as exc:
        raise BuildError(f"{staged(cfg, DISCOVERED)}: a num_bytes that is not a number ({exc})") from exc
    max_files, max_bytes = chunk_limits(cfg, len(sizes), sum(sizes), max_chunks)
    chunks: list[dict[str, int]] = [{"files": 0, "bytes": 0}]
    for size in sizes:  # a chunk ends at either limit
        if chunks[-1]["files"] >= max_files or (chunks[-1]["bytes"] + size > max_bytes and chunks[-1]["files"]):
            chunks.append({"files": 0, "bytes": 0})
        chunks[-1]["files"] += 1
        chunks[-1]["bytes"] += size
    todo, first = unread.select(TODO_FIELDS), 0
    for number, chunk in enumerate(chunks):
        write_table(storage, staged(cfg, _todo(number)), todo.slice(first, chunk["files"]))
        first += chunk["files"]
    return {"chunks": chunks, "files_listed": listed.height, "files_to_read": len(sizes), "bytes_to_read": sum(sizes),
            "files_reused": carried.height, "base_inspected_sha256": base_sha256, "not_reused_because": damaged}


def chunk_label(cfg: BuildConfig, storage: Storage, chunk: int) -> str:
    """How a chunk's task is named in the UI: ``chunk 3/12 (2000 files, 95 MB)``."""
    return _label(read_json(storage, staged(cfg, CHUNKS))["chunks"], chunk)


def _label(chunks: list[dict[str, int]], chunk: int) -> str:
    facts = chunks[chunk]
    return f"chunk {chunk + 1}/{len(chunks)} ({facts['files']} files, {facts['bytes'] / MB:.0f} MB)"


def inspect_chunks(cfg: BuildConfig, storage: Storage, chunks: Sequence[int], workers: int = 4,
                   processes: Executor | None = None, progress: Progress | None = None) -> dict[str, Any]:
    """Inspect the files of ``chunks`` (in one stream, so a pool stays busy across chunk ends) and stage
    each chunk's rows. Runs on ``workers`` threads (decoders release the GIL), or on the ``processes``
    pool when given. Without ``progress``, progress lines go to the log."""
    plan = read_json(storage, staged(cfg, CHUNKS))
    counts = [plan["chunks"][c]["files"] for c in chunks]
    what = f"inspect chunk {chunks[0] + 1}/{len(plan['chunks'])}" if len(chunks) == 1 else "inspect"
    with ExitStack() as stack:
        if progress is None:
            progress = stack.enter_context(ProgressLog(what, sum(counts)))
        inspect = partial(inspect_one, storage, cfg)
        in_flight: deque[dict[str, str]] = deque()  # the rows handed out and not yet written (a bounded window)

        def rows() -> Iterator[dict[str, str]]:
            for chunk in chunks:
                with read_rows(storage, staged(cfg, _todo(chunk))) as todo:
                    for row in todo:
                        in_flight.append(row)
                        yield row

        if processes is not None and not forked(processes):  # (too late once forked: they import them themselves)
            preload(*INSPECTION_MODULES)
        fetch = partial(fetch_one, storage, cfg)  # bytes fetched ahead on threads (a remote store), inspected in turn
        fresh = batched_map(inspect, rows(), processes, workers, total=sum(counts), fetch=fetch,
                            threads=io_threads(cfg.source)) if processes else ordered_map(inspect, rows(), workers)
        read = rejected = 0
        for chunk, count in zip(chunks, counts, strict=True):
            with RowWriter(storage, staged(cfg, _done(chunk)), DONE_FIELDS) as done:
                for result in itertools.islice(fresh, count):
                    row = in_flight.popleft()  # results come in the order rows went out
                    done.write({**result, "number": row["number"], "label": row["label"],
                                "num_bytes": row["num_bytes"], "stamp": row["stamp"]})
                    rejected += "reason" in result
                    progress(1)
                if done.count != count:
                    raise BuildError(f"inspection chunk {chunk + 1} lists {done.count} files, its plan {count}")
            read += count
    return {"chunks": len(chunks), "files_read": read, "rejected": rejected}


# A night's few changed files are inspected by the task that planned them, not by mapped tasks of their own: a task
# on a LocalExecutor stack costs 2-3 s of start and scheduling (bench/dag_s3.py), about what one core spends reading
# and decoding 256 photos from S3.
INLINE_MAX_FILES = 256
INLINE_MAX_BYTES = 64 * MB


def inspect_in_place(planned: dict[str, Any]) -> bool:
    """Whether ``plan_inspection``'s result (``planned``) leaves so little to read, on top of what the previous
    version's inspection hands over, that the task that planned it should inspect it too (``inspect_small``)."""
    return bool(planned["files_reused"]) and planned["files_to_read"] <= INLINE_MAX_FILES \
        and planned["bytes_to_read"] <= INLINE_MAX_BYTES


def inspect_small(cfg: BuildConfig, storage: Storage, chunks: int) -> dict[str, Any]:
    """Inspect the plan's ``chunks`` chunks (``plan_inspection``'s count) in this process, on threads
    (``inspect_in_place``: a few files)."""
    return inspect_chunks(cfg, storage, list(range(chunks)), max(4, 2 * task_processes()))


def inspect_chunk(cfg: BuildConfig, storage: Storage, chunk: int) -> dict[str, Any]:
    """Inspect one chunk: the DAG's mapped task. Its images are spread over a process pool of this
    machine's cores (``parallel.task_pool``; threads for a small chunk); progress goes to the log.
    The result's ``label`` names the chunk (``chunk_label``), for the task's name in the UI."""
    chunks = read_json(storage, staged(cfg, CHUNKS))["chunks"]
    with task_pool(chunks[chunk]["files"]) as pool:
        return {**inspect_chunks(cfg, storage, [chunk], max(4, task_processes()), pool),
                "label": _label(chunks, chunk)}


def is_image() -> Any:
    """The polars expression that tells an inspected.csv row of an image from a reject's."""
    pl = polars()

    return pl.col("reason").is_null() & pl.col("detail").is_null()


@summarized
def gather_inspection(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Merge the rows taken over and the chunks' rows, in listing order, into ``inspected.csv`` (a row for each file
    discovered.csv lists, in its order: split takes each one's label from there) and the inspection rejects; stage
    the inspection summary. A row taken over is the previous version's text of it, from the table the plan read
    (checked by its SHA-256): nothing of it is parsed but the rejects'."""
    plan = read_json(storage, staged(cfg, CHUNKS))
    missing = [c for c in range(len(plan["chunks"])) if not storage.exists(staged(cfg, _done(c)))]
    if missing:
        raise BuildError(f"inspection chunk(s) {', '.join(str(c + 1) for c in missing[:10])} of "
                         f"{len(plan['chunks'])} were not inspected")

    pl = polars()

    done = [read_table(storage, staged(cfg, _done(chunk))) for chunk in range(len(plan["chunks"]))]
    if wrong := next((table.columns for table in done if tuple(table.columns) != DONE_FIELDS), None):
        raise BuildError(f"an inspection table has columns {wrong}, expected {DONE_FIELDS}")
    rows = pl.concat(done).with_columns(pl.col("number").cast(pl.Int64)).sort("number")
    carried = read_table(storage, staged(cfg, CARRIED))
    if tuple(carried.columns) != CARRIED_FIELDS:
        raise BuildError(f"{staged(cfg, CARRIED)} has columns {carried.columns}, expected {CARRIED_FIELDS}")
    carried = carried.cast(pl.Int64)
    base_table, uri = b"", staged(cfg, CARRIED)
    if carried.height:  # (the version's table alone: its manifest was read by the plan)
        uri = join(cfg.dataset_uri, str(plan["base_version"]), layout.INSPECTED)
        base_table = storage.read_bytes(uri)
        if hashlib.sha256(base_table).hexdigest() != plan["base_inspected_sha256"]:  # (a published one never changes)
            raise BuildError(f"{uri} is not the table this build's inspection was planned on")
    header = header_line(INSPECTION_FIELDS)
    text, begins, ends = table_rows(rows.select(INSPECTION_FIELDS))
    listed = plan["files_listed"]
    merged = _merged(listed, [(base_table, *(carried[name].to_numpy() for name in CARRIED_FIELDS[:3])),
                              (text, rows["number"].to_numpy(), begins, ends)])
    if merged is None:
        raise BuildError(f"inspection took {carried.height} files over and read {rows.height}, of {listed} "
                         "listed: its tables do not give each file once")
    storage.write_bytes(staged(cfg, INSPECTED), header + merged)
    taken = carried.filter(pl.col("rejected") == 1)  # the rejects taken over, parsed from their rows
    taken_rows = read_table(storage, uri, header + b"".join([base_table[begin:end] for begin, end in
                                                              taken.select("begin", "end").iter_rows()]))
    rejected = pl.concat([taken_rows.select(*REJECTS_FIELDS, number=taken["number"]),
                          rows.filter(~is_image()).select(*REJECTS_FIELDS, "number")]).sort("number")
    write_table(storage, staged(cfg, INSPECT_REJECTS), rejected.select(REJECTS_FIELDS))
    summary = {"inspected": listed - len(rejected), "rejected": len(rejected),
               "files_read": plan["files_to_read"], "bytes_read": plan["bytes_to_read"],
               "files_reused": plan["files_reused"], "base_version": plan["base_version"],
               "not_reused_because": plan["not_reused_because"], "chunks": len(plan["chunks"])}
    write_json(storage, staged(cfg, INSPECT_SUMMARY), summary)
    return {key: summary[key] for key in ("inspected", "rejected", "files_read", "files_reused")}


def _merged(count: int, parts: list[tuple[bytes, Any, Any, Any]]) -> bytes | None:
    """The rows of ``parts`` in listing order, as one text: each part a table's text and, for each of its rows, the
    listing number and where the row begins and ends in it (numpy arrays). None unless the parts give each of
    ``count`` numbers once. Rows that follow each other in a text are copied as one run of it (a night's rows taken
    over are a few long runs of the previous version's table)."""
    import numpy as np

    numbers = np.concatenate([part[1] for part in parts])
    if len(numbers) != count:
        return None
    if not count:
        return b""
    if numbers.min() < 0 or numbers.max() >= count or not (np.bincount(numbers, minlength=count) == 1).all():
        return None
    source, begin, end = (np.empty(count, dtype=np.int64) for _ in range(3))
    for index, (_, at, first, last) in enumerate(parts):
        source[at], begin[at], end[at] = index, first, last
    starts = np.flatnonzero(np.r_[True, (source[1:] != source[:-1]) | (begin[1:] != end[:-1])])
    stops = np.r_[starts[1:], count] - 1  # each run's last row
    return b"".join([parts[part][0][first:last] for part, first, last in
                     zip(source[starts].tolist(), begin[starts].tolist(), end[stops].tolist(), strict=True)])


def was_read(cfg: BuildConfig, storage: Storage, filename: str) -> bool:
    """Whether inspection read ``filename`` (one of its chunks lists it), rather than taking its row over."""
    chunks = read_json(storage, staged(cfg, CHUNKS))["chunks"]
    for chunk in range(len(chunks)):
        with read_rows(storage, staged(cfg, _done(chunk))) as rows:
            if any(row["filename"] == filename for row in rows):
                return True
    return False


def inspect_stage(cfg: BuildConfig, storage: Storage, workers: int = 4, progress: Progress = no_progress,
                  processes: Executor | None = None) -> dict[str, Any]:
    """Plan, inspect every chunk and gather (the command line's inspection). The result's ``read_seconds`` is the
    time spent reading and decoding the files (``inspect_chunks``), the rest went on the passes over the listing."""
    planned = plan_inspection(cfg, storage)
    progress(planned["files_reused"])
    started = time.perf_counter()
    inspect_chunks(cfg, storage, range(planned["chunks"]), workers, processes, progress)
    read_seconds = round(time.perf_counter() - started, 3)
    return {**gather_inspection(cfg, storage), "read_seconds": read_seconds}
