"""Stage 2: hash, identify and fully decode every candidate (the label CSV's facts), in chunks.

Inspection is the build's largest per-image cost, so it is split into *chunks* of the listing that
run anywhere (the DAG maps one task over each; the command line streams every chunk through one
process pool):

1. ``plan_inspection`` (metadata only) joins the listing with the previous version's
   ``inspected.csv``: a file with the same name, size and stamp is not read again, its row is taken
   over (``base_version``; ``inspect/carried.csv``). The files to read are cut, in listing order, into
   chunks of at most ``cfg.chunk_files`` files or ``cfg.chunk_mb`` MB (bigger when that would make
   more than ``MAX_MAP_LENGTH`` chunks): ``inspect/todo-NNNNN.csv`` and ``inspect/chunks.json``.
2. ``inspect_chunk`` reads one chunk's files and stages its rows (``inspect/done-NNNNN.csv``).
3. ``gather_inspection`` (metadata only) merges the carried and inspected rows back into listing
   order: ``images.csv``, the rejects and ``inspected.csv``, as one pass over the listing would.

Every row carries its listing number, so the merged tables do not depend on how the listing was
cut or on which worker read what.
"""

from __future__ import annotations

import contextlib
import csv
import itertools
import math
import mmap
import os
import tempfile
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import ExitStack
from functools import partial
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError
from ..images.probe import MODERN_FORMATS, RejectedImage, inspect_image, sniff_format
from ..parallel import batched_map, forked, io_threads, ordered_map, preload, task_pool, task_processes
from ..progress import ProgressLog, log, summarized
from ..published import layout
from ..records.schema import REJECTS_FIELDS
from ..rules.base_version import (
    INSPECTION_FIELDS,
    base_of,
    carried_inspections,
    inspections,
    why_not_reuse_inspection,
)
from ..rules.shards import MB
from ..source import spool
from ..source.listing import DISCOVERED_FIELDS
from ..source.reading import read_source
from ..staging import (
    CARRIED,
    DISCOVER_SUMMARY,
    DISCOVERED,
    IMAGE_FIELDS,
    IMAGES,
    INSPECT_REJECTS,
    INSPECT_SUMMARY,
    INSPECTED,
    MAX_MAP_LENGTH,
    Progress,
    no_progress,
    staged,
)
from ..storage import Storage, join
from ..storage.csv_blocks import Block, Quoted, blocks
from ..storage.documents import RowWriter, csv_field, field_end, raw_rows, read_json, read_rows, write_json
from ..storage.row_text import gather, join_rows

CHUNKS = "inspect/chunks.json"
TODO_FIELDS = ("number", "filename", "label", "num_bytes", "stamp")
DONE_FIELDS = ("number", "label", *INSPECTION_FIELDS)
REASON = DONE_FIELDS.index("reason")
REJECT_COLUMNS = [DONE_FIELDS.index(name) for name in REJECTS_FIELDS]
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
    with tempfile.TemporaryDirectory() as tmp:
        joined = None if why_not else carried_inspections(storage, base, staged(cfg, DISCOVERED), tmp)
        chunks, files, num_bytes, carried = _plan_from_columns(cfg, storage, *joined, max_chunks) if joined else \
            _plan_from_rows(cfg, storage, None if why_not else base, tmp, max_chunks)
    plan = {"chunks": chunks, "files_to_read": files, "bytes_to_read": num_bytes, "files_reused": carried,
            "base_version": base.version if base else None, "not_reused_because": why_not}
    write_json(storage, staged(cfg, CHUNKS), plan)
    return {"chunks": len(chunks), "files_to_read": files, "bytes_to_read": num_bytes, "files_reused": carried}


class _Chunks:
    """The files to read, cut into chunks of at most ``max_files`` files and ``max_bytes`` bytes (``todo`` tables)."""

    def __init__(self, cfg: BuildConfig, storage: Storage, max_files: int, max_bytes: int) -> None:
        self.cfg, self.storage, self.max_files, self.max_bytes = cfg, storage, max_files, max_bytes
        self.chunks: list[dict[str, int]] = []
        self._todo: RowWriter | None = None

    def add(self, row: dict[str, Any], size: int) -> None:
        chunks = self.chunks
        if self._todo is None or chunks[-1]["files"] >= self.max_files or \
                (chunks[-1]["bytes"] + size > self.max_bytes and chunks[-1]["files"]):
            if self._todo is not None:
                self._todo.close()
            self._todo = RowWriter(self.storage, staged(self.cfg, _todo(len(chunks))), TODO_FIELDS)
            chunks.append({"files": 0, "bytes": 0})
        self._todo.write(row)
        chunks[-1]["files"] += 1
        chunks[-1]["bytes"] += size

    def close(self) -> list[dict[str, int]]:
        if self._todo is not None:
            self._todo.close()
        else:  # nothing to read: one empty chunk
            RowWriter(self.storage, staged(self.cfg, _todo(0)), TODO_FIELDS).close()
            self.chunks.append({"files": 0, "bytes": 0})
        return self.chunks


