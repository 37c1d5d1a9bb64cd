"""What every section of the benchmark shares: measuring a command (wall time, peak RSS), the cached
corpora, the machine line."""

from __future__ import annotations

import concurrent.futures
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from bench import make_corpus as corpus_maker

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


@dataclass
class Run:
    seconds: float
    rss_mb: float
    stdout: str = ""


def _hwm_mb(pid: int) -> float:
    """VmHWM (peak resident set) of one live process, in MB; 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), 0.0)
    except OSError:
        return 0.0


class PeakSampler(threading.Thread):
    """Samples the VmHWM of a process and its descendants every ``interval`` seconds (from its start).

    Not ``wait4``'s ``ru_maxrss``: that counts the parent's memory copied at fork (before exec),
    so every small child of a large harness would look as large as the harness. VmHWM is the kernel's
    high-water mark, so a sample every 0.1 s misses only a process that lives less than that; listing the
    descendants costs about 2.5 ms, which every 20 ms took 13% of a core from the build measured.
    """

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        super().__init__(daemon=True)
        self.pid, self.interval, self.peak = pid, interval, 0.0
        self.done = threading.Event()

    def run(self) -> None:
        while True:
            try:
                pids = [self.pid] + [c.pid for c in psutil.Process(self.pid).children(recursive=True)]
            except psutil.Error:
                pids = [self.pid]
            self.peak = max([self.peak] + [_hwm_mb(pid) for pid in pids])
            if self.done.wait(self.interval):
                return


def measure(cmd: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> Run:
    """Run ``cmd``; wall seconds and the peak RSS of its largest process (children included, sampled)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=out, stderr=err)
        sampler = PeakSampler(proc.pid)
        sampler.start()
        proc.wait()
        seconds = time.perf_counter() - started
        sampler.done.set()
        sampler.join()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-3000:]}")
    return Run(seconds, sampler.peak, stdout + stderr)


def compile_package() -> None:
    """Write the package's bytecode once, so that every timed run measures the build, not Python compiling
    its modules: ``pip install`` compiles them, and a clone writes them on its first import, unless
    ``PYTHONDONTWRITEBYTECODE`` is set (as on the machine the benchmarks ran on)."""
    import compileall

    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "include"), quiet=1)


# -- corpora ---------------------------------------------------------------------------------------
def make_corpus(images: int, work: Path, parts: int = 1, synthetic: bool = False, seed: int = 0) -> tuple[Path, str]:
    """The make_corpus.py corpus of ``images`` images (cached) and where its pixels came from.

    Debian's photos unless ``synthetic`` or they cannot be had (a corpus of synthetic photos has a
    name of its own, so a cached one is never taken for a real one); big ones are made in ``parts``
    processes with seeds 1..parts and merged by hard links (file names are random, so they do not
    collide). A ``seed`` other than 0 (one process only) gives other images, cached under a name of
    their own."""
    if seed and parts > 1:
        raise ValueError("a seed of its own is for a corpus made in one process")
    work = work.resolve()
    target = work / (f"corpus-{images}" + (f"-seed{seed}" if seed else ""))
    # a cached photo corpus needs no photos at hand; otherwise they are fetched once, before any worker
    synthetic = synthetic or not ((target / ".complete").exists() or corpus_maker.debian_photos())
    if synthetic:
        target = target.with_name(target.name + "-synthetic")
    done = target / ".complete"
    if done.exists():
        return target, done.read_text().strip() or "not recorded (made before the source was)"
    shutil.rmtree(target, ignore_errors=True)
    if parts <= 1:
        _, _, source = corpus_maker.make_corpus(str(target), images, seed=seed, synthetic=synthetic)
    else:
        pieces = [work / f"corpus-{images}.part{i}" for i in range(parts)]
        with concurrent.futures.ProcessPoolExecutor(parts) as pool:
            jobs = [pool.submit(corpus_maker.make_corpus, str(piece), images // parts, seed=i + 1,
                                synthetic=synthetic) for i, piece in enumerate(pieces)]
            results = [job.result() for job in jobs]  # every part, so a failure in any raises
        source = results[0][2]
        for piece in pieces:
            for path in piece.rglob("*"):
                if path.is_file():
                    dest = target / path.relative_to(piece)
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    os.link(path, dest)
            shutil.rmtree(piece)
    done.write_text(source + "\n")
    print(f"  {corpus_facts(target)[0]} images in {target} (pixels: {source})", flush=True)
    return target, source


def corpus_facts(corpus: Path) -> tuple[int, int]:
    files = [p for p in corpus.rglob("*") if p.is_file() and not p.name.startswith(".")]
    return len(files), sum(p.stat().st_size for p in files)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor() or "unknown CPU")
    mem = next((int(line.split()[1]) // 1024 // 1024 for line in Path("/proc/meminfo").read_text().splitlines()
                if line.startswith("MemTotal")), 0)
    return (f"{os.cpu_count()} CPUs ({cpu}), {mem} GiB RAM, {platform.system()} {platform.release()}, "
            f"Python {platform.python_version()}; {signals_build()}; corpora on the local disk (page cache warm after "
            "the first round)")


def signals_build() -> str:
    """Whether the builds measured compute image signals in compiled code (``_thumbstats``, which ``make install``
    builds) or in the numpy fallback: a checkout whose extension was never built inspects images slower (at
    6,000 images a full build took 4.35 s against 3.65-4.0 s), and its figures are not ``make bench``'s."""
    from image_tfrecords.images import thumbnail

    return "image signals compiled (`_thumbstats`)" if thumbnail._thumbstats is not None else \
        "image signals in the numpy fallback (`_thumbstats` not built: `make install` builds it)"


def preamble(command: str) -> list[str]:
    return ["# Benchmarks", "", f"Made by `{command}` on {time.strftime('%Y-%m-%d', time.gmtime())}.",
            f"Machine: {machine()}.", ""]


STAGES_LINE = re.compile(r"^\s*stages: (.+)$", re.M)


def stage_seconds(output: str) -> dict[str, float]:
    """The CLI summary's ``stages: discover 0.10 s, inspect 9.30 s, ...`` line as a dict."""
    found = STAGES_LINE.search(output)
    if not found:
        return {}
    return {name: float(seconds) for name, seconds in
            (part.strip().rsplit(" ", 2)[:2] for part in found.group(1).split(","))}
