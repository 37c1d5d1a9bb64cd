"""Write one shard into staging: from its members' images in the source (``write_shard``), or record
by record from a previous version's shard, then the new members from the source (``rewrite_shard``);
and stage it with its ``.tfindex`` and its receipt (``stage_shard``).

The records of a shard are made in parallel and written in plan order by the one process that owns
the shard file (``records_from_source``), so its bytes do not depend on the number of cores. A shard
staged already, intact, from the same members and made the same way is not written again
(``already_written``): a retried task skips it.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from contextlib import ExitStack
from functools import partial
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError
from ..images.probe import RejectedImage
from ..images.transform import record_image
from ..parallel import batched_map, io_threads, ordered_map
from ..published import layout
from ..records.example import decode_example, encode_example
from ..records.schema import FILENAME_KEY, RecordSchema, example_features
from ..records.tfrecord import CorruptRecordError, TFRecordWriter, index_text, read_records
from ..rules.base_version import FULL_REBUILD
from ..source import spool
from ..source.reading import read_source
from ..staging import (
    MEMBERS,
    RECEIPTS,
    SHARDS,
    TMP_PREFIX,
    Progress,
    no_progress,
    staged,
    staged_schema,
)
from ..storage import HashingReader, HashingWriter, Storage, join
from ..storage.documents import read_json, read_rows, write_json
from .checks import member_rows


def already_written(cfg: BuildConfig, storage: Storage, shard: str, members_sha: str,
                     rewritten_from: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The receipt of this shard if it is staged, intact, from these members, made the way the plan says
    now (from the source, or rewritten from ``rewritten_from``): a retried task skips it."""
    receipt_uri = staged(cfg, RECEIPTS, shard + ".json")
    if not storage.exists(receipt_uri):
        return None
    try:
        receipt = read_json(storage, receipt_uri)
    except ValueError:  # cut short by a crash before it was synced: the shard is written again
        return None
    if not isinstance(receipt, dict):
        return None
    if receipt.get("members_sha256") == members_sha and "reused_from" not in receipt and \
            receipt.get("made_with") == made_with(cfg) and \
            receipt.get("rewritten_from") == rewritten_from and \
            storage.sha256_of(staged(cfg, SHARDS, shard)) == receipt["sha256"] and \
            storage.sha256_of(staged(cfg, SHARDS, layout.index_file(shard))) == receipt.get("index_sha256"):
        return receipt
    return None


def made_with(cfg: BuildConfig) -> dict[str, Any]:
    """What decides the bytes of records made from the source besides their members' rows: the image
    options (``fit`` and ``jpeg_quality`` are in no row) and the Pillow that makes the images. A staged
    shard made otherwise (an interrupted build resumed with other options) is written again."""
    from PIL import __version__ as pillow

    return {**cfg.image_options.describe(), "pillow": pillow}


def _stage(cfg: BuildConfig, storage: Storage, shard: str, path: str, writer: TFRecordWriter, raw: HashingWriter,
           members_sha: str, **extra: Any) -> dict[str, Any]:
    """Stage a written shard, its ``.tfindex`` and its receipt."""
    return stage_shard(cfg, storage, shard, path, writer.offsets, raw.num_bytes, raw.sha256.hexdigest(), members_sha,
                       **extra)


def stage_shard(cfg: BuildConfig, storage: Storage, shard: str, path: str | None, offsets: list[tuple[int, int]],
                num_bytes: int, sha256: str, members_sha: str, **extra: Any) -> dict[str, Any]:
    """Stage the shard file at ``path`` (records at ``offsets``, ``num_bytes`` hashing to ``sha256``; None:
    the shard is staged already), its ``.tfindex`` and its receipt (last); returns the receipt."""
    index = index_text(offsets)
    receipt = {"file": shard, "num_records": len(offsets), "num_bytes": num_bytes, "sha256": sha256,
               "members_sha256": members_sha, "made_with": made_with(cfg),
               "index_sha256": hashlib.sha256(index).hexdigest(), **extra}
    storage.write_bytes(staged(cfg, SHARDS, layout.index_file(shard)), index)
    if path is not None:
        storage.upload(path, staged(cfg, SHARDS, shard), receipt["sha256"])
    write_json(storage, staged(cfg, RECEIPTS, shard + ".json"), receipt)
    return receipt


