"""Command line: the same pipeline as the DAG, without Airflow.

    image-tfrecords build --source SRC --destination DEST --dataset NAME ...
    image-tfrecords clean --destination DEST --dataset NAME [--older-than-hours H]
    image-tfrecords sample OUT [--per-class N]

S3 credentials and endpoint come from boto3's standard environment (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL). User errors print one line and exit non-zero. When the publish
gate trips (and ``--accept-gate`` is not given), the gate's report goes to stdout, one line to stderr, and
the exit status is 3 (``GATE_TRIPPED``): nothing is published and the staging is kept.

SIGTERM and SIGINT (Ctrl-C) stop the build: worker processes are stopped (they also die with
the parent if it is killed outright), temporary files are removed, and one line says what was left
in staging and how to resume or clean it; the exit status is 128 + the signal number.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import errno
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, NoReturn

from . import compiled, stages
from .config import BuildConfig, ConfigError, check_location, parse_columns, parse_splits
from .errors import BuildError, GateTripped, ImageTfrecordsError, LockHeld
from .options import IMAGES, OPTIONS, Option
from .parallel import process_pool
from .published import layout
from .published.cleanup import clean_staging
from .published.locking import LeaseKeeper
from .published.manifest import Manifest
from .source import spool
from .source.preflight import check_locations, check_temp_dir, os_error_line
from .stages.inspect import INSPECTION_MODULES
from .stages.write import warm_up
from .storage import Storage, is_s3, join
from .storage.tables import arrow, polars

PROG = "image-tfrecords"
GATE_TRIPPED = 3  # the exit status when the publish gate trips
# OSErrors about where the build reads or writes (not bugs): one line, no traceback.
USER_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOTDIR,
                         errno.EISDIR, errno.ENAMETOOLONG, errno.ENOENT, errno.EEXIST, errno.EIO})


class Interrupted(BaseException):
    """SIGTERM or SIGINT arrived: unwinds the build like KeyboardInterrupt, for any of the two."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, _frame: object) -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):  # a second signal must not interrupt the cleanup
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(signum)


def default_version(now: datetime | None = None) -> str:
    """A sortable version name from the current UTC time, e.g. ``20261122T031500Z``."""
    return layout.version_name(now or datetime.now(UTC))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG,
                                     description="Turn folders of labelled images into TFRecord datasets.")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build, validate and publish a dataset version")
    build.add_argument("--version", help="version name (default: current UTC time, YYYYMMDDTHHMMSSZ)")
    build.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                       help="processes inspecting, writing and checking images (default: CPU count); the "
                            "output does not depend on it")
    build.add_argument("--no-progress", action="store_true", help="no progress bars")
    images = build.add_argument_group("images and features", "what each record stores (default: the image file "
                                      "as it is, one class)")
    for option in OPTIONS:
        if option.cli_flag is not None:
            _add_flag(images if option.section == IMAGES else build, option)
    clean = commands.add_parser("clean", help="remove the staging files of builds that never published")
    clean.add_argument("--destination", required=True, help="local folder or s3://bucket/prefix")
    clean.add_argument("--dataset", required=True, help="dataset name (a folder under the destination)")
    clean.add_argument("--older-than-hours", type=float, default=24.0,
                       help="only staging untouched for this long (default: %(default)g; 0: all not in use)")
    clean.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    sample = commands.add_parser("sample", help="write a small demo image folder")
    sample.add_argument("out")
    sample.add_argument("--per-class", type=int, default=20)
    sample.add_argument("--seed", type=int, default=0)
    return parser


def config_of(args: argparse.Namespace) -> BuildConfig:
    """The ``BuildConfig`` of parsed ``build`` arguments: every option that has a flag, the object ones
    (``--splits``, ``--columns``) parsed from their text."""
    given = {o.name: getattr(args, o.name) for o in OPTIONS if o.config and o.cli_flag is not None}
    return BuildConfig(**{**given, "splits": parse_splits(args.splits), "columns": parse_columns(args.columns)},
                       version=args.version or default_version())