def _plan_from_columns(cfg: BuildConfig, storage: Storage, found: Any, sizes: Any, base_path: str, max_chunks: int
                       ) -> tuple[list[dict[str, int]], int, int, int]:
    """``plan_inspection``'s tables from the join read as columns (``carried_inspections``: where the base's
    inspection of each discovered file is in ``base_path``, or -1, and each file's size): the carried rows are the
    base's rows as they are, cut from its mapped file. Returns the chunks, the files and bytes to read and the
    files carried."""
    import numpy as np

    unread = found < 0
    files, num_bytes = int(unread.sum()), int(sizes[unread].sum())
    todo = _Chunks(cfg, storage, *chunk_limits(cfg, files, num_bytes, max_chunks))
    with RowWriter(storage, staged(cfg, CARRIED), DONE_FIELDS) as carried, open(base_path, "rb") as f, \
            (mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if os.fstat(f.fileno()).st_size else
             contextlib.nullcontext(b"")) as base, \
            blocks(storage, staged(cfg, DISCOVERED), ",".join(DISCOVERED_FIELDS)) as parts:
        first = 0
        for part in parts:
            where = found[first:first + len(part)]
            rows, at = np.flatnonzero(where >= 0), where[where >= 0]
            text, _ = join_rows(len(rows), [(first + rows,), (part.data, part.starts[rows, 1], part.stops[rows, 1]),
                                            (base, at >> 32, (at >> 32) + (at & 0xFFFFFFFF))])  # number, label, row
            carried.write_text(text, len(rows))
            labels, names, stamps = part.column(1), part.column(0), part.column(3)
            for i in np.flatnonzero(where < 0).tolist():
                todo.add({"number": first + i, "filename": names[i].decode("utf-8", "surrogateescape"),
                          "label": labels[i].decode("utf-8", "surrogateescape"), "num_bytes": int(sizes[first + i]),
                          "stamp": stamps[i].decode()}, int(sizes[first + i]))
            first += len(part)
    return todo.close(), files, num_bytes, carried.count


def _plan_from_rows(cfg: BuildConfig, storage: Storage, base: Any, tmp: str, max_chunks: int
                    ) -> tuple[list[dict[str, int]], int, int, int]:
    """``_plan_from_columns`` row by row (``inspections``: a table with a quoted field, or no base to join)."""
    with inspections(storage, base, staged(cfg, DISCOVERED), tmp) as known:
        files = num_bytes = 0
        for row in known.unread():  # first pass: how much there is to read
            files += 1
            num_bytes += int(row["num_bytes"])
        todo = _Chunks(cfg, storage, *chunk_limits(cfg, files, num_bytes, max_chunks))
        with RowWriter(storage, staged(cfg, CARRIED), DONE_FIELDS) as carried:
            labels: dict[str, str] = {}  # class name -> its CSV field
            for number, (values, before) in enumerate(known.all()):
                if before is not None:  # matched on name, size and stamp: the row as inspection wrote it
                    label = labels.get(values[1]) or labels.setdefault(values[1], csv_field(values[1]))
                    carried.write_line(f"{number},{label},{before}\n")
                    continue
                row = dict(zip(DISCOVERED_FIELDS, values, strict=True))
                todo.add({**row, "number": number}, int(row["num_bytes"]))
    return todo.close(), files, num_bytes, carried.count


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


def _numbered(header: str, texts: Iterator[str]) -> Iterator[tuple[int, str]]:
    """The rows of a ``DONE_FIELDS`` table (``raw_rows``) as ``(number, text)``: rows are copied on as text,
    as this runs over every file."""
    if header != ",".join(DONE_FIELDS):
        raise BuildError(f"an inspection table has columns {header!r}, expected {','.join(DONE_FIELDS)}")
    for text in texts:
        yield int(text[:text.index(",")]), text


def _merged(carried: Iterator[tuple[int, str]], fresh: Iterator[tuple[int, str]]) -> Iterator[str]:
    """The texts of two ``_numbered`` streams, each in number order, in number order: a night carries most
    rows and reads a few, so each carried row costs one comparison."""
    pending = next(fresh, None)
    for number, text in carried:
        while pending is not None and pending[0] < number:
            yield pending[1]
            pending = next(fresh, None)
        yield text
    while pending is not None:
        yield pending[1]
        pending = next(fresh, None)