def _source_bytes(cfg: BuildConfig, storage: Storage, row: dict[str, str], kept: bool = True
                  ) -> bytes | RejectedImage:
    """A member's image bytes (the copy inspection ``kept``, if any: ``source.spool``), or why they could not be
    read (for ``_record_from_source``, fetched ahead)."""
    if kept and (data := spool.take(row["sha256"])) is not None:
        return data
    try:
        return read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
    except RejectedImage as exc:
        return exc


def _record_from_source(cfg: BuildConfig, storage: Storage, schema: RecordSchema, row: dict[str, str],
                        fetched: bytes | RejectedImage | None = None) -> tuple[bytes, int]:
    """One member's record (``tf.train.Example`` bytes) from its image in the source, and the bytes read.
    An image the options change (no ``encoded_sha256`` planned) is made here: decoded, converted, resized
    and encoded once, by the worker that writes its shard."""
    data = _source_bytes(cfg, storage, row) if fetched is None else fetched
    if not isinstance(data, RejectedImage) and hashlib.sha256(data).hexdigest() != row["sha256"]:
        data = _source_bytes(cfg, storage, row, kept=False)  # a damaged copy, or a bad read: the source decides
        if not isinstance(data, RejectedImage) and hashlib.sha256(data).hexdigest() != row["sha256"]:
            raise _changed(cfg, storage, row["filename"])
    if isinstance(data, RejectedImage):
        raise _changed(cfg, storage, row["filename"], f" ({data})") from None
    try:
        encoded = record_image(data, row, cfg.image_options, cfg.max_pixels)
    except (ValueError, RejectedImage) as exc:
        raise BuildError(f"{row['filename']}: {exc}") from exc
    except Exception as exc:  # Pillow raises many types; the image decoded at inspection
        raise BuildError(f"{row['filename']}: cannot make its record image ({type(exc).__name__}: {exc})") from exc
    return encode_example(example_features(row, encoded, schema)), len(data)


def _changed(cfg: BuildConfig, storage: Storage, filename: str, detail: str = "") -> BuildError:
    """The error for a member whose file is not what inspection saw, naming the remedy that works: a
    rerun reads a file again when its listing changed, but an inspection taken over from the previous
    version (same size and modification stamp: the content changed under an unchanged stamp) is taken
    over again by every incremental build, so only a full one reads it."""
    from ..stages.inspect import was_read  # (an error's path: the stages import this module)

    if not was_read(cfg, storage, filename):
        return BuildError(f"{filename} changed{detail} though its size and modification time did not, so this "
                          f"build took over the previous version's inspection of it: {FULL_REBUILD}")
    return BuildError(f"{filename} changed since it was inspected{detail}; rerun the build")


def records_from_source(cfg: BuildConfig, storage: Storage, rows: Iterable[dict[str, str]], read_workers: int,
                 processes: Executor | None = None) -> Iterator[tuple[bytes, int]]:
    """Each member's record and the bytes read, in member order: made on ``read_workers`` threads, or on
    the ``processes`` pool (a few records per call), so one shard uses every core.

    This is how a shard is written by many cores without its bytes depending on them: the records
    are made in parallel, and written in plan order by the one process that owns the shard file.
    Across machines (Celery, Kubernetes) the unit is the write task; ``shard_size_mb`` sets how many
    there are.
    """
    make = partial(_record_from_source, cfg, storage, staged_schema(cfg, storage))
    if processes is not None:
        threads = io_threads(cfg.source)
        return batched_map(make, rows, processes, read_workers, batch=8 * min(threads, 4),
                           fetch=partial(_source_bytes, cfg, storage), threads=threads)
    return ordered_map(make, rows, read_workers)


