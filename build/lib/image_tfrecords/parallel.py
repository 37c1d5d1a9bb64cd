"""Ordered, bounded parallel map: never more than a window of results in flight."""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
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


def _apply(fn: Callable[[T], R], batch: list[T]) -> list[R]:
    return [fn(item) for item in batch]


def batched_map(fn: Callable[[T], R], items: Iterable[T], executor: Executor, workers: int,
                batch: int = 64) -> Iterator[R]:
    """Like ``map(fn, items)`` on ``executor`` (e.g. a process pool), ``batch`` items per call, in order.

    Batching keeps the per-item cost of pickling and scheduling small; at most ``2 * workers``
    batches are in flight, so memory stays bounded.
    """
    pending: deque[Future[list[R]]] = deque()
    iterator = iter(items)
    while chunk := list(itertools.islice(iterator, batch)):
        pending.append(executor.submit(_apply, fn, chunk))
        if len(pending) >= 2 * workers:
            yield from pending.popleft().result()
    while pending:
        yield from pending.popleft().result()
