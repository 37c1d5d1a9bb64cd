"""The S3 path (issue 50): the same corpus local -> local, S3 -> S3 on loopback and S3 -> S3 with 20 ms added to
every request (``tools/latency_proxy.py``, a real region's latency), the 1% night on S3 against ``--full`` on
S3, and the listing of 200,000 keys with that latency in parallel against one sequential listing.

SeaweedFS runs on the same cores as the build (its CPU is reported apart); objects are uploaded with boto3's
``upload_file`` (its default checksums), as users upload them. ``bench/run.py --only s3path`` runs this alone.
"""

from __future__ import annotations

import hashlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.common import ROOT, make_corpus, measure, stage_seconds
from bench.incremental import EXTRA_SEED, Nights, image_files, night_counts

PY = sys.executable
LIST_CLASSES = 50
DELAY_MS = 20.0


def _server_cpu(pid: int | None) -> float:
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _upload(client: Any, folder: Path, bucket: str, prefix: str, files: list[Path] | None = None) -> int:
    files = image_files(folder) if files is None else files
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda p: client.upload_file(str(p), bucket, f"{prefix}/{p.relative_to(folder)}"), files))
    return len(files)


def _build(source: str, dest: str, env: dict[str, str], version: str = "v1", full: bool = False,
           workers: int = 2, server_pid: int | None = None) -> dict[str, Any]:
    command = [PY, "-m", "image_tfrecords", "build", "--source", source, "--destination", dest, "--dataset", "d",
               "--version", version, "--workers", str(workers), "--no-progress", "--near-duplicate-bits", "0",
               *(["--full"] if full else [])]
    server, client = _server_cpu(server_pid), _children_cpu()
    run = measure(command, env=env, cwd=ROOT)
    return {"seconds": run.seconds, "stages": stage_seconds(run.stdout), "client_cpu": _children_cpu() - client,
            "server_cpu": _server_cpu(server_pid) - server}