def write_shard(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress = no_progress,
                read_workers: int = 4, processes: Executor | None = None, fallback: str = "") -> dict[str, Any]:
    """Write one shard from its member list (images read from the source) and stage it whole; skip if
    already staged identically. ``fallback``: why a shard planned from the base is written from the source."""
    members_uri = staged(cfg, MEMBERS, shard + ".csv")
    members_sha = hashlib.sha256(storage.read_bytes(members_uri)).hexdigest()
    if (receipt := already_written(cfg, storage, shard, members_sha)) is not None:
        progress(receipt["num_records"])
        return receipt
    source_bytes = 0
    with tempfile.TemporaryDirectory(dir=storage.scratch_dir(staged(cfg, SHARDS)), prefix=TMP_PREFIX) as tmp:
        path = os.path.join(tmp, shard)
        with read_rows(storage, members_uri) as rows, open(path, "wb") as file, \
                TFRecordWriter(raw := HashingWriter(file), cfg.compression) as writer:
            for record, read in records_from_source(cfg, storage, rows, read_workers, processes):
                writer.write(record)
                source_bytes += read
                progress(1)
        return _stage(cfg, storage, shard, path, writer, raw, members_sha, source_bytes=source_bytes,
                      **({"fallback": fallback} if fallback else {}))


def rewrite_shard(cfg: BuildConfig, storage: Storage, shard: str, origin: dict[str, Any],
                  progress: Progress = no_progress, read_workers: int = 4,
                  processes: Executor | None = None) -> dict[str, Any]:
    """Write one shard from a previous version's shard (``origin``: its version, file and sha256): the
    first ``origin["kept"]`` members are copied record by record from it, in its order (their images are
    not read); the members after them are appended from the source. The previous shard must still hash
    to what its manifest says."""
    members_uri = staged(cfg, MEMBERS, shard + ".csv")
    members_data = storage.read_bytes(members_uri)  # bounded by the shard size
    members_sha = hashlib.sha256(members_data).hexdigest()
    source = {"version": origin["version"], "file": origin["file"]}
    if (receipt := already_written(cfg, storage, shard, members_sha, source)) is not None:
        progress(receipt["num_records"])
        return receipt
    members = member_rows(members_data)
    wanted = {row["filename"] for row in members[: origin["kept"]]}
    old = join(cfg.dataset_uri, origin["version"], origin["file"])
    advice = FULL_REBUILD
    source_bytes = 0
    with tempfile.TemporaryDirectory(dir=storage.scratch_dir(staged(cfg, SHARDS)), prefix=TMP_PREFIX) as tmp:
        path = os.path.join(tmp, shard)
        with ExitStack() as files:
            try:
                stream = files.enter_context(storage.open_read(old))
            except FileNotFoundError:
                raise BuildError(f"{old} is gone from version {origin['version']}: {advice}") from None
            file = files.enter_context(open(path, "wb"))
            writer = files.enter_context(TFRecordWriter(raw := HashingWriter(file), cfg.compression))
            held = HashingReader(stream)
            try:
                for record in read_records(held, cfg.compression):  # type: ignore[arg-type]
                    if wanted and (name := _filename_of(record)) in wanted:
                        writer.write(record)
                        wanted.discard(name)
                        progress(1)
            except CorruptRecordError as exc:
                raise BuildError(f"{old} is damaged ({exc}): {advice}") from exc
            held.drain()
            if held.sha256.hexdigest() != origin["sha256"]:
                raise BuildError(f"{old} no longer hashes to the sha256 its manifest gives: {advice}")
            if wanted:
                raise BuildError(f"{old} does not hold {min(wanted)}, which its labels.csv puts there: {advice}")
            for record, read in records_from_source(cfg, storage, members[origin["kept"]:], read_workers, processes):
                writer.write(record)
                source_bytes += read
                progress(1)
        return _stage(cfg, storage, shard, path, writer, raw, members_sha, source_bytes=source_bytes,
                      rewritten_from=source, base_bytes_read=held.num_bytes)


def _filename_of(record: bytes) -> str:
    """The ``image/filename`` of a serialized record."""
    return decode_example(record)[FILENAME_KEY][0].decode()  # type: ignore[union-attr]
