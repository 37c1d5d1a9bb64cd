"""Records per second of the readers of one published version (issue 26), one contender at a time.

    python bench/reader_rates.py VERSION_URI CONTENDER [--decode] [--warm N] [--timed N] [--workers N] [--rounds N]

Run by ``bench/readers.py``: the torch, Grain and ``tfrecord`` contenders in the reader venv
(``tools/reader_venv.py``), ``tf-data`` in the dev venv (TensorFlow); prints one JSON line. Every contender
reads the train split in a shuffled order (``tfrecord`` in its own order: it has no index-level shuffle)
with the same fields (image bytes, label, filename) and, with ``--decode``, the same decoding: Pillow to
RGB, resized to 224x224 (``decode_image``; ``tf.data``: ``load_split``'s own, ``tf.io.decode_image`` and
``tf.image.resize``). Batches of 64, except the single-record loops.

The rate is taken between two points of the stream, both after ``--warm`` records (so worker start-up,
the first file reads and a shuffle buffer's fill are left out) and with a DataLoader's prefetch queue
as full at the end as at the start: ``--timed`` records, then the loop stops (before the epoch ends).
``--rounds N`` takes it N times in the process, each from a new reader (new DataLoader workers), and
reports the median (the rates of each round beside it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable, Generator, Iterable
from pathlib import Path
from typing import Any

SPLIT, BATCH, SIZE, SEED, SHUFFLE = "train", 64, (224, 224), 26, 1024
FIELDS = ("image", "label", "filename")
GRAIN_THREADS = 2
CONTENDERS = ("source", "source-all-fields", "loader", "loader-packed", "grain", "tfrecord", "tfrecord-packed",
              "tf-data", "in-memory", "in-memory-packed")


def _decode(image: bytes) -> Any:
    from image_tfrecords.readers.decode import decode_image

    return decode_image(image, 3, SIZE)


def _to_tensor(image: bytes) -> Any:
    import numpy as np
    import torch

    return torch.from_numpy(np.ascontiguousarray(_decode(image).transpose(2, 0, 1)))  # as ImageDataset does


def _source(all_fields: bool = False) -> Any:
    from image_tfrecords import RecordSource

    return RecordSource(ARGS.version, SPLIT, fields=None if all_fields else FIELDS)


def _order(count: int) -> list[int]:
    import random

    order = list(range(count))
    random.Random(SEED).shuffle(order)
    return order


# -- the contenders: each yields the sizes of what it delivers (records, or batches of records) ------------------
def source(all_fields: bool = False) -> Generator[int, None, None]:
    """``RecordSource[i]`` in a loop, one process (decoded in the loop with ``--decode``)."""
    src = _source(all_fields)
    for i in _order(len(src)):
        record = src[i]
        if ARGS.decode:
            _decode(record["image"])
        yield 1


def loader(packed: bool = False) -> Generator[int, None, None]:
    """``ImageDataset`` through ``DataLoader(shuffle=True, num_workers=N)``; ``packed``: with
    ``collate_fn=collate_bytes`` (a batch's image bytes in one tensor, in a buffer the worker reuses)."""
    import torch

    from image_tfrecords.readers.torch_dataset import ImageDataset, collate_bytes

    dataset = ImageDataset(_source(), decode=ARGS.decode, image_size=SIZE if ARGS.decode else None)
    generator = torch.Generator().manual_seed(SEED)
    for batch in torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True, num_workers=ARGS.workers,
                                             generator=generator, collate_fn=collate_bytes if packed else None):
        yield len(batch["label"])


def grain() -> Generator[int, None, None]:
    """``grain.MapDataset.source(RecordSource).shuffle(seed)``, ``.map(decode)`` with ``--decode``, iterated
    record by record with 2 read threads and a prefetch buffer of 16 (Grain 0.2.18's default, 16 threads
    and 500, checks every buffered future on each step: 4x slower here; its ``batch`` would pad the
    image bytes of a batch to one length)."""
    import grain as gr

    dataset = gr.MapDataset.source(_source()).shuffle(seed=SEED)
    if ARGS.decode:
        dataset = dataset.map(lambda r: {**r, "image": _decode(r["image"])})
    for _ in dataset.to_iter_dataset(gr.ReadOptions(num_threads=GRAIN_THREADS, prefetch_buffer_size=16)):
        yield 1


