"""Ordered, bounded parallel maps (never more than a window of results in flight), and the process
pools of the command line and of DAG tasks."""

from __future__ import annotations

import contextlib
import importlib
import itertools
import multiprocessing
import os
import signal
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int, window: int | None = None) -> Iterator[R]:
    """Like ``map(fn, items)`` on ``workers`` threads, results in input order.

    At most ``window`` (default ``4 * workers``) items are submitted ahead of the consumer, so
    memory stays bounded however long ``items`` is.
    """
    if workers <= 1:
        yield from map(fn, items)
        return
    window = window or 4 * workers
    pending: deque[Future[R]] = deque()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            for item in items:
                pending.append(pool.submit(fn, item))
                if len(pending) >= window:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def preload(*modules: str) -> None:
    """Import ``modules`` here before a pool forks its workers (on its first task): forked workers share
    them instead of importing each its own (numpy and Pillow cost about 0.1 s of CPU a process)."""
    for name in modules:
        importlib.import_module(name)


def forked(executor: Executor) -> bool:
    """Whether ``executor`` is a process pool whose workers are started (a forked pool starts them all at its
    first task): ``preload`` is too late then, and each worker imports what it needs itself."""
    return bool(getattr(executor, "_processes", None))


_io_pool: tuple[int, ThreadPoolExecutor] | None = None  # this process's reading threads (by pid: never forked)


def io_threads(uri: str) -> int:
    """Reads in flight per process for per-item work whose input is below ``uri``: on S3, where a read mostly
    waits for its answer, ``IMAGE_TFRECORDS_S3_CONCURRENCY`` (default 16); 1 on a local disk (the cores are
    the limit)."""
    from .storage.s3_reads import concurrency

    return concurrency() if uri.startswith("s3://") else 1


def _apply(fn: Callable[..., R], batch: list[T], fetch: Callable[[T], Any] | None = None, threads: int = 1
           ) -> list[R]:
    """``fn(item)`` of each item of ``batch``, in order; with ``fetch``, ``fn(item, fetch(item))``, the fetches
    run ahead on ``threads`` threads of this process (the I/O overlaps; ``fn``'s work stays on this thread)."""
    global _io_pool
    if fetch is None:
        return [fn(item) for item in batch]
    if threads <= 1 or len(batch) <= 1:
        return [fn(item, fetch(item)) for item in batch]
    if _io_pool is None or _io_pool[0] != os.getpid():
        _io_pool = (os.getpid(), ThreadPoolExecutor(max_workers=threads, thread_name_prefix="io"))
    fetched = [_io_pool[1].submit(fetch, item) for item in batch[:threads]]
    results = []
    for index, item in enumerate(batch):
        if index + threads < len(batch):
            fetched.append(_io_pool[1].submit(fetch, batch[index + threads]))
        results.append(fn(item, fetched[index].result()))
    return results


def batched_map(fn: Callable[..., R], items: Iterable[T], executor: Executor, workers: int,
                batch: int = 64, total: int | None = None, fetch: Callable[[T], Any] | None = None,
                threads: int = 1) -> Iterator[R]:
    """Like ``map(fn, items)`` on ``executor`` (e.g. a process pool), ``batch`` items per call, in order.

    Batching keeps the per-item cost of pickling and scheduling small; at most ``2 * workers``
    batches are in flight, so memory stays bounded. Given the ``total`` number of items, batches are
    made smaller where that spreads a short input over every worker, about 8 batches each (63 files in
    one batch of 64 would keep one process busy and the others idle; and items cost unequal times: a
    large PNG takes 20 times a JPEG to inspect, so a few large batches end unevenly). With ``fetch``, each
    item's input is fetched ahead, at most ``threads`` at a time per process (see ``_apply``).
    """
    if total is not None:
        batch = max(1, min(batch, -(-total // (8 * workers))))
    pending: deque[Future[list[R]]] = deque()
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, batch)):
        pending.append(executor.submit(_apply, fn, chunk) if fetch is None else
                       executor.submit(_apply, fn, chunk, fetch, threads))
        if len(pending) >= 2 * workers:
            yield from pending.popleft().result()
    while pending:
        yield from pending.popleft().result()


def _worker_init(parent: int) -> None:
    """In each worker: die with the parent (even on SIGKILL), leave Ctrl-C to the parent, die on SIGTERM."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    with contextlib.suppress(Exception):  # Linux only
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


@contextlib.contextmanager
def process_pool(workers: int, start_now: tuple[str, ...] | None = None) -> Iterator[Executor | None]:
    """A pool of ``workers`` forked processes (None for one: run inline) that never outlive their parent.

    Forked, not ``forkserver`` or ``spawn``: those re-run the parent's main script in each worker,
    which for an Airflow task is the ``airflow`` command itself. With ``start_now``, those modules are imported
    (``preload``) and the workers forked at once, before the parent does anything else: obstore, which reads S3,
    cannot be used in a process forked after its parent used it (``storage.s3_reads``).
    """
    if workers <= 1:
        yield None
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_init, initargs=(os.getpid(),))
    if start_now is not None:
        preload(*start_now)
        pool.submit(os.getpid).result()  # a forked pool starts every worker at its first task
    try:
        yield pool
    except BaseException:
        processes = list((getattr(pool, "_processes", None) or {}).values())
        results = getattr(pool, "_result_queue", None)  # shutdown() drops it
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        for process in processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)
        # A worker killed while sending a result (a batch of records is large) leaves the pool's reader
        # thread waiting for bytes no one will write, and the interpreter's exit waiting for that thread.
        # With every worker gone, closing our end of the result pipe makes that read end (EOF).
        with contextlib.suppress(Exception):
            results._writer.close()  # type: ignore[union-attr]
        raise
    pool.shutdown(wait=True)


TASK_PROCESSES_ENV = "IMAGE_TFRECORDS_TASK_PROCESSES"
MIN_ITEMS_FOR_PROCESSES = 64  # fewer images than this: threads (starting processes would cost more)


def task_processes() -> int:
    """How many processes one DAG task's per-image work uses: ``IMAGE_TFRECORDS_TASK_PROCESSES``, else the
    machine's cores, at most 8 (several tasks share a machine; 1 means threads in the task's process)."""
    value = os.environ.get(TASK_PROCESSES_ENV, "")
    try:
        return max(1, int(value)) if value.strip() else max(1, min(8, os.cpu_count() or 1))
    except ValueError:
        raise ValueError(f"{TASK_PROCESSES_ENV} must be a whole number, not {value!r}") from None


@contextlib.contextmanager
def task_pool(items: int) -> Iterator[Executor | None]:
    """The process pool of one DAG task with ``items`` images to handle (None: use threads).

    Its workers are forked from the task's process (Airflow 3 runs each task in a process of its
    own, which the workers die with); they take a pickled ``Storage``, which makes its own S3 client.
    """
    workers = task_processes() if items >= MIN_ITEMS_FOR_PROCESSES else 1
    with process_pool(min(workers, items)) as pool:
        yield pool
