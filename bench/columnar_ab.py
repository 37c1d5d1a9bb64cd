"""Issue 52's choice of a columnar library, measured: pyarrow against polars on the passes over labels.csv rows
(read with typed columns, join with the previous version's rows on filename, count per split and label, write CSV),
on rows made here (1% of them with hostile names: comma, quote, newline, carriage return, spaces, tab, non-ASCII;
2% with an empty field, as an image not measured has), and whether each writes the bytes this package's CSV writer
writes today. Best of 5, in this process.

    (polars is pinned in requirements.in; pyarrow comes with Airflow)
    .venv/bin/python bench/columnar_ab.py [ROWS]   # default 100000
"""

from __future__ import annotations

import hashlib
import io
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "include"))

from image_tfrecords.storage.documents import csv_writer

FIELDS = ("filename", "label", "label_id", "split", "sha256", "width", "height", "channels", "format", "num_bytes",
          "brightness", "contrast", "shard", "shard_position")
INTEGERS = {"label_id", "width", "height", "channels", "num_bytes", "shard_position"}
LABELS = ("cats", "dogs", "birds", "fish, sea", 'say "hi"')
HOSTILE = ("a,b.jpg", 'q"uote.jpg', "new\nline.jpg", "cr\rret.jpg", " lead.jpg", "tail .jpg", "ünï.jpg", "tab\t.jpg",
           "")


def make_rows(n: int, seed: int) -> list[list[str]]:
    """``n`` labels.csv-like rows, reproducible from ``seed``; every hundredth has a hostile name."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = LABELS[i % len(LABELS)]
        name = f"{label}/img_{i:07d}.jpg" if i % 100 else f"{label}/{HOSTILE[(i // 100) % len(HOSTILE)]}{i}"
        rows.append([name, label, str(i % 5), rng.choice(["train", "validation", "test"]),
                     hashlib.sha256(f"{seed}{i}".encode()).hexdigest(), str(rng.randint(64, 4000)),
                     str(rng.randint(64, 4000)), "3", "jpeg", str(rng.randint(1000, 10**6)),
                     f"{rng.random() * 255:.2f}" if i % 50 else "", f"{rng.random() * 100:.2f}",
                     f"train-{i % 40:05d}-of-00040.tfrecord", str(i // 40)])
    return rows


def ours(rows: list[list[str]]) -> bytes:
    """The rows as this package writes CSV today (``storage.documents.csv_writer``)."""
    text = io.StringIO()
    writer = csv_writer(text)
    writer.writerow(FIELDS)
    writer.writerows(rows)
    return text.getvalue().encode()


def best(run: Callable[[], Any], rounds: int = 5) -> tuple[float, Any]:
    """The fastest of ``rounds`` calls, and the last call's result."""
    times, out = [], None
    for _ in range(rounds):
        started = time.perf_counter()
        out = run()
        times.append(time.perf_counter() - started)
    return min(times), out


def with_pyarrow(now: Path, previous: Path) -> tuple[Callable[[], Any], Callable[[], Any], str]:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.csv as pacsv

    types = {f: pa.int64() if f in INTEGERS else pa.string() for f in FIELDS}

    def read(path: Path) -> Any:
        return pacsv.read_csv(path, parse_options=pacsv.ParseOptions(newlines_in_values=True),
                              convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False,
                                                                   quoted_strings_can_be_null=False))

    def passes() -> tuple[int, int, bytes]:
        table, before = read(now), read(previous)
        joined = table.join(before.select(["filename", "sha256"]).rename_columns(["filename", "before"]),
                            "filename", join_type="left outer")
        changed = pc.sum(pc.not_equal(joined["sha256"], joined["before"])).as_py()
        groups = table.group_by(["split", "label"]).aggregate([("filename", "count")]).num_rows
        sink = io.BytesIO()
        pacsv.write_csv(table, sink, write_options=pacsv.WriteOptions(quoting_style="needed", eol="\n"))
        return changed, groups, sink.getvalue()

    return passes, lambda: read(now), f"pyarrow {pa.__version__}"


def with_polars(now: Path, previous: Path) -> tuple[Callable[[], Any], Callable[[], Any], str]:
    import polars as pl

    schema = {f: pl.Int64 if f in INTEGERS else pl.Utf8 for f in FIELDS}

    def read(path: Path) -> Any:
        return pl.read_csv(path, schema=schema)  # an empty field is null, written back empty

    def passes() -> tuple[int, int, bytes]:
        table, before = read(now), read(previous)
        joined = table.join(before.select(["filename", pl.col("sha256").alias("before")]), on="filename", how="left")
        changed = int((joined["sha256"] != joined["before"]).sum())
        groups = table.group_by(["split", "label"]).len().height
        sink = io.BytesIO()
        table.write_csv(sink, quote_style="necessary", line_terminator="\n")
        return changed, groups, sink.getvalue()

    return passes, lambda: read(now), f"polars {pl.__version__}"


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    rows, before = make_rows(n, 1), make_rows(n, 1)
    for i in range(0, n, 97):  # 1% changed
        before[i][4] = "0" * 64
    work = Path(tempfile.mkdtemp(prefix="columnar-"))
    expected = ours(rows)
    (work / "labels.csv").write_bytes(expected)
    (work / "prev.csv").write_bytes(ours(before))
    print(f"{n} rows, {len(expected) / 1e6:.1f} MB; {len(range(0, n, 97))} changed")
    for library in (with_pyarrow, with_polars):
        try:
            passes, read, name = library(work / "labels.csv", work / "prev.csv")
        except ImportError as exc:
            print(f"{library.__name__}: not installed ({exc})")
            continue
        seconds, (changed, groups, written) = best(passes)
        read_seconds, _ = best(read)
        same = written == expected
        print(f"{name}: read, join, group, write {seconds * 1e3:.0f} ms ({seconds / n * 1e6:.2f} us a row); read "
              f"alone {read_seconds * 1e3:.0f} ms; changed {changed}, groups {groups}; today's bytes: {same}")
        if not same:
            lines = [(a, b) for a, b in zip(expected.split(b"\n"), written.split(b"\n"), strict=False) if a != b]
            print(f"  first of {len(lines)} differing lines: {lines[0][0][:100]!r} -> {lines[0][1][:100]!r}")


if __name__ == "__main__":
    main()
