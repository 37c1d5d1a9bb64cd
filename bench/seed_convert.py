"""The classic converter, as the tutorials this project grew from write it: the benchmark's baseline.

A faithful TF2 port of tensorflow/models' ``research/inception/inception/data/build_image_data.py``
(threads, shard ranges, ``ImageCoder``), with the folder walk, seeded shuffle split and ``labels.txt``
of TF-slim's ``datasets/download_and_convert_flowers.py``. Not sabotaged, not optimised:

- one folder per class; class ids are indexes in the sorted class names (0-based, as in slim);
  files anywhere below a class folder, hidden names skipped (``tf.io.gfile.glob('*')`` skips them);
- the file list (sorted, so the walk order is the same on every file system) is shuffled with
  ``random.Random(seed)``, then cut: the first ``validation_fraction`` to validation, the next
  ``test_fraction`` to test, the rest to train;
- every file is read with ``tf.io.gfile.GFile``; a ``.png`` is converted to a quality-100 JPEG with
  TensorFlow, and every image is decoded with ``tf.io.decode_jpeg(channels=3)`` to learn its size
  (eager ops replace the TF1 session/placeholders; one shared coder, as in the seed); a file that
  fails is printed as SKIPPED and left out, as in the seed;
- one ``tf.train.Example`` per image with the contract's keys (no ``image/sha256``):
  ``image/format`` is always ``jpeg`` and ``image/channels`` always 3, as in the seed;
  ``image/filename`` is the path relative to the source (the seed stores the basename);
- ``--threads N``: for each split in turn, N ``threading.Thread``s, each with a contiguous range of
  the split's files, writing its own ``shards_per_split / N`` shards with ``tf.io.TFRecordWriter``
  (N must divide the shard count, as the seed asserts); ``--threads 1`` runs in the main thread;
- output ``{split}-{i:05d}-of-{n:05d}.tfrecord`` and ``labels.txt`` (``id:name`` lines, as slim).

TensorFlow is imported inside ``main`` so its import (several seconds) is part of the measured time,
as it is for a user running the script. The last stdout line is a JSON summary (images, seconds
from the start of ``main`` including that import, bytes of shards written); progress goes to stderr.

    python bench/seed_convert.py --source DIR --output DIR [--threads 1|N] [--shards-per-split 2]
        [--seed 0] [--validation-fraction 0.1] [--test-fraction 0.1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class ImageFile:
    """One source file: absolute path, path relative to the source, class name and id."""

    path: str
    relpath: str
    text: str
    label: int


def find_image_files(source: str) -> tuple[list[ImageFile], list[str]]:
    """(files sorted by relative path, sorted class names) of a one-folder-per-class tree."""
    classes = sorted(n for n in os.listdir(source) if not n.startswith(".") and os.path.isdir(os.path.join(source, n)))
    files = []
    for label, text in enumerate(classes):
        for root, dirs, names in os.walk(os.path.join(source, text)):
            dirs[:] = sorted(d for d in dirs if not d.startswith("."))
            for name in sorted(names):
                if not name.startswith("."):
                    path = os.path.join(root, name)
                    files.append(ImageFile(path, os.path.relpath(path, source).replace(os.sep, "/"), text, label))
    return files, classes


def split_files(files: list[ImageFile], seed: int, validation_fraction: float,
                test_fraction: float) -> dict[str, list[ImageFile]]:
    """Seeded shuffle of the list, then validation, test and train cut from it in that order."""
    shuffled = list(files)
    random.Random(seed).shuffle(shuffled)
    n_val = round(len(shuffled) * validation_fraction)
    n_test = round(len(shuffled) * test_fraction)
    cut = {"validation": shuffled[:n_val], "test": shuffled[n_val:n_val + n_test], "train": shuffled[n_val + n_test:]}
    fractions = {"train": 1.0, "validation": validation_fraction, "test": test_fraction}
    return {name: cut[name] for name in SPLITS if fractions[name] > 0}


def spacing(start: int, stop: int, parts: int) -> list[int]:
    """``parts + 1`` boundaries cutting [start, stop) into contiguous, balanced ranges."""
    return [start + (stop - start) * i // parts for i in range(parts + 1)]


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def log(message: str) -> None:
    print(f"{datetime.now()} {message}", file=sys.stderr, flush=True)


class ImageCoder:
    """build_image_data's ImageCoder with eager ops: PNG to JPEG, and decoding a JPEG."""

    def __init__(self) -> None:
        import tensorflow as tf

        self._tf = tf

    def png_to_jpeg(self, image_data: bytes) -> bytes:
        image = self._tf.io.decode_png(image_data, channels=3)
        return self._tf.io.encode_jpeg(image, format="rgb", quality=100).numpy()

    def decode_jpeg(self, image_data: bytes) -> tuple[int, int, int]:
        """(height, width, channels) of the decoded RGB image."""
        shape = tuple(self._tf.io.decode_jpeg(image_data, channels=3).shape)
        assert len(shape) == 3 and shape[2] == 3
        return shape  # type: ignore[return-value]


def process_image(path: str, coder: ImageCoder) -> tuple[bytes, int, int, int]:
    """(JPEG bytes, height, width, channels) of one file, PNGs converted as the seed does."""
    import tensorflow as tf

    with tf.io.gfile.GFile(path, "rb") as f:
        image_data = f.read()
    if path.endswith(".png"):
        print(f"Converting PNG to JPEG for {path}", file=sys.stderr)
        image_data = coder.png_to_jpeg(image_data)
    height, width, channels = coder.decode_jpeg(image_data)
    return image_data, height, width, channels


