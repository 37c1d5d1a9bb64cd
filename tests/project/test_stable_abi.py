"""Every C extension of the package also builds against CPython's stable ABI (``-DPy_LIMITED_API``, a ``.abi3.so``
that any CPython from 3.11 loads): how the compiled parts travel to a machine with another Python, such as the one
the 16-core benchmark ran on (docs/development.md). A macro of the full API (``PyList_GET_ITEM``) in a C file
compiles there as an undeclared function, and the module fails to import, so its Python fallback runs unnoticed."""

from __future__ import annotations

import shutil
import subprocess
import sysconfig
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIMITED_API = "0x030b0000"  # 3.11, the oldest Python the package supports


def _sources() -> list[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return [source for module in project["tool"]["setuptools"]["ext-modules"] for source in module["sources"]]


def test_the_extensions_are_listed() -> None:
    assert {Path(source).name for source in _sources()} >= {"_thumbstats.c", "_lstat.c"}


@pytest.mark.parametrize("source", _sources(), ids=lambda source: Path(source).name)
def test_it_compiles_for_the_stable_abi(source: str, tmp_path: Path) -> None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    include = sysconfig.get_paths()["include"]
    if compiler is None or not (Path(include) / "Python.h").exists():
        pytest.skip("no C compiler or no Python headers here")
    built = tmp_path / (Path(source).stem + ".abi3.so")
    done = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O0", f"-DPy_LIMITED_API={LIMITED_API}", f"-I{include}",
         "-Werror=implicit-function-declaration", "-Werror=int-conversion", "-Werror=incompatible-pointer-types",
         str(ROOT / source), "-o", str(built)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
