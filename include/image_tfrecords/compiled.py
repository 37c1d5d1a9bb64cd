"""The package's compiled parts (pyproject.toml's ext-modules): which ones this process runs, in one line.

Each is optional when the package is built (no C compiler: the same answers in Python, slower), so a build
says which ran: the command line's summary and every DAG task's log carry ``line()``. On Linux with a C
compiler, ``make install`` builds them all and a test fails if one is missing (tests/project/test_compiled_parts.py).
"""

from __future__ import annotations

import functools
import importlib

# name -> (module, what runs in Python without it)
PARTS: dict[str, tuple[str, str]] = {
    "_thumbstats": ("image_tfrecords.images._thumbstats", "inspection's thumbnail sums in numpy"),
    "_lstat": ("image_tfrecords.source._lstat", "a local listing's lstat calls one at a time"),
}


@functools.cache
def missing() -> dict[str, str]:
    """The parts that do not import here: name -> why (the ImportError)."""
    why = {}
    for name, (module, _) in PARTS.items():
        try:
            importlib.import_module(module)
        except ImportError as exc:
            why[name] = str(exc) or type(exc).__name__
    return why


def line() -> str:
    """One line: the compiled parts in use, and each missing one with what runs instead."""
    absent = missing()
    used = [name for name in PARTS if name not in absent]
    text = f"compiled parts in use: {', '.join(used) or 'none'}"
    if absent:
        text += "; missing (Python fallbacks, slower; reinstall with a C compiler): " + ", ".join(
            f"{name} ({PARTS[name][1]})" for name in absent)
    return text
