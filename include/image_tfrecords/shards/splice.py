"""Splice a shard the night rewrites from byte ranges of its base shard, then append its new records.

A rewritten shard keeps some records of a base shard, in the base's order, and may take new records
at its end (``stages.plan``). TFRecord framing makes records self-delimiting and the base's ``.tfindex``
gives each record's bytes, so each run of consecutive kept records is one byte range of the base
shard: the new shard is those ranges, then the new records. Kept records are not parsed again, but
every byte of them is checked, in the one pass that copies them:

* the base's ``.tfindex`` is the one its version published (its SHA-256, where the manifest gives it) and
  lists its records end to end;
* the kept bytes are read a few MiB at a time (whole records); each kept record's framing is checked
  (its length field against the index, the masked CRC32C of the length and of the data, as TFRecord
  stores them: ``google-crc32c``), then the bytes go into the new shard's SHA-256 (``hashlib``) and are
  written to it;
* the new records are made from the source and checked in full as any written record (parsed,
  image SHA-256, plan row), and the ``.tfindex`` follows by arithmetic on the base's.

A base shard that is missing or damaged (index, framing, a CRC) never propagates: the shard is
written from the source instead (``write_shard``), and its receipt says why (``fallback``). An I/O
error reading the base or writing the new shard fails the build, naming the file.

On S3 the base shard is downloaded once (into a local file, whose kept records are checked as above),
and the spliced shard is a multipart upload: kept runs of at least 5 MiB are copied by the store
(``UploadPartCopy`` of that byte range of the base object, only while it is still the version that
was downloaded and checked), the rest (short runs, the new records) is uploaded; the whole shard's
SHA-256 goes into the object's metadata (``S3Store.compose``). Gzip shards (one compressed stream,
no record boundaries) take the record-by-record path, ``rewrite_shard``, which stays the reference
that splicing must match byte for byte (tests/pipeline/test_splice.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import struct
import tempfile
from collections.abc import Iterator
from concurrent.futures import Executor
from contextlib import ExitStack
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError, SourceChanged
from ..progress import log
from ..published import layout
from ..records.tfrecord import TFRecordWriter, masked_crc
from ..staging import CHECKED, MEMBERS, SHARDS, TMP_PREFIX, Progress, no_progress, staged, staged_schema
from ..storage import Storage, is_s3, join
from ..storage.documents import write_json
from ..storage.multipart import Reader, Segment
from .checks import match_member, member_names, member_rows, record_facts, set_digest
from .writer import already_written, records_from_source, stage_shard, write_shard

PIECE = 4 << 20  # kept bytes read, checked, hashed and written at a time (whole records; a longer record alone)
_FIELDS = struct.Struct("<QI")  # a record's length and the masked CRC of the length
_CRC = struct.Struct("<I")


class DamagedBase(Exception):
    """The base shard (or its index) is not what its version published."""


def can_splice(cfg: BuildConfig, origin: dict[str, Any]) -> bool:
    """Whether the plan's rewrite ``origin`` can be spliced: uncompressed shards and a plan that knows the
    kept records' places (``runs``)."""
    return origin.get("runs") is not None and cfg.compression == "none"


def splice_shard(cfg: BuildConfig, storage: Storage, shard: str, origin: dict[str, Any],
                 progress: Progress = no_progress, read_workers: int = 4,
                 processes: Executor | None = None) -> dict[str, Any]:
    """Write one rewritten shard by splicing (see the module); stage it, its ``.tfindex``, its receipt and its
    check (the validate stage needs no second read). Returns the check."""
    members_data = storage.read_bytes(staged(cfg, MEMBERS, shard + ".csv"))  # bounded by the shard size
    members_sha = hashlib.sha256(members_data).hexdigest()
    source = {"version": origin["version"], "file": origin["file"]}
    names = member_names(members_data)  # the kept records need no more: only the new ones' rows are parsed
    if (receipt := already_written(cfg, storage, shard, members_sha, source)) is not None:
        progress(receipt["num_records"])
        return _checked(cfg, storage, shard, receipt, names, members_sha)
    if sum(stop - start for start, stop in origin["runs"]) != origin["kept"]:
        raise BuildError(f"the plan keeps {origin['kept']} records of {origin['file']}, its runs {origin['runs']} "
                         "do not")
    old = join(cfg.dataset_uri, origin["version"], origin["file"])
    try:
        receipt = _splice(cfg, storage, shard, origin, old, members_data, members_sha, progress, read_workers,
                          processes)
    except (DamagedBase, FileNotFoundError, SourceChanged) as exc:
        why = f"{old} is missing" if isinstance(exc, FileNotFoundError) else \
            f"{old} changed while it was spliced" if isinstance(exc, SourceChanged) else f"{old} is damaged: {exc}"
        log.warning("%s: shard %s is written from the source instead", why, shard)
        receipt = write_shard(cfg, storage, shard, progress, read_workers, processes, fallback=why)
        return {**receipt, "fallback": why}
    return _checked(cfg, storage, shard, receipt, names, members_sha)


