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
from typing import TypeVar

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


def _apply(fn: Callable[[T], R], batch: list[T]) -> list[R]:
    return [fn(item) for item in batch]


def batched_map(fn: Callable[[T], R], items: Iterable[T], executor: Executor, workers: int,
                batch: int = 64, total: int | None = None) -> Iterator[R]:
    """Like ``map(fn, items)`` on ``executor`` (e.g. a process pool), ``batch`` items per call, in order.

    Batching keeps the per-item cost of pickling and scheduling small; at most ``2 * workers``
    batches are in flight, so memory stays bounded. Given the ``total`` number of items, batches are
    made smaller where that spreads a short input over every worker, about 8 batches each (63 files in
    one batch of 64 would keep one process busy and the others idle; and items cost unequal times: a
    large PNG takes 20 times a JPEG to inspect, so a few large batches end unevenly).
    """
    if total is not None:
        batch = max(1, min(batch, -(-total // (8 * workers))))
    pending: deque[Future[list[R]]] = deque()
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, batch)):
        pending.append(executor.submit(_apply, fn, chunk))
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
def process_pool(workers: int) -> Iterator[Executor | None]:
    """A pool of ``workers`` forked processes (None for one: run inline) that never outlive their parent.

    Forked, not ``forkserver`` or ``spawn``: those re-run the parent's main script in each worker,
    which for an Airflow task is the ``airflow`` command itself.
    """
    if workers <= 1:
        yield None
        return
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("fork"),
                               initializer=_worker_init, initargs=(os.getpid(),))
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
