"""Random-access readers (issue 26): records/s of one version read by ``RecordSource`` alone, through PyTorch's
DataLoader and Grain, against the ``tfrecord`` package's ``MultiTFRecordDataset`` and ``tf.data``
(``load_split``), with and without decoding, in one run.

The version is built here from the main table's corpus (``make_corpus``, reproducible). Each cell is one
process of ``bench/reader_rates.py`` (see it for how a rate is taken): the torch, Grain and ``tfrecord``
contenders in a venv of their own (``tools/reader_venv.py``: CPU torch, Grain, ``tfrecord``, the project's
dependencies; made once under the work folder, the checkout's ``include/`` on its path), ``tf.data`` in the
dev venv.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, corpus_facts, make_corpus

WORKERS = 2
SHARD_SIZE_MB = "16"
# (key, what is measured, reader_rates contender, DataLoader workers, the dev venv (True) or the reader venv)
ROWS = (
    ("source", "`RecordSource[i]` in a loop, one process", "source", 0, False),
    ("source-all", "the same, every field of the record (10)", "source-all-fields", 0, False),
    ("loader0", "`ImageDataset` + `DataLoader(shuffle=True)`, 0 workers", "loader", 0, False),
    ("loader2", f"`ImageDataset` + `DataLoader(shuffle=True)`, {WORKERS} workers", "loader", WORKERS, False),
    ("packed0", "`ImageDataset` + `DataLoader(shuffle=True, collate_fn=collate_bytes)`, 0 workers",
     "loader-packed", 0, False),
    ("packed2", f"`ImageDataset` + `DataLoader(shuffle=True, collate_fn=collate_bytes)`, {WORKERS} workers",
     "loader-packed", WORKERS, False),
    ("grain", "Grain `MapDataset.source(...).shuffle()`, 2 read threads", "grain", 0, False),
    ("tfrecord0", "`tfrecord` `MultiTFRecordDataset` + `DataLoader`, 0 workers", "tfrecord", 0, False),
    ("tfrecord2", f"`tfrecord` `MultiTFRecordDataset` + `DataLoader`, {WORKERS} workers", "tfrecord", WORKERS,
     False),
    ("tfrecord2-packed", f"the same with our `collate_bytes` (`key=\"image/encoded\"`), {WORKERS} workers",
     "tfrecord-packed", WORKERS, False),
    ("tf-data", "`tf.data`: `load_split(shuffle=1024, batch_size=64)`", "tf-data", 0, True),
    ("memory0", "reference: the records held in memory, `DataLoader`, 0 workers", "in-memory", 0, False),
    ("memory2", f"reference: the records held in memory, `DataLoader`, {WORKERS} workers", "in-memory", WORKERS,
     False),
    ("memory2-packed", f"reference: the same with `collate_bytes`, {WORKERS} workers", "in-memory-packed", WORKERS,
     False),
)
# records skipped, then timed (see reader_rates): without decoding, and with; and how many times (the median)
WINDOWS = {False: (384, 2048), True: (128, 768)}
ROUNDS = {False: 3, True: 3}


def reader_venv(work: Path) -> Any:
    from tools.reader_venv import GRAIN, TORCH, cached_venv, project_dependencies

    return cached_venv(work / "reader-venv", [TORCH, GRAIN, "tfrecord", *project_dependencies()])


def readers(images: int, work: Path, synthetic: bool) -> dict[str, Any]:
    """Build the version, then every row of ``ROWS`` without and with decoding."""
    corpus, pixels = make_corpus(images, work, synthetic=synthetic)
    count, nbytes = corpus_facts(corpus)
    dest = work / "readers"
    shutil.rmtree(dest, ignore_errors=True)
    subprocess.run([PY, "-m", "image_tfrecords", "build", "--source", str(corpus), "--destination", str(dest),
                    "--dataset", "flowers", "--version", "v1", "--workers", str(os.cpu_count() or 1),
                    "--shard-size-mb", SHARD_SIZE_MB, "--no-progress"], cwd=ROOT, check=True, capture_output=True,
                   timeout=1800)
    version = dest / "flowers" / "v1"
    manifest = json.loads((version / "manifest.json").read_text())
    train = manifest["splits"]["train"]
    print("  reader venv (made once) ...", flush=True)
    venv = reader_venv(work)
    rates: dict[str, dict[str, Any]] = {}
    for decode in (False, True):
        warm, timed = WINDOWS[decode]
        for key, _, contender, workers, dev in ROWS:
            args = [str(ROOT / "bench" / "reader_rates.py"), str(version), contender, "--workers", str(workers),
                    "--warm", str(warm), "--timed", str(timed), "--rounds", str(ROUNDS[decode]),
                    *(["--decode"] if decode else [])]
            env = {**(os.environ if dev else venv.env), "PYTHONPATH": str(ROOT / "include"),
                   "TF_CPP_MIN_LOG_LEVEL": "2", "OMP_WAIT_POLICY": "PASSIVE"}
            proc = subprocess.run([PY if dev else venv.python, *args], cwd=ROOT, env=env, capture_output=True,
                                  text=True, timeout=600)
            if proc.returncode:
                raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            rates.setdefault(key, {})["decoded" if decode else "stored"] = result
            rounds = ", ".join(f"{r:.0f}" for r in result["rounds"])
            print(f"  {key}{' decoded' if decode else ''}: {result['records_per_s']:.0f} records/s ({rounds})",
                  flush=True)
    return {"images": count, "megabytes": nbytes / 1e6, "pixels": pixels, "records": train["num_records"],
            "shards": len(train["shards"]), "shard_megabytes": sum(s["num_bytes"] for s in train["shards"]) / 1e6,
            "rates": rates, "windows": {str(k): v for k, v in WINDOWS.items()},
            "rounds": {str(k): v for k, v in ROUNDS.items()}, "cores": os.cpu_count()}


def _rate(report: dict[str, Any], key: str, decoded: bool) -> float:
    return float(report["rates"][key]["decoded" if decoded else "stored"]["records_per_s"])


def render_readers(report: dict[str, Any]) -> list[str]:
    """The "Random-access readers" section."""
    (warm, timed), (dwarm, dtimed) = WINDOWS[False], WINDOWS[True]
    lines = [
        "## Random-access readers (issue 26)", "",
        f"One version built from the main table's corpus ({report['images']} files, {report['megabytes']:.1f} MB; "
        f"pixels: {report['pixels']}) with `--shard-size-mb {SHARD_SIZE_MB}`; its train split ({report['records']} "
        f"records in {report['shards']} shards, {report['shard_megabytes']:.1f} MB) read by each reader in turn, "
        "one process each, in one run (`bench/readers.py`, `bench/reader_rates.py`). Every reader takes the "
        "same fields (image bytes, label, filename; the second row all ten), in a shuffled order (`tfrecord`: "
        "its own interleaving of the shards; `tf.data`: a 1,024-record shuffle buffer), in batches of 64 "
        "(the loops and Grain: record by record). Decoded: Pillow to RGB, resized to 224x224 (`decode_image`; "
        "`tf.data`: `load_split(image_size=(224, 224))`, TensorFlow's decoder, in parallel; with "
        "`collate_bytes`, the decoded tensors stacked in the worker's buffer). Records/s between two points "
        f"of the stream: after {warm} records (worker start-up, first reads, buffers filled), then {timed} "
        f"(decoded: {dwarm}, then {dtimed}); the median of {ROUNDS[False]} rounds (decoded: {ROUNDS[True]}), each "
        "a new reader (new DataLoader workers). The references read nothing: the same records held in memory and "
        "delivered by the same DataLoader; with decoding, what decoding alone costs. Every process runs "
        "with `OMP_WAIT_POLICY=PASSIVE`: torch's OpenMP threads otherwise spin after each parallel op (the "
        "batch's `torch.stack` in a process with no workers) and slow Pillow's decoding down 3x on this "
        "machine.", "",
        "| reader | records/s, stored bytes | records/s, decoded 224x224 |",
        "|---|---:|---:|",
    ]
    for key, label, *_ in ROWS:
        lines.append(f"| {label} | {_rate(report, key, False):,.0f} | {_rate(report, key, True):,.0f} |")
    default, packed = _rate(report, "loader2", False), _rate(report, "packed2", False)
    held, held_packed = _rate(report, "memory2", False), _rate(report, "memory2-packed", False)
    loop = _rate(report, "source", False)
    lines += ["", f"Machine: {report['cores']} cores. With the default collate a batch's image bytes go from a "
              "worker to the training loop pickled through a pipe, which costs more than reading them (records "
              f"held in memory: {held:,.0f}/s through that DataLoader with {WORKERS} workers). `collate_bytes` "
              "copies them into a shared buffer that the worker reuses and sends only its name: "
              f"{packed:,.0f}/s against {default:,.0f}/s (held in memory: {held_packed:,.0f}/s). What is left is "
              f"reading (CRCs, protobuf, copies): {WORKERS} workers deliver about what one process reads in a "
              f"loop ({loop:,.0f}/s), the {report['cores']} cores being shared by the workers and the training "
              "loop. Other processes on the machine move these figures by up to 2x between runs (the rounds "
              "are in `readers.json`).", ""]
    return lines


def readers_targets(report: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """Issue 26's targets: 5x ``MultiTFRecordDataset`` with the same workers; decoding within 1.2x of decoding alone."""
    ours, theirs = _rate(report, "packed2", False), _rate(report, "tfrecord2", False)
    default, theirs_packed = _rate(report, "loader2", False), _rate(report, "tfrecord2-packed", False)
    decoded, alone = _rate(report, "loader2", True), _rate(report, "memory2", True)
    ceiling = _rate(report, "memory2-packed", False)
    return [
        (f"DataLoader, {WORKERS} workers: >= 5x the records/s of `MultiTFRecordDataset` with the same workers",
         f"`collate_bytes`: {ours:,.0f} vs {theirs:,.0f} records/s: {ours / theirs:.2f}x (default collate: "
         f"{default:,.0f}, {default / theirs:.2f}x; records held in memory with `collate_bytes`: {ceiling:,.0f}, "
         f"{ceiling / theirs:.2f}x; `tfrecord` with `collate_bytes`: {theirs_packed:,.0f})", ours >= 5 * theirs),
        (f"DataLoader, {WORKERS} workers, decoding: within 1.2x of decoding alone",
         f"{decoded:,.0f} vs {alone:,.0f} records/s: {alone / decoded:.2f}x", alone <= 1.2 * decoded),
    ]
