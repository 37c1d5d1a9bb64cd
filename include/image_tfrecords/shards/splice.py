"""Splice a shard the night rewrites from byte ranges of its base shard, then append its new records.

A rewritten shard keeps some records of a base shard, in the base's order, and may take new records
at its end (``stages.plan``). TFRecord framing makes records self-delimiting and the base's ``.tfindex``
gives each record's bytes, so each run of consecutive kept records is one byte range of the base
shard: the new shard is those ranges, then the new records. Kept records are never parsed again:

* the base shard is read once (mapped), to prove it is the one its version published (its SHA-256,
  against the base manifest's) and to hash the new shard's kept bytes (the new shard's digest is
  taken in that same pass, then over the new records); the bytes before the first record the night
  drops are the same in both, and are hashed once (the new digest starts from a copy of that state).
  A base this build proved ahead (``shards.proofs``: hashed while the metadata stages ran, and still
  the same file, unchanged since) is not hashed again: only the new shard's bytes are, from the last SHA-256
  state the prover saved before the first record dropped (``storage.sha256_states``: at most 1 MiB of the
  prefix is hashed again), and not even those where the prover copied them ahead in the pass that proved the base
  (``shards.prepare``: the splice takes that copy and goes on from its digest's state); where the base is hashed
  here and the kept bytes are written from this pass, the base's digest and the new shard's are two streams of it
  (``sha256_states.update_pair``);
* the base's ``.tfindex`` is proven by the SHA-256 its version published, and the framing of the first
  record of each kept run is checked against it (length and its CRC; every kept record's, for a base from
  before index digests): the records in between are where the proven index says, in proven bytes;
* the bytes are copied by the kernel (``os.copy_file_range``: a reflink where the file system can, a copy on
  the server on NFS) while a thread hashes them; where the kernel would copy them page by page (ext4, tmpfs:
  ``storage.writeback.copies_pages``) they are written from the pass that hashes them, a piece at a time while
  it is in the CPU's cache, instead of being read twice, and with ``O_DIRECT`` (``storage.direct_writes``: no
  page of the page cache taken, filled and written back for each; the ordinary descriptor where it is refused).
  The base's pages are then dropped from the page cache (``POSIX_FADV_DONTNEED``): the version being built
  supersedes it, and the kernel need not reclaim them;
* the new records are made from the source and checked in full as any written record (parsed,
  image SHA-256, plan row), and the ``.tfindex`` follows by arithmetic on the base's.

A base shard that is missing or damaged (digest, index, framing) never propagates: the shard is
written from the source instead (``write_shard``), and its receipt says why (``fallback``).

On S3 the base shard is read once (into a local file, to hash it and check its framing), and the
spliced shard is a multipart upload: kept runs of at least 5 MiB are copied by the store
(``UploadPartCopy`` of that byte range of the base object, only while it is still the version that
was read), the rest (short runs, the new records) is uploaded; the whole shard's SHA-256 goes into
the object's metadata (``S3Store.compose``). Gzip
shards (one compressed stream, no record boundaries) take the record-by-record path,
``rewrite_shard``, which stays the reference that splicing must match byte for byte
(tests/pipeline/test_splice.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import mmap
import os
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from contextlib import ExitStack
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError, SourceChanged
from ..progress import log
from ..published import layout
from ..records.tfrecord import TFRecordWriter, masked_crc
from ..staging import CHECKED, MEMBERS, SHARDS, TMP_PREFIX, Progress, no_progress, staged, staged_schema
from ..storage import Storage, is_s3, join, sha256_states
from ..storage.direct_writes import direct_writer
from ..storage.documents import write_json
from ..storage.multipart import Reader, Segment
from ..storage.writeback import copies_pages, start_writeback
from .checks import match_member, member_names, member_rows, record_facts, set_digest
from .prepare import take_prepared
from .proofs import identity, prepared_entry, proof_of, proof_states
from .writer import already_written, records_from_source, stage_shard, write_shard

HEADER = 12  # a record's length and the CRC of the length
WRITE_PIECE = 1 << 18  # bytes hashed then written at a time (in the CPU's cache between the two)


class DamagedBase(Exception):
    """The base shard (or its index) is not what its version published."""


def can_splice(cfg: BuildConfig, origin: dict[str, Any]) -> bool:
    """Whether the plan's rewrite ``origin`` can be spliced: uncompressed shards and a plan that knows the
    kept records' places (``runs``)."""
    return origin.get("runs") is not None and cfg.compression == "none"