def _env(server: Any, endpoint: str | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {**env, **server.env(), **({"AWS_ENDPOINT_URL": endpoint} if endpoint else {}), **extra}


def s3_path(images: int, work: Path, smoke: bool, night_images: int, list_keys: int,
            workers: int = 2) -> dict[str, Any]:
    """Every measurement of this section (see the module)."""
    from tools import latency_proxy, seaweedfs

    corpus, _ = make_corpus(images, work, synthetic=smoke)
    scratch = Path(tempfile.mkdtemp(prefix="s3path-", dir=work))
    server = seaweedfs.start(tempfile.mkdtemp(prefix="s3path-weed-"))  # short: its socket paths have a length limit
    result: dict[str, Any] = {"images": images, "workers": workers, "delay_ms": DELAY_MS}
    try:
        server.create_bucket("bench")
        client = server.client()
        local = _build(str(corpus), str(scratch / "local-out"), dict(os.environ), workers=workers)
        result["local"] = local
        result["uploaded"] = _upload(client, corpus, "bench", "src")
        result["s3"] = _build("s3://bench/src", "s3://bench/out-loopback", _env(server), workers=workers,
                              server_pid=server.pid)
        proxy = latency_proxy.start(server.endpoint, DELAY_MS, str(scratch))
        try:
            result["s3_latency"] = _build("s3://bench/src", "s3://bench/out-latency", _env(server, proxy.endpoint),
                                          workers=workers, server_pid=server.pid)
        finally:
            counted = latency_proxy.stop(proxy)  # stopped whatever happened; a failed build's error is kept
        result["s3_latency"]["proxy"] = counted
        result["night"] = _s3_night(server, client, night_images, work, scratch, smoke, workers)
        result["listing"] = _listing(server, client, list_keys, scratch)
    finally:
        seaweedfs.stop(server)
        shutil.rmtree(scratch, ignore_errors=True)
        shutil.rmtree(str(server.data_dir), ignore_errors=True)
    return result


def _s3_night(server: Any, client: Any, images: int, work: Path, scratch: Path, smoke: bool,
              workers: int) -> dict[str, Any]:
    """Night 2 of a corpus in S3 (changed in the local copy, then mirrored to the bucket): the night and ``--full``."""
    counts = night_counts(images)
    corpus, _ = make_corpus(images, work, synthetic=smoke)
    extras, _ = make_corpus(2 * (counts["added"] + counts["changed"]) + 20, work, seed=EXTRA_SEED, synthetic=smoke)
    nights = Nights(corpus, extras, scratch / "nights", 100.0 if not smoke else 4.0, workers)
    _upload(client, nights.source, "bench", "night-src")
    before = {p: p.stat().st_mtime_ns for p in image_files(nights.source)}
    env = _env(server)
    _build("s3://bench/night-src", "s3://bench/night-out", env, "night01", workers=workers)
    nights.mutate(2, counts)
    after = {p: p.stat().st_mtime_ns for p in image_files(nights.source)}
    gone = [f"night-src/{p.relative_to(nights.source)}" for p in before if p not in after]
    for start in range(0, len(gone), 1000):
        client.delete_objects(Bucket="bench", Delete={"Objects": [{"Key": k} for k in gone[start:start + 1000]]})
    _upload(client, nights.source, "bench", "night-src", [p for p, t in after.items() if before.get(p) != t])
    night = _build("s3://bench/night-src", "s3://bench/night-out", env, "night02", workers=workers,
                   server_pid=server.pid)
    full = _build("s3://bench/night-src", "s3://bench/night-out", env, "night02-full", full=True, workers=workers,
                  server_pid=server.pid)
    shutil.rmtree(nights.folder, ignore_errors=True)
    return {"images": images, "counts": counts, "night": night, "full": full}


DISCOVER = """
import hashlib, sys, time
from image_tfrecords.config import BuildConfig
from image_tfrecords.stages.discover import discover_stage
from image_tfrecords.staging import DISCOVERED, staged
from image_tfrecords.storage import Storage
cfg = BuildConfig(source=sys.argv[1], destination=sys.argv[2], dataset="d", version="v1")
storage = Storage()
started = time.perf_counter()
discover_stage(cfg, storage)
seconds = time.perf_counter() - started
print(seconds, hashlib.sha256(storage.read_bytes(staged(cfg, DISCOVERED))).hexdigest())
"""


def _listing(server: Any, client: Any, keys: int, scratch: Path) -> dict[str, Any]:
    """``keys`` one-byte objects in ``LIST_CLASSES`` class folders, discovered through the latency proxy with one
    request at a time (``IMAGE_TFRECORDS_S3_CONCURRENCY=1``) and with the default; seconds and discovered.csv."""
    import obstore

    from image_tfrecords.storage.s3_reads import obstore_for
    from tools import latency_proxy

    names = [f"list-src/c{i % LIST_CLASSES:03d}/{hashlib.sha256(str(i).encode()).hexdigest()[:16]}.jpg"
             for i in range(keys)]
    started = time.perf_counter()
    store = obstore_for(client, "bench")  # obstore: boto3's ~4 ms of CPU a PUT would make this the longest part
    with ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda key: obstore.put(store, key, b"\xff"), names))
    made = time.perf_counter() - started
    out: dict[str, Any] = {"keys": keys, "classes": LIST_CLASSES, "create_seconds": made}
    proxy = latency_proxy.start(server.endpoint, DELAY_MS, str(scratch))
    try:
        for name, concurrency in (("sequential", "1"), ("parallel", "")):
            env = _env(server, proxy.endpoint, PYTHONPATH=str(ROOT / "include"))
            if concurrency:
                env["IMAGE_TFRECORDS_S3_CONCURRENCY"] = concurrency
            done = subprocess.run([PY, "-c", DISCOVER, "s3://bench/list-src", f"s3://bench/list-out-{name}"],
                                  env=env, capture_output=True, text=True, check=True, cwd=ROOT)
            seconds, digest = done.stdout.split()[-2:]
            out[name] = {"seconds": float(seconds), "discovered_sha256": digest}
    finally:
        out["proxy"] = latency_proxy.stop(proxy)
    return out


