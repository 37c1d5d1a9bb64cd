"""Copy the kept bytes of the base shards ahead, in the pass that proves them, while the metadata stages run.

A night's spliced shard is its base shard's kept runs of records, then its new records (``shards.splice``). Its
kept bytes must reach the disk (4.65 GB at 100,000 images, about 4 s for this VM's disk), and need not wait for
the plan: once discovery has listed the source, the records a night keeps are, but for rare cases, those whose
source file is listed again unchanged (name, size and stamp as the base's ``inspected.csv`` has them).
``predicted_runs`` joins the listing with the base's ``inspected.csv`` and ``labels.csv`` (in a pool process), and
the prover (``shards.proofs``) then takes each base shard that loses records through ``prove_and_copy``: one pass
over its bytes hashes the base (its proof), writes the predicted runs into a file beside the staged shards
(``prepared_dir``) and hashes them as they are written (two SHA-256 streams at once, ``sha256_states.update_pair``),
writing them with ``O_DIRECT`` as the splices do (``storage.direct_writes``); the state of that second digest goes
with the copy. A base shard the prover proved before
the prediction came (a prover started with discovery, on a large base) is copied by ``copy_proven``, two shards a
pass: their new digests are the two streams, each from the prover's last saved state before the shard's first
dropped record (measured on the 100,000-image night: 15 -> 30 of 48 bases copied ahead, write stage 2.62 -> 1.84 s,
the night 7.78 -> 6.77 s, medians of 6 taking turns).

A prepared copy is only a head start. The splice takes it (``take_prepared``) only when its runs are the plan's,
its base is the file this build's prover proved and the copy was made from (same identity before and after),
the base index it used is the one the plan's origin gives, and the copy is still the file, and the size, it
was left as: then the copy is the splice's own bytes, byte for byte, and the splice's digest goes on from the
copy's state with the new records. Any other copy is left, and removed with the folder after the write stage.
Whether a splice took one is in its result (``copied_ahead``), never in the version's bytes or manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import defaultdict
from typing import Any

from ..config import BuildConfig
from ..published import layout
from ..rules.base_version import INSPECTION_FIELDS
from ..rules.shards import runs_of
from ..source.listing import DISCOVERED_FIELDS
from ..staging import DISCOVERED, SHARDS, TMP_PREFIX, staged
from ..storage import Storage, join, sha256_states
from ..storage.base import MAPPED_CHUNK, mapped_chunks
from ..storage.csv_blocks import Quoted, Ragged, blocks, table_blocks
from ..storage.direct_writes import direct_writer
from ..storage.documents import list_rows
from ..storage.span_map import SpanMap
from .proofs import Held, identity

PREPARED = TMP_PREFIX + "prepared"  # the folder of the prepared copies, beside the staged shards


def prepared_dir(cfg: BuildConfig, storage: Storage) -> str | None:
    """Where this build's prepared copies go (None on S3: nothing is copied ahead there)."""
    scratch = storage.scratch_dir(staged(cfg, SHARDS))
    return None if scratch is None else os.path.join(scratch, PREPARED)


def predicted_runs(cfg: BuildConfig, storage: Storage, base_uri: str) -> dict[str, list[list[int]]]:
    """In a pool process: for each base shard that loses records, the ``[start, stop)`` runs of its places whose
    source file is listed again with the size and stamp the base's ``inspected.csv`` gives (a file without a
    stamp counts as changed). Shards that keep every record are left out (reused, or extended at their end).
    Read as columns (``csv_blocks``, the joins in a ``SpanMap``: about 1 us a row), or row by row for a table with
    a quoted field."""
    try:
        return _predicted_from_blocks(cfg, storage, base_uri)
    except (Quoted, Ragged, ValueError):
        return _predicted_from_rows(cfg, storage, base_uri)


