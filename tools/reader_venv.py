"""Fresh virtual environments for the readers: what ``tests/readers/test_readers_from_pip.py`` installs the
project into, and the one ``bench/readers.py`` measures in (PyTorch, Grain and ``tfrecord``, which the dev
venv does not have).

Made from the base interpreter (not the dev venv), installed by one pip call constrained to the pins of
requirements-dev.txt. torch: PyPI's Linux wheel of torch is a CUDA build that pulls GBs of nvidia-*
wheels. This machine's pip (find-links /opt/wheels, extra local indexes) has a CPU-only build, torch
2.13.0+cpu (~190 MB, no nvidia dependencies), which is what ``TORCH`` pins. The torch 2.14.1 of the local
index is the CUDA build: it requires cuda-toolkit, nvidia-cudnn-cu13, triton, ... and made the install a
7.7 GB, 4-minute affair. Elsewhere, point pip at a CPU build and set IMAGE_TFRECORDS_TEST_TORCH, e.g.
PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu with IMAGE_TFRECORDS_TEST_TORCH="torch==2.13.0+cpu".
(torchvision is not installed: PyPI's wheel is built against CUDA torch and does not load beside a CPU build,
so the readers decode with Pillow.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOCK = ROOT / "requirements-dev.txt"
TORCH = os.environ.get("IMAGE_TFRECORDS_TEST_TORCH", "torch==2.13.0+cpu")
GRAIN = "grain==0.2.18"
RUN_TIMEOUT = 300
INSTALL_TIMEOUT = 15 * 60
_NOISE = "is ignored: it is neither a file nor a directory"  # pip's complaint about local indexes


@dataclass(frozen=True)
class Venv:
    root: Path
    python: str
    work: Path  # the working folder of every command (not the checkout: nothing imports from it)
    env: dict[str, str]

    def run(self, args: list[str], timeout: int = RUN_TIMEOUT) -> subprocess.CompletedProcess[str]:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=self.env, cwd=self.work)

    def pip_install(self, requirements: list[str], constraints: Path | None,
                    timeout: int = INSTALL_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """One ``pip install`` of ``requirements`` (constrained by ``constraints``, if any)."""
        command = [self.python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--quiet"]
        if constraints:
            command += ["-c", str(constraints)]
        return self.run(command + requirements, timeout=timeout)


def make_venv(root: Path, work: Path) -> Venv:
    """A new virtual environment at ``root`` (from the base interpreter) whose commands run in ``work``."""
    root, work = root.resolve(), work.resolve()
    base = getattr(sys, "_base_executable", sys.executable)  # sys.executable may be the dev venv's
    subprocess.run([base, "-m", "venv", str(root)], check=True, capture_output=True, timeout=300)
    return _venv(root, work)


def _venv(root: Path, work: Path) -> Venv:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    env.update(PATH=f"{root / 'bin'}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(root),
               TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="", PYTHONUNBUFFERED="1")
    work.mkdir(parents=True, exist_ok=True)
    return Venv(root, str(root / "bin" / "python"), work, env)


def plain_constraints(lock: Path, out: Path) -> Path | None:
    """``name==version`` lines of a lock file (following its ``-r``/``-c`` files), as a constraints file.

    requirements-dev.txt carries ``--hash`` entries; pip then wants hashes for everything it
    installs, which a project directory cannot have ("Can't verify hashes for these file://
    requirements because they point to directories"). Extras go too (pip refuses them in constraints).
    """
    if not lock.exists():
        return None
    pins: list[str] = []

    def read(path: Path) -> None:
        text = re.sub(r"\\\n", " ", path.read_text())  # join continuation lines
        for line in text.splitlines():
            line = re.sub(r"(^|\s)#.*", "", line).strip()
            include = re.match(r"(?:-r|-c|--requirement|--constraint)[\s=]+(\S+)", line)
            if include:
                read(path.parent / include.group(1))
            elif line and not line.startswith("-"):
                requirement = re.split(r"\s--?\w", line)[0].strip()
                requirement = re.sub(r"^([A-Za-z0-9._-]+)\[[^\]]*\]", r"\1", requirement)
                if "==" in requirement:
                    pins.append(requirement)

    read(lock)
    out.write_text("\n".join(dict.fromkeys(pins)) + "\n")
    return out


def snapshot_project(dest: Path) -> Path:
    """The files the wheel is built from, copied: building in the checkout would leave ``build/`` and
    ``include/image_tfrecords.egg-info`` there, and a copy cannot change half way through the build."""
    shutil.copytree(ROOT / "include", dest / "include",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    for path in [ROOT / "pyproject.toml", ROOT / "README.md", *ROOT.glob("LICEN[CS]E*")]:
        shutil.copy2(path, dest / path.name)
    return dest


def tail(proc: subprocess.CompletedProcess[str], lines: int = 60) -> str:
    """The last ``lines`` of a command's output, without pip's noise about local indexes."""
    out = [line for line in (proc.stdout + proc.stderr).splitlines() if _NOISE not in line]
    return "\n".join(out[-lines:])


def project_dependencies() -> list[str]:
    """The core dependencies of pyproject.toml (what ``import image_tfrecords.readers`` needs)."""
    import tomllib

    return list(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def cached_venv(root: Path, requirements: list[str]) -> Venv:
    """A venv at ``root`` with ``requirements`` installed, made once and reused while the requirements and
    the lock are the same (a stamp file records them); RuntimeError naming pip's output if it fails."""
    root = root.resolve()
    stamp = root / ".requirements"
    wanted = json.dumps({"requirements": requirements,
                         "lock": hashlib.sha256(LOCK.read_bytes()).hexdigest() if LOCK.exists() else ""})
    if stamp.exists() and stamp.read_text() == wanted and (root / "bin" / "python").exists():
        return _venv(root, root / "work")
    shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    venv = make_venv(root, root / "work")
    proc = venv.pip_install(requirements, plain_constraints(LOCK, root / "constraints.txt"))
    if proc.returncode:
        raise RuntimeError(f"pip install into {root} failed (exit {proc.returncode}):\n{tail(proc)}")
    stamp.write_text(wanted)
    return venv