def render_s3_path(data: dict[str, Any]) -> list[str]:
    local, s3, slow = data["local"], data["s3"], data["s3_latency"]
    proxy = slow.get("proxy", {})
    per_image = proxy.get("requests", 0) / max(1, data["images"])
    lines = [f"\n## The S3 path (issue 50): {data['images']} images, `--workers {data['workers']}`\n",
             "SeaweedFS on the same cores as the build (its CPU apart); the source uploaded with boto3's "
             f"`upload_file`. \"+{data['delay_ms']:g} ms\": every request through `tools/latency_proxy.py`.\n",
             "| full build | seconds | vs local | build CPU (s) | server CPU (s) | stages |",
             "|---|---:|---:|---:|---:|---|"]
    for label, run in (("local -> local", local), ("S3 -> S3, loopback", s3),
                       (f"S3 -> S3, +{data['delay_ms']:g} ms a request", slow)):
        stages = ", ".join(f"{k} {v:.1f}" for k, v in run["stages"].items() if v >= 0.1)
        lines.append(f"| {label} | {run['seconds']:.2f} | {run['seconds'] / local['seconds']:.1f}x | "
                     f"{run['client_cpu']:.1f} | {run['server_cpu']:.1f} | {stages} |")
    lines.append(f"\nThrough the proxy: {proxy.get('requests', 0)} requests ({per_image:.2f} an image) on "
                 f"{proxy.get('connections', 0)} connections; {proxy.get('bytes_to_server', 0) / 1e6:.1f} MB to the "
                 f"store, {proxy.get('bytes_to_client', 0) / 1e6:.1f} MB from it.")
    night = data["night"]
    lines += [f"\n1% night on S3 (S3 -> S3), {night['images']} images ({night['counts']}): night "
              f"{night['night']['seconds']:.2f} s, `--full` {night['full']['seconds']:.2f} s, "
              f"**{night['full']['seconds'] / night['night']['seconds']:.1f}x**. Night stages: "
              + ", ".join(f"{k} {v:.2f}" for k, v in night["night"]["stages"].items() if v >= 0.05) + "."]
    listing = data["listing"]
    seq, par = listing["sequential"], listing["parallel"]
    same = "byte-identical" if seq["discovered_sha256"] == par["discovered_sha256"] else "**different**"
    lines += [f"\nListing {listing['keys']:,} keys in {listing['classes']} folders with +{data['delay_ms']:g} ms a "
              f"request (the discover stage): one sequential listing {seq['seconds']:.2f} s, in parallel "
              f"{par['seconds']:.2f} s, **{seq['seconds'] / par['seconds']:.1f}x**; `discovered.csv` {same}. "
              f"Creating the keys took {listing['create_seconds']:.0f} s."]
    return lines


def s3_path_targets(data: dict[str, Any]) -> list[tuple[str, str, bool]]:
    local, s3, slow = data["local"]["seconds"], data["s3"]["seconds"], data["s3_latency"]["seconds"]
    night = data["night"]
    speedup = night["full"]["seconds"] / night["night"]["seconds"]
    listing = data["listing"]
    faster = listing["sequential"]["seconds"] / listing["parallel"]["seconds"]
    same = listing["sequential"]["discovered_sha256"] == listing["parallel"]["discovered_sha256"]
    return [
        (f"S3 -> S3 full build within 2x of local -> local on loopback ({data['images']} images)",
         f"{s3 / local:.1f}x ({s3:.1f} s vs {local:.1f} s)", s3 <= 2 * local),
        (f"S3 -> S3 within 3x of local with {data['delay_ms']:g} ms a request", f"{slow / local:.1f}x ({slow:.1f} s)",
         slow <= 3 * local),
        (f"1% night on S3 at least 5x faster than --full on S3 ({night['images']} images)", f"{speedup:.1f}x",
         speedup >= 5),
        (f"listing {listing['keys']:,} keys with {data['delay_ms']:g} ms: parallel at least 8x one sequential "
         "listing, discovered.csv byte-identical", f"{faster:.1f}x, {'identical' if same else 'different'}",
         faster >= 8 and same),
    ]