def _merge_blocks(carried: Iterator[Block], fresh: Iterator[tuple[int, str]], one: Callable[[str], None],
                  good: RowWriter, inspection: RowWriter) -> None:
    """``_merged`` with the carried rows read as columns: each run of carried images (all but a few rows of a
    night) goes to ``good`` (from its label on) and ``inspection`` (from its name on) as slices of its block;
    the chunks' rows and the carried rejects go to ``one``, in number order."""
    import numpy as np

    pending = next(fresh, None)
    for part in carried:
        numbers = part.integers(0)
        image = (part.starts[:, -1] == part.stops[:, -1]) & (part.starts[:, -2] == part.stops[:, -2])
        others = [*np.flatnonzero(~image).tolist(), len(part)]  # carried rejects (parsed, one by one), then the end
        data, at, count, other = part.data, 0, len(part), 0
        ends = part.stops[:, -1] + 1
        while at < count:
            stop = others[other]
            if pending is not None:  # a fresh row goes before the first carried row with a higher number
                stop = min(stop, int(np.searchsorted(numbers, pending[0])))
            if stop > at:
                good.write_text(gather(data, part.starts[at:stop, 1], ends[at:stop]), stop - at)
                inspection.write_text(gather(data, part.starts[at:stop, 2], ends[at:stop]), stop - at)
                at = stop
                continue
            if pending is not None and pending[0] < numbers[at]:
                one(pending[1])
                pending = next(fresh, None)
            else:
                other += 1
                one(data[int(part.starts[at, 0]):int(ends[at]) - 1].decode("utf-8", "surrogateescape"))
                at += 1
    while pending is not None:
        one(pending[1])
        pending = next(fresh, None)


@summarized
def gather_inspection(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Merge the carried and the chunks' rows, in listing order, into ``images.csv``, the inspection
    rejects and ``inspected.csv``; stage the inspection summary."""
    plan = read_json(storage, staged(cfg, CHUNKS))
    missing = [c for c in range(len(plan["chunks"])) if not storage.exists(staged(cfg, _done(c)))]
    if missing:
        raise BuildError(f"inspection chunk(s) {', '.join(str(c + 1) for c in missing[:10])} of "
                         f"{len(plan['chunks'])} were not inspected")

    def fresh() -> Iterator[tuple[int, str]]:  # the chunks' rows, one file open at a time
        for chunk in range(len(plan["chunks"])):
            with raw_rows(storage, staged(cfg, _done(chunk))) as (header, texts):
                yield from _numbered(header, texts)

    with ExitStack() as stack:
        good = stack.enter_context(RowWriter(storage, staged(cfg, IMAGES), IMAGE_FIELDS))
        rejects = stack.enter_context(RowWriter(storage, staged(cfg, INSPECT_REJECTS), REJECTS_FIELDS))
        inspection = stack.enter_context(RowWriter(storage, staged(cfg, INSPECTED), INSPECTION_FIELDS))

        def one(text: str) -> None:  # a row of either table, as its text
            row = text[text.index(",") + 1:]  # label, then INSPECTION_FIELDS: an images.csv row as it is
            if text.endswith(",,"):  # no reason, no detail: an image
                good.write_line(row + "\n")
                inspection.write_line(row[field_end(row) + 1:] + "\n")
            else:  # a reject: parse it
                values = next(csv.reader([text]))
                rejects.write_values([values[i] for i in REJECT_COLUMNS])
                inspection.write_values(values[2:])

        try:
            carried_blocks = stack.enter_context(blocks(storage, staged(cfg, CARRIED), ",".join(DONE_FIELDS)))
        except Quoted:  # row by row
            for text in _merged(_numbered(*stack.enter_context(raw_rows(storage, staged(cfg, CARRIED)))), fresh()):
                one(text)
        else:
            _merge_blocks(carried_blocks, fresh(), one, good, inspection)
    summary = {"inspected": good.count, "rejected": rejects.count, "files_read": plan["files_to_read"],
               "bytes_read": plan["bytes_to_read"], "files_reused": plan["files_reused"],
               "base_version": plan["base_version"], "not_reused_because": plan["not_reused_because"],
               "chunks": len(plan["chunks"])}
    write_json(storage, staged(cfg, INSPECT_SUMMARY), summary)
    return {key: summary[key] for key in ("inspected", "rejected", "files_read", "files_reused")}


def inspect_stage(cfg: BuildConfig, storage: Storage, workers: int = 4, progress: Progress = no_progress,
                  processes: Executor | None = None) -> dict[str, Any]:
    """Plan, inspect every chunk and gather (the command line's inspection)."""
    planned = plan_inspection(cfg, storage)
    progress(planned["files_reused"])
    inspect_chunks(cfg, storage, range(planned["chunks"]), workers, processes, progress)
    return gather_inspection(cfg, storage)
