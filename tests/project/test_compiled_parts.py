"""The compiled parts are built and used where they can be: on Linux with a C compiler this test cannot skip,
so CI fails when ``make install`` left one out (each part is optional in pyproject.toml: a build without a
compiler falls back to Python, which would otherwise pass every other test, only slower)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig

import pytest

from image_tfrecords import compiled


def _compiler() -> str | None:
    name = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(name)


def test_every_compiled_part_is_built_where_a_compiler_is() -> None:
    if not (sys.platform == "linux" and _compiler()):
        pytest.skip("not Linux with a C compiler: the parts may be missing, and the build line says so")
    assert compiled.missing() == {}, compiled.line()
    assert compiled.line() == f"compiled parts in use: {', '.join(compiled.PARTS)}"


def test_a_missing_part_is_named_with_its_fallback() -> None:
    """In a process where one part cannot import, the line names it and what runs instead."""
    module = compiled.PARTS["_lstat"][0]
    code = (f"import sys; sys.modules[{module!r}] = None\n"
            "from image_tfrecords import compiled; print(compiled.line())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert "missing (Python fallbacks, slower; reinstall with a C compiler): _lstat (a local listing's lstat " \
           "calls one at a time)" in result.stdout, result.stdout
    assert result.stdout.startswith("compiled parts in use: ") and "_lstat," not in result.stdout.split(";")[0]