def _add_flag(group: Any, option: Option) -> None:
    """The command-line flag of a build option (``options.OPTIONS``): its help and default from the spec."""
    flag, help_text = option.cli_flag, option.help.rstrip(".")
    if option.kind == "boolean":
        action = "store_false" if option.default else "store_true"
        group.add_argument(flag, dest=option.name, action=action,
                           help=f"turn off: {help_text[0].lower()}{help_text[1:]}" if option.default else help_text)
        return
    if option.required_flag:
        group.add_argument(flag, dest=option.name, required=True, help=help_text)
        return
    value = option.default  # an object option is given as NAME=VALUE,... text on the command line
    if option.kind == "object":
        value = ",".join(f"{k}={v}" for k, v in value.items())
    kind = {"number": float, "integer": int}.get(option.kind, str)
    choices = option.choices if option.kind == "string" else None  # numbers: BuildConfig's one-line error
    group.add_argument(flag, dest=option.name, type=kind, default=value, choices=choices,
                       help=help_text + ("" if value in (None, "") else " (default: %(default)s)"))


def _bars(enabled: bool) -> stages.ProgressFactory:
    """Progress bars on stderr, one per stage (or none)."""

    @contextlib.contextmanager
    def bar(stage: str, total: int) -> Iterator[stages.Progress]:
        if not enabled:  # no bars: tqdm is not even imported (tens of ms of a small night)
            yield lambda count=1: None
            return
        from tqdm import tqdm

        with tqdm(total=total, desc=stage, unit="img", file=sys.stderr, leave=False) as t:
            yield t.update

    return bar


def build(cfg: BuildConfig, workers: int = 1, progress: bool = True, storage: Storage | None = None,
          force: bool = False) -> dict[str, Any]:
    """Run ``stages.run_pipeline``; per-image work goes to ``workers`` processes.

    Holds the version's lock throughout (see ``locking``); temporary files live in one private
    folder, removed at the end whatever happens.
    """
    storage = storage or Storage()
    workers = max(1, workers)
    check_locations(cfg)
    check_temp_dir()
    warm_up()  # (protobuf's Example parser, which every write process uses: built before they fork, shared)
    with _private_temp_dir() as temp, LeaseKeeper(storage, cfg.staging_uri) as lease, \
            _spooled(cfg, temp, workers), \
            process_pool(workers, start_now=INSPECTION_MODULES) as pool:  # forked before any S3 read (s3_reads)
        polars(), arrow()  # (0.2-0.4 s, once: imported here, after the pool forked, like its modules before; the
        # stages line then times the stages' passes alone)

        def still_locked() -> None:
            if lease.lost:
                raise BuildError(f"lost the lock of version {cfg.version} ({lease.lost}); nothing was published")

        return stages.run_pipeline(cfg, storage, pool=pool, workers=workers, progress=_bars(progress), force=force,
                                   before_publish=still_locked)


@contextlib.contextmanager
def _spooled(cfg: BuildConfig, temp: str, workers: int) -> Iterator[None]:
    """An S3 source's images kept on local disk between inspection and writing (``source.spool``)."""
    if is_s3(cfg.source):
        spool.enable(os.path.join(temp, "spool"), workers)
    try:
        yield
    finally:
        spool.disable()


@contextlib.contextmanager
def _private_temp_dir() -> Iterator[str]:
    """Point ``tempfile`` (and forked workers) at a folder of this build's own, removed at the end."""
    path = tempfile.mkdtemp(prefix="image-tfrecords-")
    previous = tempfile.tempdir
    tempfile.tempdir = path
    try:
        yield path
    finally:
        tempfile.tempdir = previous
        shutil.rmtree(path, ignore_errors=True)


