"""Near-duplicate grouping on real photo pixels (issue 51): the corpus, the distances, the default's figures.

    python bench/near_duplicates.py [--distinct 2000] [--variants-of 400] [--cross 20] [--seed 0]
                                    [--sweep] [--sizes] [--cost ROUNDS]
    python bench/near_duplicates.py --cost-bench 6000 --cost 3

**The corpus** (made from ``--seed`` alone, cached under ``.bench/near-duplicates-SEED-...``): ``--distinct``
crops of the Debian mate-backgrounds photos (``bench/make_corpus.debian_photos``; the three Elephants files
are one picture at three sizes, so only the largest is cut), each resized to a longest side of 320-720
pixels and saved as a JPEG of quality 85-95 under one of three labels. Crop boxes have sides of 128-1024
pixels of the photo (log-uniform, aspect 0.75-1.33) and are drawn until that many are accepted: a box is
refused when it overlaps an accepted box of the same photo by more than 25% of the smaller one, unless
one is at least 4 times the other's area (a 2x zoom or more: another picture, in pHash terms). For the
first ``--variants-of`` crops, one copy of each kind of ``tests/near_duplicates_corpus.KINDS`` (JPEG
quality 50-95, resize 0.5-2x, PNG, WebP, a crop of up to 5% a side, EXIF-rotated, brightness +-10%), under
the crop's label; for the next ``--cross`` crops, a JPEG re-encode (quality 50-95) under another label.

**What it prints.** A default build of the corpus (the CLI, every option at its default) and, from its
published files: the distances between each crop and its variants by kind, and between distinct crops
(all pairs); the three figures of issue 51's "done when" (variant pairs in two splits, variant pairs
grouped, distinct crops grouped with another distinct crop) and the cross-label pairs stored whole; the
images the reliability gate left out. ``--sweep``: the same figures for other ``near_duplicate_bits``,
from the build's hashes (``rules.near_duplicates.place``, as the split stage calls it). ``--sizes``: the
measurements behind the gate: 300 crops and their variants shrunk to shorter sides of 48-320 pixels,
and the project's sample images (``image-tfrecords sample``), hashed as inspection hashes them.
``--cost N``: N rounds of a full build with the default and with ``--near-duplicate-bits 0``, taking
turns: CPU seconds (user + system, the build's processes) and wall seconds. ``--cost-bench IMAGES``: only
that on ``bench/common.make_corpus``'s corpus (5% PNG), a full build and a night adding 1%.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.make_corpus import debian_photos
from tests.near_duplicates_corpus import KINDS, variant, write_variants

ROOT = Path(__file__).resolve().parent.parent
CLASSES = ("alpha", "beta", "gamma")
SIDES = (128, 1024)  # crop box sides in the photo, log-uniform
MAX_OVERLAP = 0.25  # of the smaller box
ZOOM_AREA = 4.0  # boxes this many times apart in area never conflict
LONGEST = (320, 720)  # the crops' longest side once resized
TRIES = 200_000


def photos() -> list[Any]:
    """The distinct pictures of the cache, as RGB images: the largest file of each picture."""
    from PIL import Image

    paths = debian_photos()
    if not paths:
        sys.exit("no photos: .bench/photos is empty and mate-backgrounds could not be had")
    by_picture: dict[str, tuple[int, str]] = {}
    for path in paths:
        with Image.open(path) as image:
            area = image.width * image.height
        picture = Path(path).stem.split("_")[0]
        if area > by_picture.get(picture, (0, ""))[0]:
            by_picture[picture] = (area, path)
    return [Image.open(path).convert("RGB") for _, path in sorted(by_picture.values(), key=lambda v: v[1])]


def boxes(sizes: list[tuple[int, int]], count: int, rng: random.Random) -> list[tuple[int, tuple[int, int, int, int]]]:
    """``count`` (photo, box) crops, drawn as the module says."""
    accepted: list[list[tuple[int, int, int, int]]] = [[] for _ in sizes]
    out: list[tuple[int, tuple[int, int, int, int]]] = []
    areas = [w * h for w, h in sizes]
    for _ in range(TRIES):
        if len(out) == count:
            return out
        i = rng.choices(range(len(sizes)), areas)[0]
        width, height = sizes[i]
        side, aspect = math.exp(rng.uniform(*map(math.log, SIDES))), rng.uniform(0.75, 1.33)
        w, h = min(width, round(side * aspect ** 0.5)), min(height, round(side / aspect ** 0.5))
        x, y = rng.randrange(width - w + 1), rng.randrange(height - h + 1)
        if all(not _conflict((x, y, w, h), other) for other in accepted[i]):
            accepted[i].append((x, y, w, h))
            out.append((i, (x, y, x + w, y + h)))
    sys.exit(f"only {len(out)} crops fit after {TRIES:,} tries; ask for fewer")


def _conflict(a: tuple[int, int, int, int], b: tuple[int, int, int, int]) -> bool:
    (ax, ay, aw, ah), (bx, by, bw, bh) = a, b
    iw, ih = min(ax + aw, bx + bw) - max(ax, bx), min(ay + ah, by + bh) - max(ay, by)
    small, large = sorted((aw * ah, bw * bh))
    return iw > 0 and ih > 0 and iw * ih > MAX_OVERLAP * small and large < ZOOM_AREA * small


def _jpeg(image: Any, quality: int) -> bytes:
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def crops(count: int, seed: int) -> list[Any]:
    """The ``count`` distinct crops of the seed, as resized RGB images (the same every time)."""
    from PIL import Image

    pictures = photos()
    rng = random.Random(seed)
    out = []
    for i, box in boxes([p.size for p in pictures], count, rng):
        crop = pictures[i].crop(box)
        scale = rng.randint(*LONGEST) / max(crop.size)
        out.append(crop.resize((max(1, round(crop.width * scale)), max(1, round(crop.height * scale))),
                               Image.Resampling.LANCZOS))
    return out


def make(folder: Path, distinct: int, variants_of: int, cross: int, seed: int) -> dict[str, Any]:
    """Write the corpus into ``folder`` (once: a ``corpus.json`` says it is whole); returns that record:
    ``distinct`` [names], ``variants`` {crop: [(kind, name)]}, ``cross`` [(crop, name)]."""
    record = folder / "corpus.json"
    if record.exists():
        return json.loads(record.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    rng = random.Random(seed + 1)
    names: list[str] = []
    variants: dict[str, list[tuple[str, str]]] = {}
    crossed: list[tuple[str, str]] = []
    for number, image in enumerate(crops(distinct, seed)):
        label = rng.choice(CLASSES)
        (folder / "source" / label).mkdir(parents=True, exist_ok=True)
        name = f"{label}/crop{number:05d}.jpg"
        (folder / "source" / name).write_bytes(_jpeg(image, rng.randint(85, 95)))
        names.append(name)
        if number < variants_of:
            variants[name] = write_variants(folder / "source", f"{label}/crop{number:05d}", image, rng)
        elif number < variants_of + cross:
            other = rng.choice([c for c in CLASSES if c != label])
            (folder / "source" / other).mkdir(parents=True, exist_ok=True)
            copy = f"{other}/crop{number:05d}_relabelled.jpg"
            (folder / "source" / copy).write_bytes(_jpeg(image, rng.randint(50, 95)))
            crossed.append((name, copy))
    out = {"seed": seed, "distinct": names, "variants": variants, "cross": crossed}
    record.write_text(json.dumps(out))
    return out


def build(source: Path, dest: Path, *extra: str, version: str = "v1", empty: bool = True) -> tuple[float, float, str]:
    """One CLI build of ``source`` into ``dest`` (emptied first: a full build): (CPU seconds, wall seconds,
    output)."""
    if empty:
        shutil.rmtree(dest, ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "image_tfrecords", "build", "--source", str(source),
                           "--destination", str(dest), "--dataset", "d", "--version", version, "--no-progress",
                           "--workers", "2", *extra], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        sys.exit(f"build failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, wall, done.stdout + done.stderr


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def spread(values: list[int]) -> str:
    """min / median / p90 / p95 / max of distances."""
    ordered = sorted(values)

    def at(q: float) -> int:
        return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]

    return (f"n {len(ordered):5d}  min {ordered[0]:2d}  median {statistics.median(ordered):4.1f}  p90 {at(0.9):2d}  "
            f"p95 {at(0.95):2d}  max {ordered[-1]:2d}")


def distances(corpus: dict[str, Any], inspected: dict[str, dict[str, str]]) -> None:
    """The crop-variant distances by kind and the distinct crops' pairwise distances."""
    import numpy as np

    from image_tfrecords.rules.near_duplicates import hash_array

    print("\n## Distances (bits of 63) between a crop and its variant")
    by_kind: dict[str, list[int]] = defaultdict(list)
    for crop, copies in corpus["variants"].items():
        for kind, copy in copies:
            a, b = inspected[crop]["phash"], inspected[copy]["phash"]
            if a and b:
                by_kind[kind].append((int(a, 16) ^ int(b, 16)).bit_count())
    for kind in KINDS:
        print(f"- {kind:13s} {spread(by_kind[kind])}  within 8: {_share(by_kind[kind], 8)}, within 10: "
              f"{_share(by_kind[kind], 10)}, within 12: {_share(by_kind[kind], 12)}")
    everything = [d for kind in KINDS for d in by_kind[kind]]
    print(f"- {'all':13s} {spread(everything)}")
    hashes = hash_array([inspected[name]["phash"] for name in corpus["distinct"]])
    n = len(hashes)
    low = np.full(n, 64)
    histogram = np.zeros(64, dtype=np.int64)
    for i in range(n - 1):
        d = np.bitwise_count(hashes[i] ^ hashes[i + 1:]).astype(np.int64)
        histogram += np.bincount(d, minlength=64)
        low[i] = min(low[i], d.min())
        low[i + 1:] = np.minimum(low[i + 1:], d)
    cumulative = np.cumsum(histogram)
    print(f"\n## Distances between the {n:,} distinct crops ({n * (n - 1) // 2:,} pairs)")
    print("- pairs within d bits: " + ", ".join(f"{d}: {int(cumulative[d])}" for d in range(4, 17, 2)))
    print(f"- each crop's nearest other crop: {spread(low.tolist())}")
    print("- crops whose nearest other crop is within d bits: "
          + ", ".join(f"{d}: {int((low <= d).sum())}" for d in range(4, 17, 2)))


