"""Progress lines for the task log: done/total, rate and ETA at most every ``interval`` seconds, then
one summary line.

An Airflow user watches the task log, not a terminal: every stage whose work grows with the data
logs through ``ProgressLog`` (logger ``image_tfrecords``, which Airflow routes to the task log; the
command line shows bars instead, or these lines with ``--no-progress`` off a terminal)::

    inspect chunk 3/12: 1200/2000 images (60%), 85.3/s, ETA 9s
    inspect chunk 3/12: 2000 images in 23.4 s (85.5/s)
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar

log = logging.getLogger("image_tfrecords")

INTERVAL_SECONDS = 15.0


def _duration(seconds: float) -> str:
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole // 60 % 60:02d}m"


class ProgressLog:
    """A ``Progress`` callback (``done(n)``) that logs ``what``'s progress over ``total`` ``unit``.

    Use as a context manager: the summary line is logged on a clean exit. ``clock`` is injectable
    for tests.
    """

    def __init__(self, what: str, total: int, unit: str = "images", interval: float = INTERVAL_SECONDS,
                 logger: logging.Logger = log, clock: Callable[[], float] = time.monotonic) -> None:
        self.what, self.total, self.unit, self.interval = what, total, unit, interval
        self.done = 0
        self._log, self._clock = logger, clock
        self._start = self._last = clock()

    def __call__(self, count: int = 1) -> None:
        self.done += count
        now = self._clock()
        if now - self._last >= self.interval and self.done < self.total:
            self._last = now
            self._log.info("%s", self.line(now))

    def line(self, now: float | None = None) -> str:
        """The progress line as of ``now``."""
        elapsed = max((self._clock() if now is None else now) - self._start, 1e-9)
        rate = self.done / elapsed
        share = f" ({100 * self.done / self.total:.0f}%)" if self.total else ""
        eta = f", ETA {_duration((self.total - self.done) / rate)}" if rate > 0 and self.total > self.done else ""
        return f"{self.what}: {self.done}/{self.total} {self.unit}{share}, {rate:.1f}/s{eta}"

    def summary(self) -> str:
        elapsed = self._clock() - self._start
        return f"{self.what}: {self.done} {self.unit} in {elapsed:.1f} s ({self.done / max(elapsed, 1e-9):.1f}/s)"

    def __enter__(self) -> ProgressLog:
        self._log.info("%s: %d %s to do", self.what, self.total, self.unit)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if kind is None:
            self._log.info("%s", self.summary())
        else:
            self._log.info("%s: stopped at %d/%d %s (%s)", self.what, self.done, self.total, self.unit, kind.__name__)


def _brief(result: Any) -> str:
    """A stage's small result as ``key=value`` pairs (scalars only), at most ~300 characters."""
    if not isinstance(result, dict):
        return ""
    text = ", ".join(f"{k}={v}" for k, v in result.items() if isinstance(v, str | int | float | bool) and v != "")
    return text if len(text) <= 300 else text[:297] + "..."


F = TypeVar("F", bound=Callable[..., Any])


def summarized(stage: F) -> F:
    """Log one summary line when ``stage`` returns: ``split: done in 0.4 s (num_records=..., ...)``."""

    @functools.wraps(stage)
    def run(*args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        result = stage(*args, **kwargs)
        log.info("%s: done in %.1f s (%s)", stage.__name__.removesuffix("_stage"), time.monotonic() - started,
                 _brief(result))
        return result

    return run  # type: ignore[return-value]