def _summary(cfg: BuildConfig, result: dict[str, Any], seconds: float, storage: Storage) -> str:
    if result.get("unchanged_since"):
        return (f"{cfg.dataset}: source and params unchanged since version {result['unchanged_since']}; nothing "
                f"built (--force builds anyway)")
    manifest = layout.read_manifest(storage, result["uri"])
    lines = [f"published {cfg.dataset} version {cfg.version} to {result['uri']}"
             + (" (already published: nothing changed)" if result["already_published"] else "")]
    for name in cfg.splits:
        split = manifest.splits[name]
        lines.append(f"  {name:<12} {split.num_records:>8} records in {len(split.shards)} shard(s)")
    lines.append(f"  rejected     {manifest.num_rejected:>8}"
                 + (f"  ({', '.join(f'{k}: {v}' for k, v in manifest.rejects_by_reason.items())})"
                    if manifest.num_rejected else "") + f"   skipped (not images): {manifest.num_skipped}")
    lines.append("  " + build_line(manifest))
    lines.append("  " + gate_line(manifest))
    if result.get("stage_seconds"):
        lines.append("  stages: " + ", ".join(f"{name} {t:.2f} s" for name, t in result["stage_seconds"].items()))
    lines.append(f"  {compiled.line()}")
    lines.append(f"  {manifest.num_records} records, {manifest.num_bytes / 1e6:.1f} MB in {seconds:.1f} s "
                 f"({manifest.num_records / max(seconds, 1e-9):.0f} images/s); latest is {result['latest']}")
    return "\n".join(lines)


def build_line(manifest: Manifest) -> str:
    """One line on how a version was made: incremental (on which version) or full (and why)."""
    build = manifest.build
    if not build:
        return "build: (made before 0.3.0)"
    how = (f"incremental on {build['base_version']}" if build["mode"] == "incremental"
           else f"full ({build['full_because']})")
    return (f"build: {how}; shards reused {build['shards_reused']}, rewritten {build['shards_rewritten']}, "
            f"written {build['shards_written']}; files inspected {build['files_inspected']} "
            f"(reused {build['inspections_reused']}); {build['source_bytes_read'] / 1e6:.1f} MB read from the source")


def gate_line(manifest: Manifest) -> str:
    """One line on the publish gate's verdict (the manifest's ``build.gate``)."""
    gate = manifest.build.get("gate")
    if not gate:
        return "publish gate: (not recorded)"
    verdict, previous, tripped = gate.get("verdict", "?"), gate.get("previous_version"), gate.get("tripped") or []
    if verdict == "off" or not previous:
        return f"publish gate: {verdict}" + ("" if previous or verdict == "off" else " (no previous version)")
    what = f"tripped {', '.join(tripped)}" if tripped else "nothing tripped"
    who = f" by {gate['approved_by']}" if gate.get("approved_by") else ""
    return f"publish gate: {verdict}{who} ({gate.get('checks_run', 0)} checks against {previous}, {what})"


def _clean(args: argparse.Namespace) -> int:
    destination = check_location("destination", args.destination)
    BuildConfig(source=".", destination=destination, dataset=args.dataset, version="v")  # validates the name
    if args.older_than_hours < 0:
        raise ConfigError("--older-than-hours must be at least 0")
    dataset_uri = join(destination, args.dataset)
    report = clean_staging(Storage(), dataset_uri, args.older_than_hours * 3600, dry_run=args.dry_run)
    verb = "would remove" if args.dry_run else "removed"
    for entry in report:
        what = f"{entry['uri']} ({entry['files']} files, {entry['bytes'] / 1e6:.1f} MB, {entry['age_hours']:g} h old)"
        print(f"{verb} {what}" if entry["action"] == "remove" else f"kept {what}: {entry['action'][6:]}")
    removed = [e for e in report if e["action"] == "remove"]
    print(f"{verb} staging of {len(removed)} version(s), {sum(e['bytes'] for e in removed) / 1e6:.1f} MB; "
          f"kept {len(report) - len(removed)}" if report else f"no staging under {dataset_uri}")
    return 0


def _left_behind(cfg: BuildConfig, storage: Storage) -> str:
    """What a stopped build left, and what to do about it."""
    with contextlib.suppress(Exception):
        if storage.exists(join(cfg.version_uri, layout.SUCCESS)):
            return f"version {cfg.version} was published at {cfg.version_uri}"
    kept = is_s3(cfg.staging_uri) or _has_staged_files(cfg)
    return "nothing was published (latest.json is unchanged)" + (f"; {_kept_staging(cfg)}" if kept else "")


def _staging_hint(cfg: BuildConfig | None) -> str:
    """For a failed build that left a local staging folder: where it is and how to remove it."""
    if cfg is None or is_s3(cfg.staging_uri) or not _has_staged_files(cfg):
        return ""
    return f" ({_kept_staging(cfg)})"