def _share(values: list[int], bits: int) -> str:
    return f"{sum(v <= bits for v in values) / len(values):.1%}" if values else "-"


def figures(corpus: dict[str, Any], split: dict[str, str], group: dict[str, str],
            hashable: set[str] | None = None) -> dict[str, Any]:
    """Issue 51's figures from each stored file's split and group (a file in neither was not stored); with
    ``hashable``, the variant pairs of the crops in it alone."""
    pairs = [(crop, copy) for crop, copies in corpus["variants"].items() for _, copy in copies
             if hashable is None or crop in hashable]
    stored = [(a, b) for a, b in pairs if a in split and b in split]
    apart = sum(split[a] != split[b] for a, b in stored)
    grouped = sum(bool(group.get(a)) and group.get(a) == group.get(b) for a, b in pairs)
    members: dict[str, set[str]] = defaultdict(set)
    for name in corpus["distinct"]:
        if group.get(name):
            members[group[name]].add(name)
    merged = sum(len(m) for m in members.values() if len(m) > 1)
    cross_whole = sum(a in split and b in split for a, b in corpus["cross"])
    return {"pairs": len(pairs), "stored": len(stored), "apart": apart, "grouped": grouped,
            "distinct": len(corpus["distinct"]), "merged": merged, "cross": len(corpus["cross"]),
            "cross_whole": cross_whole,
            "distinct_stored": sum(name in split for name in corpus["distinct"])}