def _splice(cfg: BuildConfig, storage: Storage, shard: str, origin: dict[str, Any], old: str, members_data: bytes,
            members_sha: str, progress: Progress, read_workers: int, processes: Executor | None) -> dict[str, Any]:
    """Splice and stage the shard (see the module); its receipt."""
    runs = origin["runs"]
    starts, lengths = _base_index(storage, old, origin)
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(dir=storage.scratch_dir(staged(cfg, SHARDS)),
                                                              prefix=TMP_PREFIX))
        remote, base_path, base_tag = is_s3(old), old, None
        if remote:  # downloaded once: its kept records checked here, its long runs copied by the store
            base_path = os.path.join(tmp, "base-" + origin["file"])
            base_tag = storage.download(old, base_path)
        base = os.open(base_path, os.O_RDONLY | os.O_CLOEXEC)
        stack.callback(os.close, base)
        if (size := os.fstat(base).st_size) != origin["num_bytes"]:
            raise DamagedBase(f"it holds {size} bytes, its version published {origin['num_bytes']}")
        path = os.path.join(tmp, shard)
        out = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        stack.callback(os.close, out)
        digest = hashlib.sha256()
        with _naming(old, writing=False):
            offsets = _copy_kept(base, None if remote else out, runs, starts, lengths, digest, path)
        kept_bytes = sum(length for _, length in offsets)
        progress(origin["kept"])
        appended = _append(cfg, storage, shard, out, path, digest, member_rows(members_data, origin["kept"]),
                           origin["kept"], read_workers, processes, progress)
        offsets += [(kept_bytes + at, length) for at, length in appended["offsets"]]
        written, sha256, copied = kept_bytes + appended["bytes"], digest.hexdigest(), 0
        if remote:
            segments = [Segment(last - first, _reader(base, first, old), old, first)
                        for first, last in _run_bytes(runs, starts, lengths)]
            segments.append(Segment(appended["bytes"], _reader(out, 0, path)))
            copied = storage.compose(staged(cfg, SHARDS, shard), segments, sha256,
                                     {old: base_tag} if base_tag else None)
        elif not storage.is_deferred(staged(cfg, SHARDS, shard)):  # else the build's one syncfs makes it durable
            with _naming(path):
                os.fsync(out)
        return stage_shard(cfg, storage, shard, None if remote else path, offsets, written, sha256,
                           members_sha, source_bytes=appended["source_bytes"],
                           rewritten_from={"version": origin["version"], "file": origin["file"]}, spliced=True,
                           base_bytes_read=size if remote else kept_bytes, bytes_kept=kept_bytes,
                           bytes_copied=copied, bytes_written=written - copied,
                           records_parsed=len(offsets) - origin["kept"])