def _has_staged_files(cfg: BuildConfig) -> bool:
    """Whether a local staging folder holds files, once half-written temporaries are gone; an empty one
    (only the released lock was there) is removed, so that nothing is left behind."""
    if not os.path.isdir(cfg.staging_uri):
        return False
    with contextlib.suppress(OSError):
        _remove_temporaries(cfg.staging_uri)
    if any(files for _, _, files in os.walk(cfg.staging_uri)):
        return True
    with contextlib.suppress(OSError):
        shutil.rmtree(cfg.staging_uri)
        os.rmdir(os.path.dirname(cfg.staging_uri))
    return False


def _kept_staging(cfg: BuildConfig) -> str:
    return (f"staging kept at {cfg.staging_uri}: rerun with --version {cfg.version} to resume, or remove it with "
            f"`{PROG} clean --destination {cfg.destination} --dataset {cfg.dataset} --older-than-hours 0`")


def _remove_temporaries(folder: str) -> None:
    """Remove the half-written temporary files a stopped worker left inside a local staging folder."""
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in list(dirnames):
            if name.startswith(stages.TMP_PREFIX):
                shutil.rmtree(os.path.join(dirpath, name), ignore_errors=True)
                dirnames.remove(name)
        for name in filenames:
            if name.startswith(stages.TMP_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(dirpath, name))


def run(argv: Sequence[str] | None = None) -> NoReturn:
    """The command's process (``image-tfrecords``, ``python -m image_tfrecords``): ``main``, then the exit.

    After a build the interpreter's own teardown (freeing every module and object one by one) takes 40-50 ms, 5%
    of a small night. Once ``main`` has returned, its output is flushed, the exit handlers have run and no other
    thread (nor profiler, nor tracer) is left, the process ends at once (``os._exit``) instead; otherwise as usual
    (``sys.exit``)."""
    code = main(argv)
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if others or sys.getprofile() is not None or sys.gettrace() is not None:  # a profiler or coverage saves at exit
        sys.exit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # a closed pipe: let the usual exit report it
        sys.exit(code)
    atexit._run_exitfuncs()  # what the usual exit runs before its teardown: logging's flush, multiprocessing's
    os._exit(code)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "sample":
        from .images.sample import make_sample

        count = make_sample(args.out, per_class=args.per_class, seed=args.seed)
        print(f"wrote {count} images to {args.out}")
        return 0
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _raise_interrupted)
    cfg: BuildConfig | None = None
    storage = Storage()
    try:
        if args.command == "clean":
            return _clean(args)
        cfg = config_of(args)
        if args.workers < 1:
            raise ConfigError("--workers must be at least 1")
        started = time.perf_counter()
        result = build(cfg, workers=args.workers, progress=not args.no_progress and sys.stderr.isatty(),
                       storage=storage, force=args.force)
        print(_summary(cfg, result, time.perf_counter() - started, storage))
        return 0
    except Interrupted as exc:
        left = _left_behind(cfg, storage) if cfg else "nothing was started"
        print(f"interrupted by {exc}: {left}", file=sys.stderr)
        return 128 + exc.signum
    except GateTripped as exc:
        print(exc.report)
        kept = f"; rerun with --version {cfg.version} --accept-gate to publish this build (its shards are reused)" \
            if cfg else ""
        print(f"error: {exc}{kept}{_staging_hint(cfg)}", file=sys.stderr)
        return GATE_TRIPPED
    except LockHeld as exc:
        print(f"error: version {cfg.version if cfg else '?'} is being built by another process; wait for it or pick "
              f"another --version: {exc}", file=sys.stderr)
        return 1
    except ImageTfrecordsError as exc:
        print(f"error: {exc}{_staging_hint(cfg)}", file=sys.stderr)
        return 2 if isinstance(exc, ConfigError) else 1
    except OSError as exc:
        if exc.errno not in USER_ERRNOS:
            raise
        where = cfg.destination if cfg else "?"
        print(f"error: {os_error_line(exc, f'{where} or the temporary folder {tempfile.gettempdir()}')}"
              f"{_staging_hint(cfg)}", file=sys.stderr)
        return 1
    except Exception as exc:  # connection and credential problems from boto3
        from botocore.exceptions import BotoCoreError, ClientError

        if isinstance(exc, BotoCoreError | ClientError):
            print(f"error: {exc}", file=sys.stderr)
            return 1
        raise