def report(title: str, f: dict[str, Any]) -> None:
    print(f"\n## {title}")
    print(f"- variant pairs in two splits: {f['apart']} of {f['stored']} stored ({f['pairs']} pairs)")
    print(f"- variant pairs grouped: {f['grouped']} of {f['pairs']} ({f['grouped'] / f['pairs']:.1%})")
    print(f"- distinct crops in a group with another distinct crop: {f['merged']} of {f['distinct']} "
          f"({1000 * f['merged'] / f['distinct']:.2f} per 1,000); distinct crops stored: {f['distinct_stored']}")
    print(f"- cross-label pairs with both images stored: {f['cross_whole']} of {f['cross']}")


def sweep(corpus: dict[str, Any], inspected: dict[str, dict[str, str]]) -> None:
    """The figures at other bit counts, from the build's hashes and the split stage's own rules."""
    from image_tfrecords.config import BuildConfig
    from image_tfrecords.rules.near_duplicates import gated, hash_array, place
    from image_tfrecords.rules.splits import assign_split

    cfg = BuildConfig("/in", "/out", "d", "v1")
    names = sorted(inspected)
    shas = [inspected[n]["sha256"] for n in names]
    labels = [n.split("/", 1)[0] for n in names]
    hashes = hash_array(["" if gated(inspected[n]) else inspected[n]["phash"] for n in names])
    print("\n## By near_duplicate_bits (the build's hashes and gate; the split stage's placement)")
    for bits in (6, 7, 8, 9, 10, 11, 12, 14):
        placement = place(names, shas, labels, hashes, {}, bits, cfg.salt, cfg.splits)
        split = {n: placement.split.get(i) or assign_split(shas[i], cfg.salt, cfg.splits)
                 for i, n in enumerate(names) if i not in placement.rejected}
        group = {names[i]: key for i, key in placement.group.items()}
        f = figures(corpus, split, group)
        print(f"- {bits:2d} bits: variant pairs apart {f['apart']:3d}, grouped {f['grouped'] / f['pairs']:.1%}, "
              f"distinct crops merged {f['merged']:3d} ({1000 * f['merged'] / f['distinct']:.2f}/1,000), "
              f"cross-label pairs stored whole {f['cross_whole']}")


