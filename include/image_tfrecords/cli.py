"""Command line: the same pipeline as the DAG, without Airflow.

    python -m include.image_tfrecords build --source SRC --destination DEST --dataset NAME ...
    python -m include.image_tfrecords sample OUT [--per-class N]

S3 credentials and endpoint come from boto3's standard environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL). User errors print one line and exit non-zero.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime
from functools import partial
from typing import Any

from . import stages
from .config import DEFAULT_SPLITS, BuildConfig, ConfigError, parse_splits
from .storage import Storage, StorageError, StoreUnreachable


def default_version(now: datetime | None = None) -> str:
    """A sortable version name from the current UTC time, e.g. ``20261122T031500Z``."""
    return (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m include.image_tfrecords",
                                     description="Turn folders of labelled images into TFRecord datasets.")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build, validate and publish a dataset version")
    build.add_argument("--source", required=True, help="local folder or s3://bucket/prefix of images")
    build.add_argument("--destination", required=True, help="local folder or s3://bucket/prefix")
    build.add_argument("--dataset", required=True, help="dataset name (a folder under the destination)")
    build.add_argument("--version", help="version name (default: current UTC time, YYYYMMDDTHHMMSSZ)")
    build.add_argument("--splits", default=",".join(f"{k}={v}" for k, v in DEFAULT_SPLITS.items()),
                       help="split fractions, summing to 1 (default: %(default)s)")
    build.add_argument("--salt", default="", help="string that seeds the split assignment (default: empty)")
    build.add_argument("--shard-size-mb", type=float, default=100.0, help="target shard size in MB (default: 100)")
    build.add_argument("--compression", choices=("none", "gzip"), default="none")
    build.add_argument("--max-reject-fraction", type=float, default=0.2,
                       help="fail, publishing nothing, if more than this share of files is rejected (default 0.2)")
    build.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                       help="processes writing and validating shards (default: CPU count)")
    build.add_argument("--as-of", help="only files modified at or before this ISO 8601 time (default: all)")
    build.add_argument("--no-progress", action="store_true", help="no progress bars")
    sample = commands.add_parser("sample", help="write a small demo image folder")
    sample.add_argument("out")
    sample.add_argument("--per-class", type=int, default=20)
    sample.add_argument("--seed", type=int, default=0)
    return parser


class _Bar:
    """A tqdm progress bar on stderr (or nothing)."""

    def __init__(self, enabled: bool, desc: str, total: int | None) -> None:
        self._bar = None
        if enabled:
            from tqdm import tqdm

            self._bar = tqdm(total=total, desc=desc, unit="img", file=sys.stderr, leave=False)

    def __call__(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def __enter__(self) -> _Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()


def build(cfg: BuildConfig, workers: int = 1, progress: bool = True,
          storage: Storage | None = None) -> dict[str, Any]:
    """Run every stage; shards are written and validated by ``workers`` processes."""
    storage = storage or Storage()
    workers = max(1, workers)
    found = stages.discover_stage(cfg, storage)
    with ProcessPoolExecutor(max_workers=workers) if workers > 1 else _Inline() as pool:
        with _Bar(progress, "inspect", found["candidates"]) as bar:  # one process: 2 threads
            stages.inspect_stage(cfg, storage, workers=max(2, workers), progress=bar,
                                 processes=pool if workers > 1 else None)
        split = stages.split_stage(cfg, storage)
        plan = stages.plan_stage(cfg, storage)
        shard_files = [f for task in range(plan["num_tasks"]) for f in stages.task_shards(cfg, storage, task)]
        results: list[dict[str, Any]] = []
        with _Bar(progress, "write", split["num_records"]) as bar:
            for receipt in pool.map(partial(stages.write_shard, cfg, storage), shard_files):
                bar(receipt["num_records"])
        with _Bar(progress, "validate", split["num_records"]) as bar:
            for result in pool.map(partial(stages.validate_shard, cfg, storage), shard_files):
                results.append(result)
                bar(result["num_records"])
    stages.validate_stage(cfg, storage, results)
    stages.card_stage(cfg, storage)
    return stages.publish_stage(cfg, storage)


class _Inline:
    """The executor interface, in this process."""

    def map(self, fn, items):  # type: ignore[no-untyped-def]
        return map(fn, items)

    def __enter__(self) -> _Inline:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


def _summary(cfg: BuildConfig, result: dict[str, Any], seconds: float, storage: Storage) -> str:
    manifest = stages.read_json(storage, f"{result['uri']}/{stages.MANIFEST}")
    megabytes = sum(s["num_bytes"] for split in manifest["splits"].values() for s in split["shards"]) / 1e6
    lines = [f"published {cfg.dataset} version {cfg.version} to {result['uri']}"
             + (" (already published: nothing changed)" if result["already_published"] else "")]
    for name in cfg.splits:
        split = manifest["splits"][name]
        lines.append(f"  {name:<12} {split['num_records']:>8} records in {len(split['shards'])} shard(s)")
    lines.append(f"  rejected     {manifest['num_rejected']:>8}"
                 + (f"  ({', '.join(f'{k}: {v}' for k, v in manifest['rejects_by_reason'].items())})"
                    if manifest["num_rejected"] else "") + f"   skipped (not images): {manifest['num_skipped']}")
    lines.append(f"  {manifest['num_records']} records, {megabytes:.1f} MB in {seconds:.1f} s "
                 f"({manifest['num_records'] / max(seconds, 1e-9):.0f} images/s); latest is {result['latest']}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "sample":
        from .sample import make_sample

        count = make_sample(args.out, per_class=args.per_class, seed=args.seed)
        print(f"wrote {count} images to {args.out}")
        return 0
    try:
        cfg = BuildConfig(source=args.source, destination=args.destination, dataset=args.dataset,
                          version=args.version or default_version(), splits=parse_splits(args.splits),
                          salt=args.salt, shard_size_mb=args.shard_size_mb, compression=args.compression,
                          max_reject_fraction=args.max_reject_fraction, as_of=args.as_of)
        if args.workers < 1:
            raise ConfigError("--workers must be at least 1")
        storage = Storage()
        started = time.perf_counter()
        result = build(cfg, workers=args.workers, progress=not args.no_progress and sys.stderr.isatty(),
                       storage=storage)
        print(_summary(cfg, result, time.perf_counter() - started, storage))
        return 0
    except (ConfigError, stages.BuildError, StorageError, StoreUnreachable, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except Exception as exc:  # connection and credential problems from boto3
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, BotoCoreError | ClientError):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise
