"""Incremental nights (issues 12 and 22)."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT, Run, corpus_facts, make_corpus, measure, stage_seconds

# -- incremental nights (issue 12) -----------------------------------------------------------------
NIGHT = {"added": 0.01, "deleted": 0.001, "changed": 0.0005}  # shares of the first version's images
EXTRA_SEED = 101  # make_corpus seed of the second corpus: the images nights add, and changed images' new bytes
MUTATION_SEED = 12  # which images a night deletes and changes
SHARD_SUFFIXES = (".tfrecord", ".tfrecord.gz", ".tfindex")


def shard_files(version: Path) -> list[Path]:
    """The shard files (and their ``.tfindex``) of the published version in the folder ``version``."""
    return sorted(path for path in version.iterdir() if path.name.endswith(SHARD_SUFFIXES))


def page_cache(paths: Iterable[Path], cached: bool) -> None:
    """Read each file of ``paths`` once (``cached``), or drop its pages from the page cache (where the system can).

    Each repeat of the same night starts from the base cached, as the first run (like a night after the one
    that wrote its base) finds it. The cold base is measured on its own (after a reboot, or on a machine whose
    page cache is too small to keep the last version)."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            if cached:
                while f.read(1 << 24):
                    pass
            elif hasattr(os, "posix_fadvise"):  # (not on macOS: there the "cold" run finds the base cached)
                os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def free_memory() -> dict[str, float]:
    """This machine's free memory and page cache (``/proc/meminfo``'s MemFree and Cached), in MB (empty elsewhere)."""
    found: dict[str, float] = {}
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                name, _, value = line.partition(":")
                if name in ("MemFree", "Cached"):
                    found[name] = int(value.split()[0]) / 1024
    except (OSError, ValueError):
        return {}
    return found


def night_counts(images: int) -> dict[str, int]:
    """How many images a night adds, deletes and changes (at least one of each)."""
    return {kind: max(1, round(images * share)) for kind, share in NIGHT.items()}


def image_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def written_bytes(version: Path, base: Path | None) -> dict[str, int]:
    """Bytes of the files of a published version that are not hard links of ``base``'s files (reused
    shards are): ``shards`` (.tfrecord and .tfindex), ``other`` (labels.csv, inspected.csv, rejects.csv,
    manifest, TFDS metadata, card) and ``linked`` (the reused, not written)."""
    shared = set()
    for path in image_files(base) if base else []:
        st = path.stat()
        shared.add((st.st_dev, st.st_ino))
    result = {"shards": 0, "other": 0, "linked": 0}
    for path in [p for p in version.rglob("*") if p.is_file()]:
        st = path.stat()
        kind = ("linked" if (st.st_dev, st.st_ino) in shared
                else "shards" if path.name.endswith(SHARD_SUFFIXES) else "other")
        result[kind] += st.st_size
    return result