def sizes(corpus_crops: list[Any], seed: int) -> None:
    """Hash reliability against image size, and the sample images: the measurements behind the gate."""
    import numpy as np

    from image_tfrecords.images.probe import inspect_image
    from image_tfrecords.images.sample import make_sample
    from image_tfrecords.rules.near_duplicates import gated

    rng = random.Random(seed + 2)
    print("\n## Hash reliability by size (300 crops, each with its 7 variants, shrunk to a shorter side)")
    print("| shorter side | JPEG thumbnail | variant distance p50 / p95 / max | variants within 8 "
          "| distinct pairs within 8 | crops with a distinct crop within 8 |")
    print("|---|---|---|---|---|---|")
    chosen = corpus_crops[:300]
    for short in (48, 64, 96, 128, 192, 256, 320):
        hashes, varied = [], []
        for image in chosen:
            scale = short / min(image.size)
            small = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))))
            own = inspect_image(_jpeg(small, 90)).phash
            hashes.append(int(own, 16))
            for kind in KINDS:
                varied.append((int(own, 16) ^ int(inspect_image(variant(small, kind, rng)[1]).phash, 16)).bit_count())
        h = np.array(hashes, dtype=np.uint64)
        d = np.bitwise_count(h[:, None] ^ h[None, :]).astype(np.int64)
        np.fill_diagonal(d, 64)
        ordered = sorted(varied)
        print(f"| {short} | {math.ceil(short / 8)} px | {ordered[len(ordered) // 2]} / "
              f"{ordered[math.ceil(0.95 * len(ordered)) - 1]} / {ordered[-1]} | {_share(varied, 8)} "
              f"| {int((d <= 8).sum()) // 2} of {len(h) * (len(h) - 1) // 2:,} | {int((d.min(axis=1) <= 8).sum())} |")
    with tempfile.TemporaryDirectory() as tmp:
        make_sample(tmp, per_class=20)
        facts = {p.relative_to(tmp).as_posix(): inspect_image(p.read_bytes()) for p in sorted(Path(tmp).rglob("*.*"))}
    close = [(a, b, (int(facts[a].phash, 16) ^ int(facts[b].phash, 16)).bit_count())
             for a, b in itertools.combinations(facts, 2)]
    close = [c for c in close if c[2] <= 12]
    left_out = [n for n, f in facts.items() if gated({"width": str(f.width), "height": str(f.height),
                                                      "contrast": f.contrast})]
    print("\n## The sample images (image-tfrecords sample, 60 images of 96-200 pixels): pairs within 12 bits: "
          + ", ".join(f"{a} {b} {d}" for a, b, d in sorted(close, key=lambda c: c[2]))
          + f"; left out by the gate: {len(left_out)} of {len(facts)}")