def _index(data: bytes, num_records: int) -> tuple[Any, Any]:
    """The starts and lengths (numpy arrays) of the records of a ``.tfindex``; DamagedBase unless it lists
    ``num_records`` contiguous records, one ``start length`` line each. Parsed as columns: at 100,000
    records a night reads every base index."""
    import numpy as np

    try:
        table = np.array(data.split(), dtype=np.int64)
    except (ValueError, OverflowError):
        raise DamagedBase("its .tfindex does not parse") from None
    if data.count(b"\n") != num_records or len(table) != 2 * num_records:
        raise DamagedBase("its .tfindex does not parse")
    starts, lengths = table[0::2], table[1::2]
    if num_records and (starts[0] != 0 or (starts[1:] != starts[:-1] + lengths[:-1]).any() or (lengths < 16).any()):
        raise DamagedBase("its .tfindex does not list its records end to end")
    return starts, lengths


def _kept(runs: list[list[int]]) -> Any:
    """The numbers of the kept records (``runs`` of ``[start, stop)``), as one numpy array."""
    import numpy as np

    return np.concatenate([np.arange(start, stop, dtype=np.int64) for start, stop in runs]) if runs else \
        np.zeros(0, dtype=np.int64)


def _framed(runs: list[list[int]], index_proven: bool) -> Any:
    """The kept records whose framing is checked: with an index proven by the digest its version published, the
    first of each run (where the night's copy starts reading the base: the base's own SHA-256, checked in the same
    pass, proves the bytes, and the index proves where the records in between start); with an index from before
    index digests, every kept record."""
    import numpy as np

    return np.array([start for start, _ in runs], dtype=np.int64) if index_proven else _kept(runs)


def _check_framing(view: memoryview, starts: Any, lengths: Any, kept: Any) -> None:
    """Each record of ``kept`` has the length field the index gives and its CRC: the headers are gathered and
    compared as columns, and the CRCs taken in one loop with no per-record Python beyond the call."""
    import numpy as np

    if not len(kept):
        return
    offsets = starts[kept]
    raw = np.frombuffer(view, dtype=np.uint8)
    try:
        headers = raw[offsets[:, None] + np.arange(HEADER)]  # a copy: no view of the map outlives the check
    finally:
        del raw
    sizes = headers[:, :8].copy().view("<u8").ravel()
    bad = np.flatnonzero(sizes.astype(np.int64) + 16 != lengths[kept])
    if not len(bad):
        stored = headers[:, 8:].copy().view("<u4").ravel().tolist()
        fields = headers[:, :8].tobytes()
        crcs = [masked_crc(fields[i:i + 8]) for i in range(0, len(fields), 8)]
        bad = np.flatnonzero(np.array(crcs, dtype=np.int64) != np.array(stored, dtype=np.int64))
    if len(bad):
        raise DamagedBase(f"the record at byte {int(offsets[bad[0]])} is not framed as its .tfindex says")


def splice_shard(cfg: BuildConfig, storage: Storage, shard: str, origin: dict[str, Any],
                 progress: Progress = no_progress, read_workers: int = 4,
                 processes: Executor | None = None) -> dict[str, Any]:
    """Write one rewritten shard by splicing (see the module); stage it, its ``.tfindex``, its receipt and its
    check (the validate stage needs no second read). Returns the check."""
    members_uri = staged(cfg, MEMBERS, shard + ".csv")
    members_data = storage.read_bytes(members_uri)  # bounded by the shard size
    members_sha = hashlib.sha256(members_data).hexdigest()
    source = {"version": origin["version"], "file": origin["file"]}
    names = member_names(members_data)  # the kept records need no more: only the new ones' rows are parsed
    if (receipt := already_written(cfg, storage, shard, members_sha, source)) is not None:
        progress(receipt["num_records"])
        return _checked(cfg, storage, shard, receipt, names, members_sha)
    kept, runs = origin["kept"], origin["runs"]
    if sum(stop - start for start, stop in runs) != kept:
        raise BuildError(f"the plan keeps {kept} records of {origin['file']}, its runs {runs} do not")
    old = join(cfg.dataset_uri, origin["version"], origin["file"])
    try:
        return _splice(cfg, storage, shard, origin, old, members_data, names, members_sha, progress, read_workers,
                       processes)
    except (DamagedBase, FileNotFoundError, SourceChanged) as exc:
        why = f"{old} is missing" if isinstance(exc, FileNotFoundError) else \
            f"{old} changed while it was spliced" if isinstance(exc, SourceChanged) else f"{old} is damaged: {exc}"
        log.warning("%s: shard %s is written from the source instead", why, shard)
        receipt = write_shard(cfg, storage, shard, progress, read_workers, processes, fallback=why)
        return {**receipt, "fallback": why}