def label_rows(version: Path) -> list[dict[str, str]]:
    with open(version / "labels.csv", newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def full_shard_count(rows: list[dict[str, str]], shard_size_mb: float) -> int:
    """The shards a full build of these records makes (``planning.shard_count`` per split)."""
    from image_tfrecords.rules import shards as planning

    sizes: dict[str, list[int]] = {}
    for row in rows:
        sizes.setdefault(row["split"], []).append(int(row["encoded_bytes"]))
    return sum(planning.shard_count(sum(s), len(s), shard_size_mb) for s in sizes.values())


class Nights:
    """A copy of a corpus that changes night by night, and ``image-tfrecords build`` runs on it.

    The copy is hard links (``cp -al``), so it costs nothing; a night never writes a file in place
    (it unlinks first), so the cached corpus is never changed."""

    def __init__(self, corpus: Path, extras: Path, folder: Path, shard_size_mb: float, workers: int = 2) -> None:
        self.folder, self.extras, self.shard_size_mb, self.workers = folder, extras, shard_size_mb, workers
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        self.source, self.out = folder / "source", folder / "out"
        subprocess.run(["cp", "-al", str(corpus), str(self.source)], check=True)
        (self.source / ".complete").unlink(missing_ok=True)
        self.pool = image_files(extras)
        random.Random(EXTRA_SEED).shuffle(self.pool)

    def take(self, count: int, suffix: str | None = None) -> list[Path]:
        """``count`` images of the second corpus (of ``suffix``) never taken before."""
        chosen = [p for p in self.pool if suffix is None or p.suffix == suffix][:count]
        if len(chosen) < count:
            raise RuntimeError(f"the second corpus ({self.extras}) has too few images left")
        taken = set(chosen)
        self.pool = [p for p in self.pool if p not in taken]
        return chosen

    def mutate(self, night: int, counts: dict[str, int]) -> dict[str, int]:
        """Night ``night``'s changes, reproducibly: delete, change (a JPEG's bytes become another JPEG's,
        unlinked and written anew, so a new size and mtime) and add (into the class folders, as in the
        second corpus). Returns the counts and ``new_bytes``, the bytes of the added and changed images."""
        rng = random.Random(f"{MUTATION_SEED}-{night}")
        files = image_files(self.source)
        deleted = rng.sample(files, counts["deleted"])
        gone = set(deleted)
        changed = rng.sample([p for p in files if p.suffix == ".jpg" and p not in gone], counts["changed"])
        for path in deleted:
            path.unlink()
        new_bytes = 0
        for path, donor in zip(changed, self.take(counts["changed"], ".jpg"), strict=True):
            data = donor.read_bytes()
            path.unlink()  # never in place: the file is a hard link into the cached corpus
            path.write_bytes(data)
            new_bytes += len(data)
        for donor in self.take(counts["added"]):
            target = self.source / donor.relative_to(self.extras)
            if target.exists():  # names are random: this does not happen, but an add must not replace
                target = target.with_name(f"n{night}-{target.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(donor, target)
            new_bytes += target.stat().st_size
        return {**counts, "new_bytes": new_bytes}

    def build(self, version: str, dest: Path | None = None, full: bool = False) -> tuple[Run, dict[str, Any] | None]:
        """Run the CLI; its run and the published version's manifest (None when nothing was published).
        The page cache's dirty pages are written out first (``sync``): no build waits on another's writes."""
        dest = dest or self.out
        os.sync()
        run = measure(self.command(version, str(dest), full), cwd=ROOT)
        folder = dest / "nightly" / version
        published = (folder / "_SUCCESS").exists()
        return run, json.loads((folder / "manifest.json").read_text()) if published else None

    def command(self, version: str, dest: str, full: bool = False) -> list[str]:
        return [PY, "-m", "image_tfrecords", "build", "--source", str(self.source), "--destination", dest,
                "--dataset", "nightly", "--version", version, "--workers", str(self.workers),
                "--shard-size-mb", f"{self.shard_size_mb:g}", "--no-progress", *(["--full"] if full else []),
                # the search off: a night keeps published records where a full build regroups them, so near-duplicates
                # across labels (crops of a dozen photos) make the two differ by design (docs/near-duplicates.md)
                "--near-duplicate-bits", "0"]


def s3_night(corpus: Path, extras: Path, work: Path, counts: dict[str, int], shard_size_mb: float,
             workers: int = 2) -> dict[str, Any]:
    """The same first version and night 2 with the destination on a local SeaweedFS server: what a spliced
    shard costs when its kept runs are copied by the store (``UploadPartCopy``) instead of the kernel."""
    from tools import seaweedfs

    nights = Nights(corpus, extras, work / "incremental-s3", shard_size_mb, workers)
    data = tempfile.mkdtemp(prefix="bench-s3-")  # short: SeaweedFS's unix socket path must fit in 108 bytes
    server = seaweedfs.start(data)
    try:
        server.create_bucket("bench")
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")}, **server.env()}
        dest = "s3://bench/out"
        runs: dict[str, Any] = {}
        for name, version, full in (("first", "night01", False), ("incremental", "night02", False),
                                    ("full", "night02-full", True)):
            if name == "incremental":
                nights.mutate(2, counts)
            os.sync()
            run = measure(nights.command(version, dest, full), env=env, cwd=ROOT)
            manifest = json.loads(server.client().get_object(
                Bucket="bench", Key=f"out/nightly/{version}/manifest.json")["Body"].read())
            runs[name] = {"seconds": run.seconds, "build": manifest["build"], "shards": shard_total(manifest)}
            print(f"  S3 destination, {name}: {run.seconds:.2f} s", flush=True)
    finally:
        seaweedfs.stop(server)
        shutil.rmtree(data, ignore_errors=True)
        shutil.rmtree(nights.folder, ignore_errors=True)
    runs["speedup"] = runs["full"]["seconds"] / runs["incremental"]["seconds"]
    return runs


def disk_write_rate(work: Path, megabytes: int = 1000) -> float:
    """MB/s of writing ``megabytes`` to a new file in ``work`` and fsyncing it: the floor under any night
    that must rewrite shards on a file system without reflinks."""
    path = work / "disk-write-rate.tmp"
    block = os.urandom(1 << 20)
    os.sync()
    started = time.perf_counter()
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    seconds = time.perf_counter() - started
    path.unlink()
    return megabytes / seconds


def write_rates(shards: list[Path], work: Path, threads: int = 2) -> dict[str, float]:
    """This machine's rates for the work under a night's write stage, on the base version's shards (read once
    first, so that both come from the page cache): SHA-256 (one thread, ``hashlib``) and the kernel's copy
    (``os.copy_file_range`` into new files, ``threads`` shards at a time), each in GB per CPU-second of this
    process (user and system time), and the copy's GB per second of wall time."""
    import hashlib
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    total = sum(path.stat().st_size for path in shards)
    page_cache(shards, cached=True)

    def cpu() -> float:
        times = os.times()
        return times.user + times.system

    started = cpu()
    for path in shards:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            hashlib.sha256(mapped).digest()
    hash_cpu = cpu() - started
    scratch = work / "write-rates.tmp"
    scratch.mkdir(exist_ok=True)

    def copy(path: Path) -> None:
        with open(path, "rb") as src, open(scratch / path.name, "wb") as dst:
            done, size = 0, os.fstat(src.fileno()).st_size
            while done < size and (n := os.copy_file_range(src.fileno(), dst.fileno(), size - done, done, done)):
                done += n

    os.sync()
    started, wall = cpu(), time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(copy, shards))
    copy_cpu, wall = cpu() - started, time.perf_counter() - wall
    shutil.rmtree(scratch)
    return {"gb": total / 1e9, "hash_gb_per_cpu_s": total / 1e9 / max(hash_cpu, 1e-9),
            "copy_gb_per_cpu_s": total / 1e9 / max(copy_cpu, 1e-9), "copy_gb_per_s": total / 1e9 / max(wall, 1e-9),
            "threads": threads}


def shard_total(manifest: dict[str, Any]) -> int:
    return sum(len(split["shards"]) for split in manifest["splits"].values())


def night_row(night: int, run: Run, manifest: dict[str, Any], shard_size_mb: float, version: Path) -> dict[str, Any]:
    build = manifest["build"]
    return {"night": night, "records": manifest["num_records"], "seconds": run.seconds, "mode": build["mode"],
            "full_because": build["full_because"], "shards": shard_total(manifest),
            "full_shards": full_shard_count(label_rows(version), shard_size_mb),
            "reused": build["shards_reused"], "rewritten": build["shards_rewritten"],
            "spliced": build.get("shards_spliced", 0), "records_parsed": build.get("records_parsed"),
            "written": build["shards_written"], "source_bytes_read": build["source_bytes_read"]}


def incremental_nights(images: int, work: Path, synthetic: bool, shard_size_mb: float = 100.0,
                       chain: int = 0, repeats: int | None = None, workers: int | None = None,
                       s3: bool = True) -> dict[str, Any]:
    """A first version of ``images`` images, an unchanged night, then night 2 built incrementally and with
    ``--full`` into an empty destination, ``repeats`` times each taking turns (the median run of each is
    reported; default 3: a build's seconds move by 10-20% from one run to the next on the benchmark machine, and
    the 100,000-image incremental night's by more, its write stage with the disk: 5.81 s and 8.63 s in two runs
    of the same code, one run each); then ``chain`` - 1 more nights (``chain`` nights in all). Every build
    runs ``--workers workers`` (default: this machine's cores); ``s3`` adds night 2 on a SeaweedFS server
    (up to 20,000 images)."""
    repeats = repeats or 3
    workers = workers or os.cpu_count() or 2
    counts = night_counts(images)
    corpus, pixels = make_corpus(images, work, parts=1 if images <= 20_000 else 2, synthetic=synthetic)
    need = max(1, chain) * (counts["added"] + counts["changed"]) + counts["added"]  # + the additions-only night
    extras, _ = make_corpus(need + max(20, need // 10), work, synthetic=synthetic, seed=EXTRA_SEED)
    nights = Nights(corpus, extras, work / f"incremental-{images}", shard_size_mb, workers)

    def say(what: str, run: Run) -> None:
        print(f"  {images} images, {what}: {run.seconds:.2f} s", flush=True)

    first, m1 = nights.build("night01")
    say("first version", first)
    assert m1 is not None
    unchanged, published = nights.build("night02")
    say("unchanged night", unchanged)
    skipped = (published is None and "unchanged since version night01" in unchanged.stdout
               and not (nights.out / "nightly" / "night02").exists())
    night = nights.mutate(2, counts)
    before = nights.folder / "before-night02"  # the destination as night 2 finds it: the repeats, the cold base
    shutil.copytree(nights.out, before, copy_function=os.link)
    memory = free_memory()  # what the first incremental night finds: a full page cache costs its writes (NOTES.md)
    incremental, m2 = nights.build("night02")
    say("night 2, incremental", incremental)
    full_dest = nights.folder / "full"
    full, mf = nights.build("night02", dest=full_dest, full=True)
    say("night 2, --full", full)
    assert m2 is not None and mf is not None
    runs_of: dict[str, list[Run]] = {"incremental": [incremental], "full": [full]}
    for _ in range(repeats - 1):  # the same night again, into copies: incremental and --full taking turns
        again = nights.folder / "again"
        shutil.copytree(before, again, copy_function=os.link)
        page_cache(shard_files(again / "nightly" / "night01"), cached=True)  # as the first run found it
        runs_of["incremental"].append(nights.build("night02", dest=again)[0])
        shutil.rmtree(again)
        runs_of["full"].append(nights.build("night02", dest=again, full=True)[0])
        shutil.rmtree(again)
        say("night 2 again, incremental", runs_of["incremental"][-1])
        say("night 2 again, --full", runs_of["full"][-1])
    again = nights.folder / "again"  # once more with the base's shards out of the page cache (after a reboot)
    shutil.copytree(before, again, copy_function=os.link)
    page_cache(shard_files(again / "nightly" / "night01"), cached=False)
    cold = nights.build("night02", dest=again)[0]
    say("night 2 again, incremental, the base's shards not cached", cold)
    shutil.rmtree(again)
    shutil.rmtree(before, ignore_errors=True)
    rates = write_rates(sorted(p for p in (nights.out / "nightly" / "night01").iterdir() if p.suffix == ".tfrecord"),
                        nights.folder)
    incremental, full = (sorted(runs_of[side], key=lambda run: run.seconds)[(repeats - 1) // 2]
                         for side in ("incremental", "full"))  # the median run (its stages with it)
    v1, v2, vf = (nights.out / "nightly" / "night01", nights.out / "nightly" / "night02",
                  full_dest / "nightly" / "night02")
    keys = ("filename", "sha256", "label", "split")
    inc_rows, full_rows = label_rows(v2), label_rows(vf)
    inc_records, full_records = ({tuple(r[k] for k in keys) for r in rows} for rows in (inc_rows, full_rows))
    report: dict[str, Any] = {
        "images": m1["num_records"], "megabytes": corpus_facts(corpus)[1] / 1e6, "pixels": pixels,
        "shard_size_mb": shard_size_mb, "night": night, "workers": workers, "cores": os.cpu_count(),
        "first": {"seconds": first.seconds, "rss_mb": first.rss_mb, "shards": shard_total(m1)},
        "unchanged": {"seconds": unchanged.seconds, "skipped": skipped, "says": unchanged.stdout.strip()[-300:]},
        "repeats": repeats,
        "memory_mb": memory,
        "incremental": {"seconds": incremental.seconds, "rss_mb": incremental.rss_mb, "build": m2["build"],
                        "all_seconds": [run.seconds for run in runs_of["incremental"]],
                        "shards": shard_total(m2), "written": written_bytes(v2, v1),
                        "stages": stage_seconds(incremental.stdout)},
        "cold_base": {"seconds": cold.seconds, "stages": stage_seconds(cold.stdout)},
        "full": {"seconds": full.seconds, "rss_mb": full.rss_mb, "build": mf["build"], "shards": shard_total(mf),
                 "all_seconds": [run.seconds for run in runs_of["full"]],
                 "written": written_bytes(vf, None), "stages": stage_seconds(full.stdout)},
        "write_rates": rates,
        "records": len(inc_records),
        "records_equal": inc_records == full_records and len(inc_rows) == len(full_rows) == len(
            image_files(nights.source)),
    }
    report["speedup"] = full.seconds / incremental.seconds
    report["rows"] = len(inc_rows)
    report["source_ratio"] = m2["build"]["source_bytes_read"] / night["new_bytes"]
    shutil.rmtree(full_dest)
    if chain:
        rows = [night_row(1, first, m1, shard_size_mb, v1), night_row(2, incremental, m2, shard_size_mb, v2)]
        for number in range(3, chain + 2):
            nights.mutate(number, counts)
            run, manifest = nights.build(f"night{number:02d}")
            assert manifest is not None
            rows.append(night_row(number, run, manifest, shard_size_mb, nights.out / "nightly" / f"night{number:02d}"))
            say(f"night {number}, {rows[-1]['mode']}, {rows[-1]['shards']} shards", run)
            shutil.rmtree(nights.out / "nightly" / f"night{number - 2:02d}")  # no build needs it now: disk
        report["chain"] = rows
    # A night that only adds images: every shard keeps its records, so shards are reused (hard links)
    # and only each split's tail is rewritten with the new images appended.
    adds = nights.mutate(99, {"added": counts["added"], "deleted": 0, "changed": 0})
    add_run, ma = nights.build("night99")
    say("an additions-only night, incremental", add_run)
    add_full, maf = nights.build("night99", dest=full_dest, full=True)
    say("the additions-only night, --full", add_full)
    assert ma is not None and maf is not None
    report["additions_only"] = {
        "night": adds, "speedup": add_full.seconds / add_run.seconds,
        "incremental": {"seconds": add_run.seconds, "build": ma["build"], "shards": shard_total(ma)},
        "full": {"seconds": add_full.seconds, "build": maf["build"], "shards": shard_total(maf)}}
    shutil.rmtree(nights.folder)
    report["disk_mb_per_s"] = disk_write_rate(work, 50 if synthetic else 1000)
    if s3 and images <= 20_000:
        report["s3"] = s3_night(corpus, extras, work, counts, shard_size_mb, workers)
    return report


def _repeats(r: dict[str, Any]) -> str:
    """How night 2's seconds were measured."""
    count = r.get("repeats", 1)
    if count <= 1:
        return "one run each"
    spread = "; ".join(f"{side} " + ", ".join(f"{s:.2f}" for s in r[side]["all_seconds"]) + " s"
                       for side in ("incremental", "full"))
    return f"the median of {count} runs each, taking turns ({spread})"


def _write_floor(r: dict[str, Any]) -> str:
    """The write stage's hashing and copying, as CPU-seconds at this machine's measured rates (``write_rates``):
    what no scheduling of the current design's write can go below on the builds' ``--workers`` cores."""
    rates, build, cores = r["write_rates"], r["incremental"]["build"], r.get("workers", 2)
    hashed = build.get("base_bytes_read", 0) + build.get("bytes_kept", 0)
    hashing = hashed / 1e9 / rates["hash_gb_per_cpu_s"]
    copying = build.get("bytes_kept", 0) / 1e9 / rates["copy_gb_per_cpu_s"]  # by the kernel, or by a worker
    return (f"{rates['hash_gb_per_cpu_s']:.2f} / {rates['copy_gb_per_cpu_s']:.2f} ({rates['copy_gb_per_s']:.2f} GB/s); "
            f"{hashing:.2f} + {copying:.2f} CPU-s, **{(hashing + copying) / cores:.2f} s** on {cores} cores "
            f"(write stage {r['incremental'].get('stages', {}).get('write', float('nan')):.2f} s)")


def render_incremental(runs: dict[int, dict[str, Any]]) -> list[str]:
    """The "Incremental nights" section of BENCHMARKS.md."""
    if not runs:
        return []
    sizes = sorted(runs)
    any_run = runs[sizes[0]]
    mb = lambda n: f"{n / 1e6:.1f}"  # noqa: E731

    def row(label: str, cell: Any) -> str:
        return f"| {label} | " + " | ".join(cell(runs[n]) for n in sizes) + " |"

    def shards(side: dict[str, Any]) -> str:
        b = side["build"]
        return (f"{b['shards_reused']} / {b.get('shards_spliced', 0)} / "
                f"{b['shards_rewritten'] - b.get('shards_spliced', 0)} / {b['shards_written']} "
                f"({side['shards']} in all)")

    def new_images(r: dict[str, Any]) -> int:
        return r["night"]["added"] + r["night"]["changed"]

    def per_row(r: dict[str, Any], stage: str) -> str:
        seconds = r["incremental"].get("stages", {}).get(stage)
        return "?" if seconds is None else f"{seconds:.2f} s ({seconds / r['rows'] * 1e6:.1f} us/row)"

    def written(side: dict[str, Any]) -> str:
        w = side["written"]
        return f"{mb(w['shards'] + w['other'])} ({mb(w['shards'])} + {mb(w['other'])})"

    lines = [
        "## Incremental nights (issues 12 and 22)", "",
        f"A night, counted on the first version's images: {NIGHT['added']:.0%} added (images of a second "
        f"`make_corpus` corpus, seed {EXTRA_SEED}, into the class folders), {NIGHT['deleted']:.1%} deleted, "
        f"{NIGHT['changed']:.2%} changed (a JPEG's bytes replaced by another JPEG's, written as a new file: "
        "new size and mtime). The source is a hard-link copy of the cached corpus (`cp -al`; a night "
        "unlinks before it writes). Every build is `image-tfrecords build --workers "
        f"{any_run.get('workers', 2)} "
        f"--shard-size-mb {any_run['shard_size_mb']:g} --no-progress` into a local folder: night01 (the "
        "first version, a full build), the same source again (an unchanged night), night02 after one "
        "night's changes, incremental on night01, and `--full` of the same night02 source into an empty "
        "destination, in that order (the page cache is warm for both: a repeat first reads the base's shards, "
        "which the run before it dropped from the cache once spliced, as the first run finds them); "
        + ", ".join(f"at {n} images {_repeats(runs[n])}" for n in sizes)
        + "; then the incremental night once more with the base's shards dropped from the page cache (as after a "
        "reboot). Last, a night that only adds images (built after the others), incremental and `--full`, once.", "",
        "| | " + " | ".join(f"{n} images" for n in sizes) + " |",
        "|---|" + "---:|" * len(sizes),
        row("first version: MB, shards, seconds",
            lambda r: f"{r['megabytes']:.0f} MB, {r['first']['shards']} shards, {r['first']['seconds']:.1f} s"),
        row("unchanged night: seconds",
            lambda r: f"{r['unchanged']['seconds']:.2f} s, "
                      + ("skipped" if r["unchanged"]["skipped"] else "**built**")),
        row("night: added / deleted / changed",
            lambda r: f"{r['night']['added']} / {r['night']['deleted']} / {r['night']['changed']}"),
        row("MB of the added and changed images", lambda r: mb(r["night"]["new_bytes"])),
        row("incremental night: seconds (peak RSS MB)",
            lambda r: f"**{r['incremental']['seconds']:.2f}** ({r['incremental']['rss_mb']:.0f})"),
        row("`--full`, same source: seconds (peak RSS MB)",
            lambda r: f"**{r['full']['seconds']:.2f}** ({r['full']['rss_mb']:.0f})"),
        row("speedup (full / incremental)", lambda r: f"**{r['speedup']:.1f}x**"),
        row("memory free / page cache when the incremental night started: MB",
            lambda r: f"{r['memory_mb']['MemFree']:.0f} / {r['memory_mb']['Cached']:.0f}"
            if r.get("memory_mb") else "?"),
        row("incremental night with the base's shards not in the page cache: seconds (speedup)",
            lambda r: f"{r['cold_base']['seconds']:.2f} ({r['full']['seconds'] / r['cold_base']['seconds']:.1f}x)"
            if "cold_base" in r else "not run"),
        row("MB read from the source: incremental / full",
            lambda r: f"{mb(r['incremental']['build']['source_bytes_read'])} / "
                      f"{mb(r['full']['build']['source_bytes_read'])}"),
        row("source read / added and changed MB", lambda r: f"**{r['source_ratio']:.2f}x**"),
        row("files inspected (reused): incremental",
            lambda r: f"{r['incremental']['build']['files_inspected']} "
                      f"({r['incremental']['build']['inspections_reused']})"),
        row("shards reused / spliced / rewritten record by record / written: incremental",
            lambda r: shards(r["incremental"])),
        row("shards reused / spliced / rewritten record by record / written: full", lambda r: shards(r["full"])),
        row("records parsed: incremental / full (added and changed images)",
            lambda r: f"{r['incremental']['build'].get('records_parsed', '?')} / "
                      f"{r['full']['build'].get('records_parsed', '?')} ({new_images(r)})"),
        row("MB of base shards read by a worker (their kept records checked there): incremental",
            lambda r: mb(r["incremental"]["build"].get("base_bytes_read", 0))),
        row("MB of shards kept from base shards as bytes / copied by the kernel or the store / written by a worker: "
            "incremental",
            lambda r: f"{mb(r['incremental']['build'].get('bytes_kept', 0))} / "
                      f"{mb(r['incremental']['build'].get('bytes_copied', 0))} / "
                      f"{mb(r['incremental']['build'].get('bytes_written', 0))}"),
        row("MB of shards copied / written by a worker: full",
            lambda r: f"{mb(r['full']['build'].get('bytes_copied', 0))} / "
                      f"{mb(r['full']['build'].get('bytes_written', 0))}"),
        row("S3 destination (SeaweedFS on this machine): incremental / `--full` seconds",
            lambda r: f"{r['s3']['incremental']['seconds']:.2f} / {r['s3']['full']['seconds']:.2f} "
                      f"(**{r['s3']['speedup']:.1f}x**)" if "s3" in r else "not run"),
        row("S3: MB of base shards read by a worker / copied by the store / uploaded by a worker",
            lambda r: " / ".join(mb(r["s3"]["incremental"]["build"].get(k, 0)) for k in
                                 ("base_bytes_read", "bytes_copied", "bytes_written")) if "s3" in r else "not run"),
        row("disk: MB/s writing 1 GB with fsync; seconds to write the night's kept shard bytes at that rate",
            lambda r: f"{r['disk_mb_per_s']:.0f} MB/s; "
                      f"{r['incremental']['build'].get('bytes_kept', 0) / 1e6 / r['disk_mb_per_s']:.1f} s"
            if "disk_mb_per_s" in r else "not measured"),
        row("this machine: SHA-256 GB per CPU-second / kernel copy GB per CPU-second (GB/s, 2 threads); CPU-seconds "
            "to hash the bases read and the kept bytes and to copy them at those rates, over the builds' cores",
            lambda r: _write_floor(r) if "write_rates" in r else "not measured"),
        row("incremental night by stage: discover / inspect (its passes over the listing) / read (the files "
            "inspection reads and decodes) / split / plan",
            lambda r: " / ".join(per_row(r, s) for s in ("discover", "inspect", "read", "split", "plan"))),
        row("incremental night by stage: reuse / write / validate / card / publish",
            lambda r: " / ".join(per_row(r, s) for s in ("reuse", "write", "validate", "card", "publish"))),
        row("MB written: incremental (shards + other)", lambda r: written(r["incremental"])),
        row("MB written: full (shards + other)", lambda r: written(r["full"])),
        row("records equal (labels.csv filename, sha256, label, split)",
            lambda r: f"{'yes' if r['records_equal'] else '**no**'} ({r['records']})"),
        row("additions-only night (1% added, nothing deleted or changed): incremental / `--full` seconds",
            lambda r: f"{r['additions_only']['incremental']['seconds']:.2f} / "
                      f"{r['additions_only']['full']['seconds']:.2f} (**{r['additions_only']['speedup']:.1f}x**)"
            if "additions_only" in r else "not run"),
        row("additions-only night: shards reused / spliced / rewritten record by record / written",
            lambda r: shards(r["additions_only"]["incremental"]) if "additions_only" in r else "not run"),
        "",
        "MB read from the source: the manifest's `build.source_bytes_read` (inspection's reads plus the "
        "writers' reads; a full build reads every image twice, once to inspect it and once to write it). "
        "MB written: the files of the published version that are not hard links of the previous "
        "version's files (reused shards are): shards with their `.tfindex`, plus the other files "
        "(labels.csv, inspected.csv, rejects.csv, manifest.json, TFDS metadata, the card); staging's "
        "temporary files (member lists, receipts) are not counted. Records parsed, MB of base shards "
        "read, kept, copied and written: the manifest's `build` (`records_parsed`, `base_bytes_read`, `bytes_kept`, "
        "`bytes_copied`, `bytes_written`). A spliced shard is its base shard's kept byte ranges plus its new records; "
        "locally the worker reads the kept ranges once, checks each kept record's framing and CRC32Cs, takes the "
        "new shard's SHA-256 and writes them in that one pass (`bytes_copied` is 0); on S3 the store copies them "
        "(a run shorter than a part may be uploaded) from a base the worker downloaded and checked. This "
        "machine's rates: SHA-256 of the base "
        "version's shards on one thread, and `os.copy_file_range` of them into new files two at a time, in GB "
        "per CPU-second of user and system time, measured after night 2 on night01's shards from the page cache; "
        "the CPU-seconds are the night's hashing (`base_bytes_read` + `bytes_kept`, an upper bound: the base's kept "
        "bytes are checked by CRC32C, cheaper than SHA-256) and copying or writing (`bytes_kept`) at "
        "those rates, divided by the builds' `--workers` cores: about what the write stage of this design costs "
        "here. Stage "
        "seconds are the CLI summary's, per row of the version's labels.csv.", "",
    ]
    for n in sizes:
        chain = runs[n].get("chain")
        if not chain:
            continue
        lines += [f"### {len(chain) - 1} nights at {n} images", "",
                  "Each night the same changes (as counted on the first version), incremental unless the plan "
                  "compacts; \"full build's shards\" is what a full build of that night's records would make.", "",
                  "| night | records | mode | shards | full build's shards | reused / spliced / rewritten / "
                  "written | records parsed | seconds | MB read |", "|---|---:|---|---:|---:|---|---:|---:|---:|"]
        for r in chain:
            mode = r["mode"] + (f" ({r['full_because']})" if r["mode"] == "full" else "")
            lines.append(f"| {r['night']:02d} | {r['records']} | {mode} | {r['shards']} | {r['full_shards']} | "
                         f"{r['reused']} / {r.get('spliced', 0)} / {r['rewritten'] - r.get('spliced', 0)} / "
                         f"{r['written']} | {r.get('records_parsed', '?')} | {r['seconds']:.2f} | "
                         f"{mb(r['source_bytes_read'])} |")
        compactions = [i for i, r in enumerate(chain) if i and r["full_because"].startswith("compaction")]
        lines.append("")
        for i in compactions:
            lines.append(f"Compaction on night {chain[i]['night']:02d}: {chain[i - 1]['shards']} shards the night "
                         f"before, {chain[i]['shards']} after.")
        if not compactions:
            from image_tfrecords.rules.base_version import COMPACTION_FACTOR

            counts = [r["shards"] for r in chain[1:]]
            lines.append(f"No compaction in {len(chain) - 1} nights: {min(counts)} to {max(counts)} shards, "
                         f"{chain[-1]['full_shards']} for a full build of the last night's records (the plan "
                         f"compacts above {COMPACTION_FACTOR:g}x that).")
        lines.append("")
    return lines


def incremental_targets(runs: dict[int, dict[str, Any]]) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for the targets of issues 12 and 22."""
    rows = []
    for n in sorted(runs):
        r = runs[n]
        goal = 10 if n >= 100_000 else 5
        parsed = r["incremental"]["build"].get("records_parsed")
        new = r["night"]["added"] + r["night"]["changed"]
        rows += [
            (f"{n} images: records parsed in the 1% night <= 2x the added and changed images",
             f"{parsed} for {new} images", parsed is not None and parsed <= 2 * new),
            (f"{n} images: the 1% night >= {goal}x faster than `--full`",
             f"{r['speedup']:.1f}x ({r['incremental']['seconds']:.1f} s vs {r['full']['seconds']:.1f} s, "
             f"{r.get('cores', os.cpu_count())} cores, --workers {r.get('workers', 2)})", r["speedup"] >= goal),
            (f"{n} images: source bytes read <= 2x the added and changed images'",
             f"{r['source_ratio']:.2f}x ({r['incremental']['build']['source_bytes_read'] / 1e6:.1f} MB of "
             f"{r['night']['new_bytes'] / 1e6:.1f} MB)", r["source_ratio"] <= 2),
            *([(f"{n} images, S3: kept runs copied by the store; through the worker at most the base read "
                "once plus the new records",
                f"{s3['bytes_copied'] / 1e6:.1f} MB copied by the store; {s3['base_bytes_read'] / 1e6:.1f} MB read "
                f"+ {s3['bytes_written'] / 1e6:.1f} MB uploaded ({r['night']['new_bytes'] / 1e6:.1f} MB of new "
                "images)", s3["bytes_copied"] > 0 and s3["bytes_written"] <= 1.05 * r["night"]["new_bytes"])]
              if (s3 := r.get("s3", {}).get("incremental", {}).get("build")) else []),
            (f"{n} images: an unchanged night skips all work",
             f"{'skipped' if r['unchanged']['skipped'] else 'built'} in {r['unchanged']['seconds']:.2f} s",
             r["unchanged"]["skipped"]),
        ]
    return rows


# -- report ----------------------------------------------------------------------------------------
