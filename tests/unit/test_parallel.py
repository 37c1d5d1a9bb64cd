"""``parallel.batched_map``: order, bounded batches, and a short input spread over every worker; ``preload``."""

from __future__ import annotations

import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from image_tfrecords.parallel import batched_map, preload, process_pool


class CountingPool(ThreadPoolExecutor):
    """A thread pool that records the size of each batch submitted to it."""

    def __init__(self, workers: int) -> None:
        super().__init__(workers)
        self.batches: list[int] = []
        self._lock = threading.Lock()

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def, override]
        with self._lock:
            self.batches.append(len(args[-1]))
        return super().submit(fn, *args, **kwargs)


def test_results_come_in_input_order() -> None:
    with CountingPool(2) as pool:
        assert list(batched_map(lambda x: x * x, range(200), pool, 2)) == [x * x for x in range(200)]
        assert pool.batches == [64, 64, 64, 8]


def test_a_short_input_is_spread_over_every_worker() -> None:
    """63 files with batches of 64 would be one call: one process busy, the other idle; about 8 batches a
    worker even out files of unequal cost."""
    with CountingPool(2) as pool:
        assert list(batched_map(str, range(63), pool, 2, total=63)) == [str(x) for x in range(63)]
        assert pool.batches == [4] * 15 + [3]


def test_a_long_input_keeps_its_batch_size() -> None:
    with CountingPool(2) as pool:
        assert len(list(batched_map(str, range(1000), pool, 2, batch=32, total=1000))) == 1000
        assert set(pool.batches[:-1]) == {32}


def test_an_empty_input_submits_nothing() -> None:
    with CountingPool(2) as pool:
        assert list(batched_map(str, [], pool, 2, total=0)) == []
        assert pool.batches == []


def _loaded(name: str) -> bool:
    return name in sys.modules


def test_modules_preloaded_before_the_first_task_are_in_every_forked_worker() -> None:
    """``preload`` before the pool's first task: its workers are forked with the module already imported."""
    name = "xml.dom.minidom"  # imported by nothing of the project's or of pytest's
    sys.modules.pop(name, None)
    with process_pool(2) as pool:
        assert pool is not None
        preload(name)
        assert list(pool.map(_loaded, [name, name])) == [True, True]
    sys.modules.pop(name, None)
    with process_pool(2) as pool:
        assert pool is not None
        assert list(pool.map(_loaded, [name, name])) == [False, False]  # the test can fail: without it, not


def _fetch(x: int) -> tuple[int, str]:
    return x * 10, threading.current_thread().name


def _pair(x: int, fetched: tuple[int, str]) -> tuple[int, int, bool]:
    return x, fetched[0], fetched[1].startswith("io")


def test_fetches_run_ahead_on_threads_and_results_keep_their_order() -> None:
    with process_pool(2) as pool:
        got = list(batched_map(_pair, range(96), pool, 2, fetch=_fetch, threads=16))
    assert [(x, f) for x, f, _ in got] == [(x, x * 10) for x in range(96)]
    assert all(on_io_thread for *_, on_io_thread in got)  # fetched on the worker's reading threads
    with ThreadPoolExecutor(2) as pool:
        got = list(batched_map(_pair, range(40), pool, 2, fetch=_fetch, threads=1))
    assert [(x, f) for x, f, _ in got] == [(x, x * 10) for x in range(40)]
    assert not any(on_io_thread for *_, on_io_thread in got)  # one thread: fetched in turn