def tfrecord(packed: bool = False) -> Generator[int, None, None]:
    """The ``tfrecord`` package's ``MultiTFRecordDataset`` (with the index files, ``infinite=False``) through
    ``DataLoader(num_workers=N)``, the image decoded in its ``transform``; ``packed``: with our
    ``collate_bytes`` for its ``image/encoded`` (what it would get from the same transport)."""
    import functools

    import torch
    from tfrecord.torch.dataset import MultiTFRecordDataset

    from image_tfrecords.readers.torch_dataset import collate_bytes

    version = ARGS.version
    manifest = json.loads(Path(version, "manifest.json").read_text())
    shards = {s["file"].removesuffix(".tfrecord"): s["num_records"] for s in manifest["splits"][SPLIT]["shards"]}
    description = {"image/encoded": "byte", "image/class/label": "int", "image/filename": "byte"}
    transform = _decode_tfrecord if ARGS.decode else None
    dataset = MultiTFRecordDataset(version + "/{}.tfrecord", version + "/{}.tfindex", shards, description,
                                   transform=transform, infinite=False)
    collate = functools.partial(collate_bytes, key="image/encoded") if packed else None
    for batch in torch.utils.data.DataLoader(dataset, batch_size=BATCH, num_workers=ARGS.workers, collate_fn=collate):
        yield len(batch["image/class/label"])


def _decode_tfrecord(record: dict[str, Any]) -> dict[str, Any]:
    return {**record, "image/encoded": _to_tensor(record["image/encoded"])}


def tf_data() -> Generator[int, None, None]:
    """``load_split(shuffle=1024, batch_size=64)``: tf.data's own parallel decode and resize with ``--decode``
    (a buffer of the whole split would be filled, every record read, before the first comes out)."""
    from image_tfrecords import load_split

    if ARGS.decode:
        dataset = load_split(ARGS.version, SPLIT, image_size=SIZE, channels=3, batch_size=BATCH, shuffle=SHUFFLE,
                             seed=SEED)
    else:
        dataset = load_split(ARGS.version, SPLIT, decode=False, batch_size=BATCH, shuffle=SHUFFLE, seed=SEED)
    for _, labels in dataset:
        yield int(labels.shape[0])


def in_memory(packed: bool = False) -> Generator[int, None, None]:
    """The references: the split's records (the same fields) held in memory and delivered by the same
    DataLoader as ``loader``, so nothing is read: with ``--decode``, what decoding alone costs; without,
    what moving the records from the workers to the training loop costs (``packed``: with
    ``collate_bytes``)."""
    import torch

    from image_tfrecords.readers.torch_dataset import collate_bytes

    records = _held()

    class Held(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(records)

        def __getitem__(self, i: int) -> dict[str, Any]:
            record = records[i]
            return {**record, "image": _to_tensor(record["image"])} if ARGS.decode else record

    generator = torch.Generator().manual_seed(SEED)
    for batch in torch.utils.data.DataLoader(Held(), batch_size=BATCH, shuffle=True, num_workers=ARGS.workers,
                                             generator=generator, collate_fn=collate_bytes if packed else None):
        yield len(batch["label"])


_HELD: list[dict[str, Any]] = []


def _held() -> list[dict[str, Any]]:
    """The split's records, read once per process (the rounds share them)."""
    if not _HELD:
        src = _source()
        _HELD.extend(src[i] for i in range(len(src)))
    return _HELD


def rate(stream: Iterable[int], warm: int, timed: int) -> dict[str, Any]:
    """Records/s between the first point past ``warm`` records and the first past ``warm + timed``."""
    seen, start, started_at = 0, 0.0, 0
    began = time.perf_counter()
    for size in stream:
        seen += size
        if not start and seen >= warm:
            start, started_at = time.perf_counter(), seen
        elif start and seen - started_at >= timed:
            seconds = time.perf_counter() - start
            return {"records_per_s": (seen - started_at) / seconds, "timed_records": seen - started_at,
                    "seconds": seconds, "warm_seconds": start - began}
    raise RuntimeError(f"the split ended after {seen} records: fewer than --warm + --timed ({warm} + {timed})")


RUNNERS: dict[str, Callable[[], Generator[int, None, None]]] = {
    "source": source, "source-all-fields": lambda: source(all_fields=True), "loader": loader,
    "loader-packed": lambda: loader(packed=True), "grain": grain, "tfrecord": tfrecord,
    "tfrecord-packed": lambda: tfrecord(packed=True), "tf-data": tf_data, "in-memory": in_memory,
    "in-memory-packed": lambda: in_memory(packed=True)}


def main(argv: list[str] | None = None) -> int:
    global ARGS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("version")
    parser.add_argument("contender", choices=CONTENDERS)
    parser.add_argument("--decode", action="store_true")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--warm", type=int, default=256)
    parser.add_argument("--timed", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=1)
    ARGS = parser.parse_args(argv)
    results = []
    for _ in range(ARGS.rounds):
        stream = RUNNERS[ARGS.contender]()
        results.append(rate(stream, ARGS.warm, ARGS.timed))
        stream.close()  # a DataLoader's workers end here, before the next round's start
    rates = sorted(r["records_per_s"] for r in results)
    median = statistics.median(rates)
    print(json.dumps({"contender": ARGS.contender, "decode": ARGS.decode, "workers": ARGS.workers,
                      **min(results, key=lambda r: abs(r["records_per_s"] - median)), "records_per_s": median,
                      "rounds": [r["records_per_s"] for r in results]}))
    sys.stdout.flush()
    return 0


ARGS = argparse.Namespace()

if __name__ == "__main__":
    sys.exit(main())