def _predicted_from_blocks(cfg: BuildConfig, storage: Storage, base_uri: str) -> dict[str, list[list[int]]]:
    import numpy as np

    listed, unchanged = SpanMap(), SpanMap()
    with blocks(storage, staged(cfg, DISCOVERED), ",".join(DISCOVERED_FIELDS)) as parts:
        for part in parts:  # "name" + ",size,stamp" (the label's end is the comma before the size), stamped ones
            rows = np.flatnonzero(part.stops[:, 3] > part.starts[:, 3])
            listed.add(part.data, part.starts[rows, 0], part.stops[rows, 0], np.ones(len(rows), dtype=np.int64),
                       part.stops[rows, 1], part.stops[rows, 3])
    with blocks(storage, join(base_uri, layout.INSPECTED), ",".join(INSPECTION_FIELDS)) as parts:
        for part in parts:  # "name,size,stamp"
            rows = np.flatnonzero(listed.get(part.data, part.starts[:, 0], part.stops[:, 2]) > 0)
            unchanged.add(part.data, part.starts[rows, 0], part.stops[rows, 0], np.ones(len(rows), dtype=np.int64))
    kept_of: dict[str, list[Any]] = {}
    dropped: set[str] = set()
    with table_blocks(storage, join(base_uri, layout.LABELS)) as (names, parts):
        if names[0] != "filename" or "shard" not in names or "shard_position" not in names:
            return {}
        shard, place = names.index("shard"), names.index("shard_position")
        for part in parts:
            keep = unchanged.get(part.data, part.starts[:, 0], part.stops[:, 0]) > 0
            files, which = np.unique(part.column(shard), return_inverse=True)
            places = part.integers(place)
            for number, file in enumerate(files.tolist()):
                mine = which.ravel() == number
                name = file.decode("utf-8", "surrogateescape")
                kept_of.setdefault(name, []).append(places[mine & keep])
                if not keep[mine].all():
                    dropped.add(name)
    return {file: runs_of(np.sort(np.concatenate(kept_of[file])).tolist()) for file in sorted(dropped)}


def _predicted_from_rows(cfg: BuildConfig, storage: Storage, base_uri: str) -> dict[str, list[list[int]]]:
    """``predicted_runs`` row by row."""
    listed: set[str] = set()
    with list_rows(storage, staged(cfg, DISCOVERED)) as rows:  # filename, label, num_bytes, stamp
        for values in rows.reader:
            if values[3]:
                listed.add(f"{values[0]}\0{values[2]}\0{values[3]}")
    unchanged: set[str] = set()
    with list_rows(storage, join(base_uri, layout.INSPECTED)) as rows:  # filename, num_bytes, stamp, ...
        if list(rows.fieldnames[:3]) != ["filename", "num_bytes", "stamp"]:
            return {}
        for values in rows.reader:
            if f"{values[0]}\0{values[1]}\0{values[2]}" in listed:
                unchanged.add(values[0])
    places: defaultdict[str, list[int]] = defaultdict(list)
    dropped: set[str] = set()
    with list_rows(storage, join(base_uri, layout.LABELS)) as rows:
        names = list(rows.fieldnames)
        if "shard" not in names or "shard_position" not in names:
            return {}
        shard, place = names.index("shard"), names.index("shard_position")
        for values in rows.reader:
            if values[0] in unchanged:
                places[values[shard]].append(int(values[place]))
            else:
                dropped.add(values[shard])
    return {file: runs_of(sorted(places[file])) for file in sorted(dropped)}


def _kept_ranges(base_path: str, num_records: int, runs: list[list[int]]
                 ) -> tuple[bytes, list[tuple[int, int]], int | None] | None:
    """The base shard's ``.tfindex`` (read beside it), the byte ranges ``[first, last)`` of ``runs`` (its records, as
    that index places them) and where its last record ends (None without records); None for runs that are not
    records of it. OSError or ``DamagedBase`` where the index cannot be read or parsed."""
    from .splice import _index

    with open(layout.index_file(base_path), "rb") as f:
        index_data = f.read()
    starts, lengths = _index(index_data, num_records)
    if any(not 0 <= start < stop <= num_records for start, stop in runs):
        return None
    ends, first_bytes = (starts + lengths).tolist(), starts.tolist()
    return index_data, [(first_bytes[start], ends[stop - 1]) for start, stop in runs], ends[-1] if ends else None


def _copy_entry(runs: list[list[int]], base_identity: list[int], out: int, written: int, index_data: bytes,
                path: str, digest: Any) -> dict[str, Any]:
    """What ``take_prepared`` checks of a copy of ``written`` bytes in the open file ``out`` at ``path`` (written
    directly, or the disk started on them: ``direct_writes``), made of ``runs`` of the base file ``base_identity``
    through ``index_data``; ``digest``: their SHA-256 so far (``sha256_states.Sha256``), whose state a splice goes on
    from."""
    return {"runs": runs, "base_identity": base_identity, "identity": identity(os.fstat(out)), "bytes": written,
            "index_sha256": hashlib.sha256(index_data).hexdigest(), "path": path, "kept_state": digest.state().hex()}


