"""Copy the kept bytes of the base shards ahead, on a machine with cores to spare.

A night's spliced shard is its base shard's kept runs of records, copied by the kernel, then its new records
(``shards.splice``). On a many-core machine the copying is bound by the disk, not the cores: nine 93 MB shards
spliced at once wait for the disk to take 850 MB. Those bytes need not wait for the plan. Once discovery has
listed the source, the records a night keeps are, but for rare cases, those whose source file is listed again
unchanged (name, size and stamp as the base's ``inspected.csv`` has them): ``predicted_runs`` joins the listing
with the base's ``inspected.csv`` and ``labels.csv`` (in a pool process), and ``prepare_copy`` copies each base
shard's predicted runs into a file beside the staged shards (``prepared_dir``; pool processes too, while the
metadata stages run), and starts the disk on it.

A prepared copy is only a head start. The splice takes it (``take_prepared``) only when its runs are the plan's,
its base is the file this build's prover proved and the copy was made from (same identity before and after),
the base index it used is the one the plan's origin gives, and the copy is still the file, and the size, it
was left as: then the copy is the splice's own bytes, byte for byte. Any other copy is left, and removed with
the folder after the write stage. Whether a splice took one is in its result (``copied_ahead``), never in the
version's bytes or manifest.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections import defaultdict
from typing import Any

from ..config import BuildConfig
from ..published import layout
from ..rules.shards import runs_of
from ..staging import DISCOVERED, SHARDS, TMP_PREFIX, staged
from ..storage import Storage, join
from ..storage.documents import list_rows
from ..storage.writeback import start_writeback
from .proofs import identity

PREPARED = TMP_PREFIX + "prepared"  # the folder of the prepared copies, beside the staged shards


def prepared_dir(cfg: BuildConfig, storage: Storage) -> str | None:
    """Where this build's prepared copies go (None on S3: nothing is copied ahead there)."""
    scratch = storage.scratch_dir(staged(cfg, SHARDS))
    return None if scratch is None else os.path.join(scratch, PREPARED)


def predicted_runs(cfg: BuildConfig, storage: Storage, base_uri: str) -> dict[str, list[list[int]]]:
    """In a pool process: for each base shard that loses records, the ``[start, stop)`` runs of its places whose
    source file is listed again with the size and stamp the base's ``inspected.csv`` gives (a file without a
    stamp counts as changed). Shards that keep every record are left out (reused, or extended at their end)."""
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


def prepare_copy(base_path: str, num_records: int, runs: list[list[int]], out_path: str,
                 stop_flag: str) -> dict[str, Any] | None:
    """In a pool process: copy the bytes of ``runs`` of the base shard at ``base_path`` (``num_records`` records,
    placed by its ``.tfindex``) into a new file at ``out_path``, and start the disk on it. Returns what
    ``take_prepared`` checks; None (and no file) when the base or its index cannot be read as they are, the base
    changed while it was copied, or ``stop_flag`` appeared (asked between runs)."""
    from .splice import DamagedBase, _copy_range, _index

    try:
        with open(layout.index_file(base_path), "rb") as f:
            index_data = f.read()
        starts, lengths = _index(index_data, num_records)
        ends = (starts + lengths).tolist()
        first_bytes = starts.tolist()
        if any(not 0 <= start < stop <= num_records for start, stop in runs):
            return None
        with open(base_path, "rb", buffering=0) as base, open(out_path, "xb", buffering=0) as out:
            before = identity(os.fstat(base.fileno()))
            written = 0
            for start, stop in runs:
                if os.path.exists(stop_flag):
                    raise InterruptedError
                first, last = first_bytes[start], ends[stop - 1]
                _copy_range(base.fileno(), out.fileno(), first, last - first, written, memoryview(b""))
                written += last - first
            if os.fstat(out.fileno()).st_size != written or identity(os.fstat(base.fileno())) != before:
                raise InterruptedError
            start_writeback(out.fileno(), 0, written)
            copy = identity(os.fstat(out.fileno()))
        return {"runs": runs, "base_identity": before, "identity": copy, "bytes": written,
                "index_sha256": hashlib.sha256(index_data).hexdigest(), "path": out_path}
    except (OSError, ValueError, IndexError, DamagedBase, InterruptedError):
        with contextlib.suppress(OSError):
            os.unlink(out_path)
        return None


def take_prepared(entry: dict[str, Any] | None, origin: dict[str, Any], base_identity: list[int], kept_bytes: int,
                  path: str) -> Any:
    """The prepared copy ``entry`` (``prepare_copy``'s answer, as staged) moved to ``path`` and opened for the
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