def _splice(cfg: BuildConfig, storage: Storage, shard: str, origin: dict[str, Any], old: str, members_data: bytes,
            names: list[str], members_sha: str, progress: Progress, read_workers: int,
            processes: Executor | None) -> dict[str, Any]:
    kept, runs = origin["kept"], origin["runs"]
    index_data = storage.read_bytes(layout.index_file(old))
    if origin.get("index_sha256") and hashlib.sha256(index_data).hexdigest() != origin["index_sha256"]:
        raise DamagedBase("its .tfindex is not the one its version published")
    starts, lengths = _index(index_data, origin["num_records"])
    if any(not 0 <= start < stop <= len(starts) for start, stop in runs) or \
            any(a[1] > b[0] for a, b in itertools.pairwise(runs)):
        raise DamagedBase("the places its labels.csv gives are not records of it")
    ends = (starts + lengths).tolist()
    first_bytes = starts.tolist()
    schema = staged_schema(cfg, storage)
    with ExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory(dir=storage.scratch_dir(staged(cfg, SHARDS)),
                                                              prefix=TMP_PREFIX))
        path, base_path, remote, base_tag = os.path.join(tmp, shard), old, is_s3(old), None
        entry = None if remote else proof_of(cfg, storage, origin)
        proof = list(entry["identity"]) if entry else None
        if remote:  # read once, to a local file: hashed and checked here, its long runs copied by the store
            base_path = os.path.join(tmp, "base-" + origin["file"])
            base_tag = storage.download(old, base_path)
        base = stack.enter_context(open(base_path, "rb"))
        if not remote:  # after the map is closed (the stack unwinds in reverse): its pages leave the page cache
            stack.callback(_drop_cached, base.fileno())
        stat = os.fstat(base.fileno())
        size, ahead = stat.st_size, proof is not None and identity(stat) == proof  # proven by this build's prover
        if size != origin["num_bytes"] or (ends and ends[-1] != size):
            raise DamagedBase(f"it holds {size} bytes, its version published {origin['num_bytes']}")
        view = memoryview(stack.enter_context(mmap.mmap(base.fileno(), 0, access=mmap.ACCESS_READ))) \
            if size else memoryview(b"")
        stack.callback(view.release)
        kept_total = sum(ends[stop - 1] - first_bytes[start] for start, stop in runs)
        # The kept bytes copied ahead (shards.prepare), from this very base: the splice's own bytes, not copied again
        entry_ahead = prepared_entry(cfg, storage, origin) if ahead else None
        prepared = take_prepared(entry_ahead, origin, proof, kept_total, path)  # (None without an entry)
        if prepared is not None:
            stack.enter_context(prepared)
        # A copy made in the pass that proved its base carries the new digest of its bytes: none is hashed again
        kept_state = bytes.fromhex(entry_ahead.get("kept_state") or "") if prepared is not None else b""
        # The base's digest on the other core. Up to the first record the night drops, the new shard's bytes are the
        # base's: that prefix is hashed once, and the new digest starts from a copy of its state. A base proven ahead
        # is not hashed again: that thread takes the new shard's kept bytes instead, while this one copies them (where
        # this process writes them itself, below, its writing pass hashes them and no thread is needed).
        prefix = ends[runs[0][1] - 1] if runs and runs[0][0] == 0 else 0
        states = proof_states(cfg, storage, origin, entry) if ahead and prefix else None
        base_digest, after_prefix = hashlib.sha256(), threading.Event()
        shared: list[Any] = []

        def resumed() -> tuple[Any, int]:
            """The new digest of a base proven ahead, as far as the prover's last state before the prefix's end
            goes (where it saved states), and that offset."""
            return sha256_states.resumed(states[0], prefix, states[1]) if states else (hashlib.sha256(), 0)

        def hash_base() -> None:
            if ahead:
                kept_digest, done = resumed()
                for start, stop in runs:
                    if ends[stop - 1] > done:
                        kept_digest.update(view[max(first_bytes[start], done):ends[stop - 1]])
                shared.append(kept_digest)
                return
            try:
                base_digest.update(view[:prefix])
                shared.append(base_digest.copy())
            finally:
                after_prefix.set()
            base_digest.update(view[prefix:])

        # Where the kernel copies page by page (ext4, tmpfs), the kept bytes are written from the pass that hashes the
        # new shard, a piece at a time while it is in the CPU's cache, instead of read twice (measured on the
        # 100,000-image night: write stage 3.62 -> 3.28 s, medians of 3 taking turns); where copy_file_range shares
        # blocks or copies on a server, the kernel copies them while the new shard is hashed beside.
        written_here = not remote and prepared is None and copies_pages(stat.st_dev, os.stat(tmp).st_dev)
        # A base not proven ahead, written here where two streams hash in one pass: that pass takes the base's digest
        # and the new shard's together, on this thread, instead of the base's on a thread of its own beside it
        paired = written_here and not ahead and sha256_states.pairs_compiled()
        done = prefix  # the new digest's bytes before this are the base's, hashed by the thread below
        if written_here and ahead:  # no thread: the writing pass takes the new digest from the prover's state on
            kept_digest, done = resumed()
            shared.append(kept_digest)
        elif kept_state:
            shared.append(sha256_states.Sha256(kept_state))
        if paired:  # (the new digest: the base's state once the prefix is hashed, a fresh one when there is none)
            base_digest = sha256_states.Sha256()
            if not prefix:
                shared.append(sha256_states.Sha256())
        hashing = None if (written_here and (ahead or paired)) or kept_state else threading.Thread(target=hash_base)
        if hashing is not None:
            hashing.start()
        try:
            _check_framing(view, starts, lengths, _framed(runs, bool(origin.get("index_sha256"))))
            offsets: list[tuple[int, int]] = []
            out = prepared if prepared is not None else stack.enter_context(open(path, "w+b"))
            # the kept bytes this process writes skip the page cache where that pays (storage.direct_writes)
            writer = stack.enter_context(direct_writer(path, out.fileno(), size=kept_total)) if written_here else None
            written = base_at = 0  # (base_at: how far the base's digest has gone, on the paired path)
            segments: list[Segment] = []  # on S3: the kept runs, to be copied by the store
            for start, stop in runs:
                first, last = first_bytes[start], ends[stop - 1]
                if remote:
                    segments.append(Segment(last - first, _reader(base.fileno(), first), old, first))
                elif paired:  # the base's bytes before the run (records dropped), then the run into both digests
                    base_digest.update(view[base_at:first])
                    if last <= prefix:  # the prefix: the same bytes in both, hashed once
                        _write_hashed(view, writer.write, first, last, written, base_digest, 0)
                        shared.append(base_digest.copy())
                    else:
                        _write_hashed(view, writer.write, first, last, written, shared[0], 0,
                                      base_digest)
                    base_at = last
                elif written_here:  # (the prefix while the thread hashes it; the rest once its state is taken)
                    in_prefix = not ahead and last <= prefix
                    if not ahead and not in_prefix:
                        after_prefix.wait()
                    _write_hashed(view, writer.write, first, last, written,
                                  shared[0] if shared and not in_prefix else None, done)
                elif prepared is None:
                    _copy_range(base.fileno(), out.fileno(), first, last - first, written, view)
                offsets += zip((starts[start:stop] + (written - first)).tolist(), lengths[start:stop].tolist(),
                               strict=True)
                written += last - first
            if paired:
                base_digest.update(view[base_at:])
            if writer is not None:
                writer.close()
            if not remote and prepared is None:  # the disk writes what is left dirty while this process hashes
                start_writeback(out.fileno(), 0, written)
            if not ahead and not written_here:
                after_prefix.wait()
                if shared:
                    for start, stop in runs:
                        if ends[stop - 1] > prefix:
                            shared[0].update(view[max(first_bytes[start], prefix):ends[stop - 1]])
        finally:
            if hashing is not None:
                hashing.join()
        if ahead and identity(os.fstat(base.fileno())) != proof:  # its proof held when it was opened, not now
            raise SourceChanged(f"{old} changed while it was spliced")
        if not shared:
            raise BuildError(f"hashing {old} failed")
        new_digest = shared[0]
        if not ahead and base_digest.hexdigest() != origin["sha256"]:
            raise DamagedBase("it does not hash to the sha256 its version's manifest gives")
        kept_bytes = written
        progress(kept)
        out.seek(0 if remote else written)  # on S3 the local file holds only the new records
        appended = _append(cfg, storage, schema, shard, out, new_digest, member_rows(members_data, kept), kept,
                           read_workers, processes, progress)
        written += appended["bytes"]
        offsets += [(kept_bytes + a, b) for a, b in appended["offsets"]]
        out.flush()
        digest, copied = new_digest.hexdigest(), 0 if written_here or kept_state else kept_bytes  # (by a worker)
        if remote:
            segments.append(Segment(appended["bytes"], _reader(out.fileno(), 0)))
            copied = storage.compose(staged(cfg, SHARDS, shard), segments, digest,
                                     {old: base_tag} if base_tag else None)
        elif not storage.is_deferred(staged(cfg, SHARDS, shard)):  # else the build's one syncfs makes it durable
            os.fsync(out.fileno())
        out.close()
        receipt = stage_shard(cfg, storage, shard, None if remote else path, offsets, written, digest, members_sha,
                              source_bytes=appended["source_bytes"],
                              rewritten_from={"version": origin["version"], "file": origin["file"]}, spliced=True,
                              base_bytes_read=size, bytes_kept=kept_bytes, bytes_copied=copied,
                              bytes_written=written - copied, records_parsed=len(names) - kept)
    return {**_checked(cfg, storage, shard, receipt, names, members_sha), "base_proven_ahead": ahead,
            "copied_ahead": prepared is not None}