def bench_cost(images: int, rounds: int, work: Path) -> None:
    """CPU seconds of a full build and of a 1% night (images of a seed-101 corpus added to the class folders)
    on ``make_corpus``'s corpus of ``images`` (``bench/common``: 5% PNG), default and search off, taking turns;
    each side's night on a first version built with its own setting."""
    from bench.common import make_corpus

    corpus, _ = make_corpus(images, work)
    extra, _ = make_corpus(max(1, images // 100), work, seed=101)
    print(f"\n## Cost on the bench corpus ({images:,} images) and a night adding {images // 100:,}: CPU s (wall s)")
    times: dict[str, list[tuple[float, float, float, float]]] = {"default": [], "off": []}
    with tempfile.TemporaryDirectory(dir=work) as tmp:
        for _ in range(rounds):
            for side, flags in (("default", ()), ("off", ("--near-duplicate-bits", "0"))):
                source, dest = Path(tmp) / "source", Path(tmp) / "out"
                shutil.rmtree(source, ignore_errors=True)
                subprocess.run(["cp", "-al", str(corpus), str(source)], check=True)
                full_cpu, full_wall, _ = build(source, dest, *flags)
                for path in extra.rglob("*.*"):
                    os.link(path, source / path.relative_to(extra).parent / f"night-{path.name}")
                night_cpu, night_wall, _ = build(source, dest, *flags, version="v2", empty=False)
                times[side].append((full_cpu, full_wall, night_cpu, night_wall))
    for side, runs in times.items():
        full, night = [r[0] for r in runs], [r[2] for r in runs]
        print(f"- {side}: full build {statistics.median(full):.2f} ({', '.join(f'{c:.2f}' for c in full)}; wall "
              f"{statistics.median(r[1] for r in runs):.2f}), night {statistics.median(night):.2f} "
              f"({', '.join(f'{c:.2f}' for c in night)}; wall {statistics.median(r[3] for r in runs):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--distinct", type=int, default=2000)
    parser.add_argument("--variants-of", type=int, default=400)
    parser.add_argument("--cross", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep", action="store_true", help="the figures at other near_duplicate_bits")
    parser.add_argument("--sizes", action="store_true", help="hash reliability by image size; the sample images")
    parser.add_argument("--cost", type=int, default=0, metavar="ROUNDS", help="time builds with and without")
    parser.add_argument("--cost-bench", type=int, default=0, metavar="IMAGES",
                        help="only: the cost on the bench corpus of this many images (full build and a night)")
    parser.add_argument("--work", default=str(ROOT / ".bench"))
    args = parser.parse_args()
    if args.cost_bench:
        bench_cost(args.cost_bench, max(1, args.cost), Path(args.work))
        return
    from image_tfrecords.options import default
    from image_tfrecords.rules.near_duplicates import GATE, gated

    folder = Path(args.work) / f"near-duplicates-{args.seed}-{args.distinct}-{args.variants_of}-{args.cross}"
    corpus = make(folder, args.distinct, args.variants_of, args.cross, args.seed)
    total = len(corpus["distinct"]) + sum(len(v) for v in corpus["variants"].values()) + len(corpus["cross"])
    print(f"# Near-duplicates on real photo pixels (seed {args.seed}): {len(corpus['distinct']):,} distinct crops, "
          f"{len(corpus['variants'])} with {len(KINDS)} variants each, {len(corpus['cross'])} re-encoded under "
          f"another label: {total:,} images")
    print(f"default near_duplicate_bits {default('near_duplicate_bits')}, near_duplicate_labels "
          f"{default('near_duplicate_labels')}; gate: {GATE}")
    dest = folder / "out"
    cpu, wall, _ = build(folder / "source", dest)
    version = dest / "d" / "v1"
    inspected = {row["filename"]: row for row in rows(version / "inspected.csv") if not row["reason"]}
    distances(corpus, inspected)
    split = {row["filename"]: row["split"] for row in rows(version / "labels.csv")}
    group = {row["filename"]: row["near_group"] for row in rows(version / "near_duplicates.csv")}
    near = json.loads((version / "manifest.json").read_text())["build"]["near_duplicates"]
    report(f"The default build ({cpu:.1f} CPU s, {wall:.1f} s wall; build.near_duplicates {json.dumps(near)})",
           figures(corpus, split, group))
    hashable = {name for name, row in inspected.items() if not gated(row)}
    report(f"The same build, the variant pairs of the {len(hashable & set(corpus['variants']))} crops the gate "
           f"lets through (of {len(corpus['variants'])})", figures(corpus, split, group, hashable))
    if args.sweep:
        sweep(corpus, inspected)
    if args.sizes:
        sizes(crops(300, args.seed), args.seed)
    if args.cost:
        print(f"\n## Cost: full builds of the {total:,} images, default and --near-duplicate-bits 0, taking turns")
        times: dict[str, list[tuple[float, float]]] = {"default": [], "off": []}
        for _ in range(args.cost):
            for side, extra in (("default", ()), ("off", ("--near-duplicate-bits", "0"))):
                cpu, wall, _ = build(folder / "source", folder / f"cost-{side}", *extra)
                times[side].append((cpu, wall))
        for side, runs in times.items():
            print(f"- {side}: CPU s {statistics.median(c for c, _ in runs):.2f} (median of {len(runs)}: "
                  f"{', '.join(f'{c:.2f}' for c, _ in runs)}), wall s {statistics.median(w for _, w in runs):.2f}")


if __name__ == "__main__":
    main()