def to_example(item: ImageFile, image_data: bytes, height: int, width: int, channels: int) -> Any:
    """The ``tf.train.Example`` of one image, built the seed's way."""
    import tensorflow as tf

    def int64(value: int) -> Any:
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))

    def string(value: bytes) -> Any:
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))

    return tf.train.Example(features=tf.train.Features(feature={
        "image/encoded": string(image_data),
        "image/format": string(b"jpeg"),
        "image/height": int64(height),
        "image/width": int64(width),
        "image/channels": int64(channels),
        "image/class/label": int64(item.label),
        "image/class/text": string(item.text.encode()),
        "image/filename": string(item.relpath.encode()),
    }))


@dataclass
class Tally:
    """Images written and skipped by one thread."""

    written: int = 0
    skipped: int = 0


def write_batch(coder: ImageCoder, thread_index: int, ranges: list[tuple[int, int]], split: str,
                files: list[ImageFile], num_shards: int, output: str, tally: Tally) -> None:
    """One thread's work: its range of files into its own ``num_shards / threads`` shards."""
    import tensorflow as tf

    per_thread = num_shards // len(ranges)
    bounds = spacing(*ranges[thread_index], per_thread)
    for s in range(per_thread):
        shard = thread_index * per_thread + s
        path = os.path.join(output, shard_name(split, shard, num_shards))
        in_shard = 0
        with tf.io.TFRecordWriter(path) as writer:
            for item in files[bounds[s]:bounds[s + 1]]:
                try:
                    image_data, height, width, channels = process_image(item.path, coder)
                except Exception as e:  # the seed's behaviour: report, skip, carry on
                    print(f"{e}\nSKIPPED: Unexpected error while decoding {item.path}.", file=sys.stderr)
                    tally.skipped += 1
                    continue
                writer.write(to_example(item, image_data, height, width, channels).SerializeToString())
                in_shard += 1
                tally.written += 1
                if not tally.written % 1000:
                    log(f"[thread {thread_index}]: Processed {tally.written} images in thread batch.")
        log(f"[thread {thread_index}]: Wrote {in_shard} images to {path}")


def write_split(coder: ImageCoder, split: str, files: list[ImageFile], num_shards: int, threads: int,
                output: str) -> Tally:
    """All of one split's shards, by ``threads`` threads (the main thread alone when 1)."""
    bounds = spacing(0, len(files), threads)
    ranges = list(itertools.pairwise(bounds))
    tallies = [Tally() for _ in ranges]
    if threads == 1:
        write_batch(coder, 0, ranges, split, files, num_shards, output, tallies[0])
    else:
        errors: list[BaseException] = []

        def run(index: int) -> None:
            try:
                write_batch(coder, index, ranges, split, files, num_shards, output, tallies[index])
            except BaseException as e:
                errors.append(e)

        workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        if errors:
            raise errors[0]
    log(f"Finished writing all {len(files)} images in {split}.")
    return Tally(sum(t.written for t in tallies), sum(t.skipped for t in tallies))


def write_labels(classes: list[str], output: str) -> None:
    with open(os.path.join(output, "labels.txt"), "w", encoding="utf-8") as f:
        f.writelines(f"{i}:{name}\n" for i, name in enumerate(classes))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Classic build_image_data-style converter (benchmark baseline).")
    ap.add_argument("--source", required=True, help="folder with one sub-folder per class")
    ap.add_argument("--output", required=True, help="folder for the shards and labels.txt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shards-per-split", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--validation-fraction", type=float, default=0.1)
    ap.add_argument("--test-fraction", type=float, default=0.1)
    args = ap.parse_args(argv)
    if args.threads < 1 or args.shards_per_split < 1 or args.shards_per_split % args.threads:
        ap.error("--threads must be >= 1 and divide --shards-per-split (as build_image_data asserts)")
    if min(args.validation_fraction, args.test_fraction) < 0 or args.validation_fraction + args.test_fraction >= 1:
        ap.error("fractions must be >= 0 and sum to less than 1")
    if not os.path.isdir(args.source):
        ap.error(f"--source {args.source} is not a folder")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """Convert, print the JSON summary line and return it."""
    start = time.perf_counter()
    args = parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow  # noqa: F401  (timed on purpose: the classic script pays for it too)

    import_seconds = time.perf_counter() - start
    files, classes = find_image_files(args.source)
    if not files:
        sys.exit(f"no files in class folders under {args.source}")
    os.makedirs(args.output, exist_ok=True)
    coder = ImageCoder()
    counts: dict[str, int] = {}
    skipped = nbytes = 0
    for split, members in split_files(files, args.seed, args.validation_fraction, args.test_fraction).items():
        tally = write_split(coder, split, members, args.shards_per_split, args.threads, args.output)
        counts[split] = tally.written
        skipped += tally.skipped
        nbytes += sum(os.path.getsize(os.path.join(args.output, shard_name(split, i, args.shards_per_split)))
                      for i in range(args.shards_per_split))
    write_labels(classes, args.output)
    summary = {"tool": "seed_convert", "threads": args.threads, "images": sum(counts.values()),
               "skipped": skipped, "splits": counts, "shards": len(counts) * args.shards_per_split,
               "bytes": nbytes, "seconds": round(time.perf_counter() - start, 3),
               "import_seconds": round(import_seconds, 3)}
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    main()