def _drop_cached(fd: int) -> None:
    """Drop the open file ``fd``'s pages from the page cache (where the system can): a base shard once spliced.

    Its bytes are now the new shard's; nothing in this build reads the base again. Left cached, the base's pages
    are what the kernel must reclaim, page by page, to find room for other pages (measured on a 100,000-image night
    with the page cache full, when the copies still went through the page cache: the write stage took 11.4 s
    copying so, 6.2 s with each base dropped once spliced). Only a cost: a reader of the previous version reads
    from disk."""
    with contextlib.suppress(AttributeError, OSError):  # no posix_fadvise (not Linux), or a file system without it
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _write_hashed(view: memoryview, write: Callable[[Any, int], None], first: int, last: int, at: int, digest: Any,
                  hashed: int, also: Any = None) -> None:
    """Write ``view[first:last]`` at ``at`` (``write(data, at)``), a piece at a time, each piece's bytes from ``hashed``
    on also into ``digest`` (None: nothing to hash) while they are in the CPU's cache; with ``also`` (a base's digest,
    ``sha256_states``), every piece goes into both, as two streams in one pass (``update_pair``)."""
    while first < last:
        end = min(last, first + WRITE_PIECE)
        if also is not None:
            sha256_states.update_pair(also, view[first:end], digest, view[first:end])
        elif digest is not None and end > hashed:
            digest.update(view[max(first, hashed):end])
        write(view[first:end], at)  # (hashed once, however many writes the piece takes)
        first, at = end, at + end - first


