"""Ordered, bounded parallel map: never more than a window of results in flight."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def ordered_map(fn: Callable[[T], R], items: Iterable[T], workers: int,
                executor: Executor | None = None, window: int | None = None) -> Iterator[R]:
    """Like ``map(fn, items)`` on ``workers`` threads (or ``executor``), results in input order.

    At most ``window`` (default ``4 * workers``) items are submitted ahead of the consumer, so
    memory stays bounded however long ``items`` is.
    """
    if workers <= 1 and executor is None:
        yield from map(fn, items)
        return
    window = window or 4 * max(1, workers)
    own = executor is None
    pool = executor or ThreadPoolExecutor(max_workers=workers)
    pending: deque[Future[R]] = deque()
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
        if own:
            pool.shutdown(wait=True, cancel_futures=True)