def _base_index(storage: Storage, old: str, origin: dict[str, Any]) -> tuple[list[int], list[int]]:
    """The starts and lengths of the base shard's records, from its ``.tfindex``; DamagedBase unless it is the
    one its version published (where the manifest gives its SHA-256), lists ``num_records`` records end to end
    over ``num_bytes``, and holds the plan's ``runs``. Parsed as columns: a night reads every base index."""
    import numpy as np

    data = storage.read_bytes(layout.index_file(old))
    if origin.get("index_sha256") and hashlib.sha256(data).hexdigest() != origin["index_sha256"]:
        raise DamagedBase("its .tfindex is not the one its version published")
    count, runs = origin["num_records"], origin["runs"]
    try:
        table = np.array(data.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        raise DamagedBase("its .tfindex does not parse") from None
    if data.count(b"\n") != count or len(table) != 2 * count:
        raise DamagedBase("its .tfindex does not parse")
    starts, lengths = table[0::2], table[1::2]
    if count and (starts[0] != 0 or (starts[1:] != starts[:-1] + lengths[:-1]).any() or (lengths < 16).any()
                  or starts[-1] + lengths[-1] != origin["num_bytes"]):
        raise DamagedBase("its .tfindex does not list its records end to end")
    if any(not 0 <= start < stop <= count for start, stop in runs) or \
            any(a[1] > b[0] for a, b in itertools.pairwise(runs)):
        raise DamagedBase("the places its labels.csv gives are not records of it")
    return starts.tolist(), lengths.tolist()


def _run_bytes(runs: list[list[int]], starts: list[int], lengths: list[int]) -> list[tuple[int, int]]:
    """The byte range ``[first, last)`` of the base that each kept run of records is."""
    return [(starts[start], starts[stop - 1] + lengths[stop - 1]) for start, stop in runs]


def _pieces(start: int, stop: int, starts: list[int], lengths: list[int]) -> Iterator[tuple[int, int]]:
    """Records ``start`` to ``stop`` in groups ``[i, j)`` of about ``PIECE`` bytes (a longer record alone)."""
    i = start
    while i < stop:
        j = i + 1
        while j < stop and starts[j] + lengths[j] - starts[i] <= PIECE:
            j += 1
        yield i, j
        i = j


def _copy_kept(base: int, out: int | None, runs: list[list[int]], starts: list[int], lengths: list[int],
               digest: Any, path: str) -> list[tuple[int, int]]:
    """Read the kept runs of the open base ``base`` a piece at a time, check each record's framing
    (``check_framing``), add the bytes to ``digest`` and write them to ``out`` (the open file ``path``; None: not
    written here, as on S3, where the store copies them); the kept records' offsets and lengths in the new shard."""
    offsets: list[tuple[int, int]] = []
    kept = 0
    for start, stop in runs:
        for i, j in _pieces(start, stop, starts, lengths):
            at = starts[i]
            data = _read(base, at, starts[j - 1] + lengths[j - 1] - at)
            check_framing(data, lengths[i:j], at)
            digest.update(data)
            if out is not None:
                with _naming(path):
                    _write_all(out, data)
            offsets += [(kept + starts[k] - at, lengths[k]) for k in range(i, j)]
            kept += len(data)
    return offsets


def check_framing(data: bytes, lengths: list[int], at: int = 0) -> None:
    """``data`` is records of ``lengths`` bytes end to end, each framed as TFRecord frames it: its length field
    says its length, and the masked CRC32C of the length field and of the record's data hold. DamagedBase
    (naming the record's byte, ``at`` being where ``data`` begins) otherwise."""
    position = 0
    for length in lengths:
        size, length_crc = _FIELDS.unpack_from(data, position)
        if size + 16 != length:
            raise DamagedBase(f"the record at byte {at + position} is not framed as its .tfindex says")
        end = position + 12 + size
        if masked_crc(data[position:position + 8]) != length_crc or \
                masked_crc(data[position + 12:end]) != _CRC.unpack_from(data, end)[0]:
            raise DamagedBase(f"the record at byte {at + position} fails its CRC")
        position += length


def _read(fd: int, at: int, count: int) -> bytes:
    """``count`` bytes of the open file ``fd`` from ``at``; DamagedBase where the file ends before them."""
    chunks = []
    while count > 0 and (chunk := os.pread(fd, count, at)):
        chunks.append(chunk)
        at, count = at + len(chunk), count - len(chunk)
    if count > 0:
        raise DamagedBase(f"it ends {count} bytes early")
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def _write_all(fd: int, data: Any) -> None:
    """``data`` written at ``fd``'s position, however few bytes each write takes."""
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            done += os.write(fd, view[done:])


@contextlib.contextmanager
def _naming(path: str, writing: bool = True) -> Iterator[None]:
    """An ``OSError`` in the block that names no file names ``path`` (the file being written or read)."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None:
            raise
        verb = "writing" if writing else "reading"
        raise OSError(exc.errno, f"{verb} failed: {exc.strerror or exc}", path) from exc


def _reader(fd: int, at: int, path: str) -> Reader:
    """Reads of the bytes of the open file ``fd`` (``path``) from ``at`` on (a segment's ``read``)."""

    def read(start: int, count: int) -> bytes:
        with _naming(path, writing=False):
            return _read(fd, at + start, count)

    return read


def _append(cfg: BuildConfig, storage: Storage, shard: str, out: int, path: str, digest: Any,
            rows: list[dict[str, str]], first: int, read_workers: int, processes: Executor | None,
            progress: Progress) -> dict[str, Any]:
    """Make the new records of ``rows`` (places ``first`` on in the shard) from the source, check each in full,
    write them to ``out`` (the open file ``path``, at its position) and into ``digest``; their offsets from the
    first one, their bytes and the source bytes read."""

    class Sink:
        def write(self, data: bytes) -> int:
            digest.update(data)
            with _naming(path):
                _write_all(out, data)
            return len(data)

    schema = staged_schema(cfg, storage)
    unseen = {row["filename"]: row for row in rows}
    source_bytes = 0
    writer = TFRecordWriter(Sink())  # type: ignore[arg-type]
    for number, (record, read) in enumerate(records_from_source(cfg, storage, rows, read_workers, processes)):
        facts = record_facts(schema, shard, (number, record), headers=not cfg.image_options.is_default)
        match_member(schema, shard, facts, unseen, first=first)
        writer.write(record)
        source_bytes += read
        progress(1)
    if unseen:
        raise BuildError(f"shard {shard}: {len(unseen)} new records were not made")
    return {"offsets": writer.offsets, "bytes": sum(length for _, length in writer.offsets),
            "source_bytes": source_bytes}


def _checked(cfg: BuildConfig, storage: Storage, shard: str, receipt: dict[str, Any], names: list[str],
             members_sha: str) -> dict[str, Any]:
    """Stage the check of a spliced shard: what ``validate_shard`` stages, from what splicing checked."""
    result = {"file": shard, "num_records": receipt["num_records"], "num_bytes": receipt["num_bytes"],
              "sha256": receipt["sha256"], "change_tag": storage.change_tag(staged(cfg, SHARDS, shard)),
              "names": set_digest(names), "members_sha256": members_sha,
              "index_sha256": receipt["index_sha256"], "source_bytes": receipt.get("source_bytes", 0),
              "rewritten_from": receipt["rewritten_from"],
              **{key: receipt[key] for key in ("base_bytes_read", "bytes_kept", "bytes_copied", "bytes_written",
                                                 "records_parsed")
                 if key in receipt}}
    write_json(storage, staged(cfg, CHECKED, shard + ".json"), result)
    return result