def write_all(fd: int, data: Any, at: int) -> None:
    """``data`` written at ``at`` in ``fd``, however few bytes each write takes."""
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            wrote = os.pwrite(fd, view[done:], at + done)
            if wrote <= 0:
                raise OSError(f"a write of {len(view) - done} bytes wrote {wrote}")
            done += wrote


def _reader(fd: int, at: int) -> Reader:
    """Reads of the bytes of the open file ``fd`` from ``at`` on (a segment's ``read``)."""

    def read(start: int, count: int) -> bytes:
        chunks, offset = [], at + start
        while count > 0 and (chunk := os.pread(fd, count, offset)):
            chunks.append(chunk)
            offset, count = offset + len(chunk), count - len(chunk)
        if count > 0:
            raise DamagedBase(f"a local copy ended {count} bytes early")
        return b"".join(chunks)

    return read


def _copy_range(source: int, target: int, offset: int, count: int, at: int, view: memoryview) -> None:
    """Copy ``count`` bytes at ``offset`` of ``source`` to ``at`` in ``target`` in the kernel; where the
    kernel or the file system cannot (no ``copy_file_range``, another device, a FUSE or network mount),
    write them from ``view``, the source's mapped bytes."""
    try:
        while count:
            done = os.copy_file_range(source, target, count, offset, at)
            if done <= 0:
                break
            offset, at, count = offset + done, at + done, count - done
    except (AttributeError, OSError):
        pass
    if count:
        os.pwrite(target, view[offset:offset + count], at)


def _append(cfg: BuildConfig, storage: Storage, schema: Any, shard: str, out: Any, digest: Any,
            rows: list[dict[str, str]], first: int, read_workers: int, processes: Executor | None,
            progress: Progress) -> dict[str, Any]:
    """Make the new records of ``rows`` (places ``first`` on in the shard) from the source, check each in full,
    write them to ``out`` (at its position) and into ``digest``; their offsets from the first one, their
    bytes and the source bytes read."""

    class Sink:
        def write(self, data: bytes) -> int:
            digest.update(data)
            return out.write(data)

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
    """Stage the check of a spliced shard: what ``validate_shard`` stages, from what splicing proved."""
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