def prove_and_copy(base_path: str, num_bytes: int, num_records: int, runs: list[list[int]], out_path: str,
                   stop_flag: str) -> tuple[Held | None, int, dict[str, Any] | None]:
    """In a pool process, in one pass over the base shard at ``base_path`` (mapped, as the prover maps it): its
    SHA-256 with states saved every MiB (the prover's proof, ``Held``), and the bytes of ``runs`` (its records,
    placed by its ``.tfindex``) written into a new file at ``out_path``, with the SHA-256 state of those
    bytes (the spliced shard's digest up to its new records: a splice that takes the copy hashes none of them again).
    The two digests are two streams of the same pass (``sha256_states.update_pair``). Returns the proof (None when
    the file is not ``num_bytes`` long), the bytes read and what ``take_prepared`` checks (None, and no file, when
    the base or its index cannot be read as they are, the base changed while it was read, or ``stop_flag``
    appeared: asked between chunks)."""
    from .splice import DamagedBase

    read, every = 0, sha256_states.STATE_EVERY
    try:
        found = _kept_ranges(base_path, num_records, runs)
        if found is None:
            return None, 0, None
        index_data, kept, end_of_index = found
        kept_bytes = sum(last - first for first, last in kept)
        with open(base_path, "rb", buffering=0) as base, open(out_path, "xb", buffering=0) as out, \
                direct_writer(out_path, out.fileno(), size=kept_bytes) as writer:
            before = identity(os.fstat(base.fileno()))
            if before[2] != num_bytes or not num_bytes or end_of_index not in (None, num_bytes):
                raise InterruptedError
            base_digest, kept_digest, states = sha256_states.Sha256(), sha256_states.Sha256(), []
            written, k = 0, 0
            for chunk in mapped_chunks(base, lambda: os.path.exists(stop_flag), MAPPED_CHUNK):
                at, stop = read, read + len(chunk)
                while at < stop:  # pieces up to the next saved state, or the next edge of a kept run
                    while k < len(kept) and kept[k][1] <= at:
                        k += 1
                    inside = k < len(kept) and kept[k][0] <= at
                    end = min(stop, (at // every + 1) * every,
                              (kept[k][1] if inside else kept[k][0]) if k < len(kept) else stop)
                    piece = chunk[at - read:end - read]
                    if inside:
                        sha256_states.update_pair(base_digest, piece, kept_digest, piece)
                        writer.write(piece, written)
                        written += end - at
                    else:
                        base_digest.update(piece)
                    at = end
                    if at % every == 0:
                        states.append(base_digest.state())
                read = stop
            writer.close()
            if read != num_bytes or identity(os.fstat(base.fileno())) != before or \
                    written != kept_bytes:
                raise InterruptedError
            entry = _copy_entry(runs, before, out.fileno(), written, index_data, out_path, kept_digest)
        return (base_digest.hexdigest(), before, b"".join(states)), read, entry
    except (OSError, ValueError, IndexError, DamagedBase, InterruptedError, RuntimeError):
        with contextlib.suppress(OSError):
            os.unlink(out_path)
        return None, read, None


class _ProvenCopy:
    """One base shard of ``copy_proven``: its kept runs, the file its prover proved, and the new digest."""

    def __init__(self, stack: contextlib.ExitStack, item: dict[str, Any]) -> None:
        import mmap

        runs = self.runs = item["runs"]
        found = _kept_ranges(item["base_path"], item["num_records"], runs) if runs else None
        if found is None:
            raise ValueError("runs that are not records of the base shard")
        self.index_data, self.kept, end_of_index = found
        self.total = sum(last - first for first, last in self.kept)
        base = stack.enter_context(open(item["base_path"], "rb", buffering=0))  # noqa: SIM115 - closed by the stack
        self.base, self.proof, self.path = base, list(item["identity"]), item["out_path"]
        if identity(os.fstat(base.fileno())) != self.proof or end_of_index != self.proof[2]:
            raise InterruptedError  # not the file the prover proved
        mapped = mmap.mmap(base.fileno(), 0, access=mmap.ACCESS_READ)
        stack.callback(_close_map, mapped)
        self.view = memoryview(mapped)
        stack.callback(self.view.release)
        # The bytes before the first record dropped are the base's: the digest goes on from the prover's last state
        prefix = self.kept[0][1] if runs[0][0] == 0 else 0
        self.digest, self.done = sha256_states.resumed(item["states"], prefix, sha256_states.STATE_EVERY) \
            if prefix else (sha256_states.Sha256(), 0)
        self.out = stack.enter_context(open(self.path, "xb", buffering=0))  # noqa: SIM115 - closed by the stack
        self.writer = stack.enter_context(direct_writer(self.path, self.out.fileno(), size=self.total))

    def pieces(self) -> Any:
        """(bytes to write, where in the new file, the part of them still to hash), up to ``WRITE_PIECE`` at a time."""
        from .splice import WRITE_PIECE

        at = 0
        for first, last in self.kept:
            while first < last:
                end = min(last, first + WRITE_PIECE)
                piece = self.view[first:end]
                yield piece, at, piece[max(0, self.done - at):]
                at, first = at + end - first, end

    def next_to_hash(self, pieces: Any) -> tuple[tuple[Any, int, Any] | None, int]:
        """The next of ``pieces`` (``pieces()``) with bytes to hash (None at their end), the pieces before it written
        on the way, and their bytes."""
        moved = 0
        for data, at, rest in pieces:
            if len(rest):
                return (data, at, rest), moved
            self.writer.write(data, at)
            moved += len(data)
        return None, moved

    def entry(self) -> dict[str, Any]:
        """What ``take_prepared`` checks, once every piece is written (InterruptedError: the base changed)."""
        self.writer.close()
        if identity(os.fstat(self.base.fileno())) != self.proof or os.fstat(self.out.fileno()).st_size != self.total:
            raise InterruptedError
        return _copy_entry(self.runs, self.proof, self.out.fileno(), self.total, self.index_data, self.path,
                           self.digest)


def _close_map(mapped: Any) -> None:
    with contextlib.suppress(BufferError):  # a piece still held (a pass cut short): unmapped once it is let go of
        mapped.close()


def copy_proven(items: list[dict[str, Any]], stop_flag: str) -> list[dict[str, Any] | None]:
    """In a pool process: the kept runs of base shards this build's prover proved already (before it knew their runs)
    written into new files, as ``prove_and_copy`` writes them, two shards at once: their new digests are two streams
    of one pass (``sha256_states.update_pair``), each from the prover's last saved state before the shard's first
    dropped record. Each item: ``base_path``, ``num_records``, ``identity`` (the proof's), ``runs``, ``out_path`` and
    ``states`` (the prover's saved states). Returns each copy's entry (``take_prepared``), or None, and no file, where
    the base or its index cannot be read, the base is not (or no longer) the file proved, or ``stop_flag`` appeared
    (asked every few MiB)."""
    from .splice import DamagedBase

    entries: list[dict[str, Any] | None] = [None] * len(items)
    with contextlib.ExitStack() as stack:
        copies: dict[int, _ProvenCopy] = {}
        for number, item in enumerate(items):
            try:
                copies[number] = _ProvenCopy(stack, item)
            except (OSError, ValueError, IndexError, InterruptedError, RuntimeError, DamagedBase):
                continue
        streams = [(copy, copy.pieces()) for copy in copies.values()]
        try:
            moved = MAPPED_CHUNK  # (the flag is asked before the first piece, then every MAPPED_CHUNK bytes)
            while streams:
                if moved >= MAPPED_CHUNK:
                    moved = 0
                    if os.path.exists(stop_flag):
                        raise InterruptedError
                pieces = []  # each stream's next piece to hash (the prefix's, hashed already, written on the way)
                for copy, stream in list(streams):
                    piece, skipped = copy.next_to_hash(stream)
                    moved += skipped
                    if piece is None:
                        streams.remove((copy, stream))
                    else:
                        pieces.append((copy, *piece))
                if len(pieces) == 2:
                    sha256_states.update_pair(pieces[0][0].digest, pieces[0][3], pieces[1][0].digest, pieces[1][3])
                elif pieces:
                    pieces[0][0].digest.update(pieces[0][3])
                for copy, data, at, _ in pieces:
                    copy.writer.write(data, at)
                    moved += len(data)
                del pieces  # (no view of a map outlives its pass)
            for number, copy in copies.items():
                with contextlib.suppress(OSError, InterruptedError):
                    entries[number] = copy.entry()
        except (OSError, InterruptedError, ValueError, RuntimeError):  # (RuntimeError: a SHA-256 call failed)
            pass
        finally:
            streams.clear()
    for number, copy in copies.items():
        if entries[number] is None:
            with contextlib.suppress(OSError):
                os.unlink(copy.path)
    return entries


def take_prepared(entry: dict[str, Any] | None, origin: dict[str, Any], base_identity: list[int], kept_bytes: int,
                  path: str) -> Any:
    """The prepared copy ``entry`` (``prove_and_copy``'s answer, as staged) moved to ``path`` and opened for the
    splice to append to, when it holds exactly the bytes the splice of ``origin`` (a plan's rewrite) would copy
    from the base it proved (``base_identity``, which is now that file's): None otherwise (the splice copies)."""
    if not entry or entry.get("runs") != origin.get("runs") or entry.get("base_identity") != base_identity or \
            entry.get("bytes") != kept_bytes or not origin.get("index_sha256") or \
            entry.get("index_sha256") != origin["index_sha256"]:
        return None
    try:
        out = open(entry["path"], "r+b")  # noqa: SIM115 - the splice's file from here on
    except (OSError, KeyError, TypeError):
        return None
    try:
        stat = os.fstat(out.fileno())
        if identity(stat) != entry.get("identity") or stat.st_size != kept_bytes:
            out.close()
            return None
        os.rename(entry["path"], path)  # this splice's now: no other can take it
        return out
    except OSError:
        out.close()
        return None
