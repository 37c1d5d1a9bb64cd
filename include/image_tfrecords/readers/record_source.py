"""Random access to a published split: ``len(source)`` and ``source[i]``, for PyTorch and Grain (docs/readers.md)::

    source = RecordSource("s3://datasets/image-tfrecords/flowers", "train")  # the version latest.json names
    record = source[17]  # {"index", "filename", "label", "label_text", "image", ...}: plain Python and numpy

Record ``i`` is found through the shards' ``.tfindex`` files (one ``start length`` line per record), read
by its offset (``os.pread`` on a local shard; a ranged GET on S3, through a small cache of blocks so that
neighbouring records share a request), its TFRecord CRCs checked and its ``tf.train.Example`` parsed with
protobuf: no TensorFlow. A source pickles without its files, clients and caches, and a forked process
opens its own, so each DataLoader worker or Grain process reads with its own; reads are thread-safe.

Checks: each shard's SHA-256 against the manifest, once per shard per process, when the process first
reads from it (``verify="none"`` skips that); a damaged record raises ``DamagedRecordError`` naming the
shard and byte offset; gzip versions are refused (there is no seeking into a gzip stream).
"""

from __future__ import annotations

import bisect
import concurrent.futures
import copy
import hashlib
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import DamagedFile, ImageTfrecordsError, NotPublishedError, ShardChecksumError
from ..published.layout import index_file, is_name, published_before, read_manifest, resolve, version_key
from ..published.manifest import Manifest
from ..records.example import parse_example
from ..records.schema import (
    CHANNELS_KEY,
    FILENAME_KEY,
    FORMAT_KEY,
    HEIGHT_KEY,
    IMAGE_KEY,
    LABEL_KEY,
    RAW_KEY,
    SHA256_KEY,
    SHAPE_KEY,
    TEXT_KEY,
    WIDTH_KEY,
)
from ..records.tfrecord import CorruptRecordError, masked_crc
from ..storage import Storage, is_s3, join, sha256_file

__all__ = ["DamagedRecordError", "NotRandomAccessible", "RecordSource"]

VERIFY = ("shard", "none")
BLOCK_SIZE = 512 * 1024  # S3: bytes fetched per request for records smaller than this...
CACHE_BLOCKS = 32  # ...and how many such blocks each process keeps (16 MiB)
S3_THREADS = 8  # concurrent ranged GETs of one batch (``__getitems__``)
_HEADER = struct.Struct("<QI")  # length, masked CRC of the length
_FOOTER = struct.Struct("<I")  # masked CRC of the data
_FRAMING = _HEADER.size + _FOOTER.size
_LIST = ("bytes_list", "int64_list", "float_list")
_KIND = {"string": "bytes_list", "int64": "int64_list", "float": "float_list"}


class DamagedRecordError(ImageTfrecordsError, CorruptRecordError):
    """A record whose bytes do not match its framing or CRCs; the message names the shard and byte offset."""


class NotRandomAccessible(ImageTfrecordsError, ValueError):
    """A version whose shards cannot be read by offset (gzip)."""


@dataclass(frozen=True)
class _Shard:
    uri: str
    index_uri: str
    num_records: int
    num_bytes: int
    sha256: str
    index_sha256: str | None


@dataclass(frozen=True)
class _Feature:
    key: str  # the record's feature key
    name: str  # the key of the returned dict
    kind: str  # bytes_list, int64_list or float_list
    text: bool  # bytes decoded as UTF-8
    scalar: bool  # one value (else a list)


@dataclass
class _Local:
    """What one process holds: open files, loaded indexes, verified shards, its S3 client and block cache."""

    storage: Storage
    pid: int = field(default_factory=os.getpid)
    lock: threading.Lock = field(default_factory=threading.Lock)
    offsets: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)  # shard -> (starts, lengths)
    fds: dict[int, int] = field(default_factory=dict)
    blocks: OrderedDict[tuple[int, int], bytes] = field(default_factory=OrderedDict)
    pool: concurrent.futures.ThreadPoolExecutor | None = None

    def close(self) -> None:
        with self.lock:
            if self.pid == os.getpid():
                for fd in self.fds.values():
                    os.close(fd)
                if self.pool is not None:
                    self.pool.shutdown(wait=False)
            self.fds.clear()
            self.pool = None


class RecordSource:
    """The records of one split of a published version, by index (see the module).

    ``uri``: a dataset (``DEST/DATASET``, read at the version ``latest.json`` names, or at ``version``) or a
    version folder, local or ``s3://``. A record is a dict: ``index`` (its place in the split), ``filename``,
    ``label`` (the class id, ``source.classes[label]``; a list of ids for a multi-label version) and
    ``label_text`` (the name, or names), ``image`` (the stored bytes, JPEG or PNG; for a raw version a
    writable ``uint8`` numpy array of the record's ``image/shape``), ``format``, ``height``, ``width``,
    ``channels``, ``sha256`` (of the source file), and each metadata column under its name (str, int or
    float; a list for ``*_list`` columns; ``column:NAME`` for a column named like one of these fields).
    ``fields`` keeps only those named (``source.fields`` lists them all): less to parse, and less to pass
    between processes. ``verify``: ``"shard"`` (default) checks each shard's SHA-256
    against the manifest once per process before the first record is read from it (locally: the whole
    shard hashed; on S3: the SHA-256 the store verified when the shard was uploaded, one HEAD; or the
    object's bytes hashed when the store holds none); ``"none"`` skips it. Every read checks the record's
    CRCs either way. ``block_size`` and ``cache_blocks`` size the S3 block cache (0: one exact ranged GET
    per record). Satisfies Grain's ``RandomAccessDataSource`` (and its batched ``_getitems``).
    """

    def __init__(self, uri: str, split: str, version: str | None = None, *, fields: Sequence[str] | None = None,
                 verify: str = "shard", storage: Storage | None = None, block_size: int = BLOCK_SIZE,
                 cache_blocks: int = CACHE_BLOCKS) -> None:
        if verify not in VERIFY:
            raise ValueError(f"verify must be one of {', '.join(VERIFY)}, not {verify!r}")
        if block_size < 0 or cache_blocks < 0:
            raise ValueError("block_size and cache_blocks must be >= 0")
        storage = storage or Storage()
        self.version = _version_uri(storage, uri, version)
        self.manifest: Manifest = read_manifest(storage, self.version)
        if self.manifest.compression != "none":
            raise NotRandomAccessible(
                f"{self.version}: its shards are {self.manifest.compression}-compressed and a compressed stream "
                "cannot be read from an offset: random access needs a version built with --compression none")
        if split not in self.manifest.splits:
            raise ValueError(f"unknown split {split!r}; available splits: {', '.join(sorted(self.manifest.splits))}")
        self.split = split
        self.verify = verify
        self.classes = list(self.manifest.classes)
        self._block_size, self._cache_blocks = block_size, cache_blocks
        self._shards = [_Shard(join(self.version, s.file), join(self.version, index_file(s.file)), s.num_records,
                               s.num_bytes, s.sha256, s.index_sha256) for s in self.manifest.splits[split].shards]
        self._ends = [int(n) for n in np.cumsum([s.num_records for s in self._shards])]  # record count up to shard k
        features = _features(self.manifest)
        self.fields = ["index", *(f.name for f in features if f.key != SHAPE_KEY)]
        if fields is not None:
            unknown = [name for name in fields if name not in self.fields]
            if unknown:
                raise ValueError(f"unknown fields {', '.join(map(repr, unknown))}; this version's records have "
                                 f"{', '.join(self.fields)}")
            self.fields = [name for name in self.fields if name in fields]
        self._raw = RAW_KEY in (self.manifest.features or {}) and "image" in self.fields
        self._features = [f for f in features if f.name in self.fields or (f.key == SHAPE_KEY and self._raw)]
        self._index = "index" in self.fields
        self._storage = storage
        self._local: _Local | None = None

    # -- the protocol: len, [i], batches ---------------------------------------------------------------
    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        """The records at ``indices`` (a DataLoader's batch, Grain's ``_getitems``), read together: on S3
        their blocks are fetched concurrently, neighbours sharing a request."""
        local = self._state()
        located = [self._locate(local, i) for i in indices]
        wanted = [where for _, where in located]
        return [self._record(i, shard, start, data) for (i, (shard, start, _)), data
                in zip(located, self._read(local, wanted), strict=True)]

    _getitems = __getitems__  # Grain's SupportsBatchedReadRandomAccessDataSource

    def _stream(self, indices: Sequence[int]) -> tuple[int, Iterator[dict[str, Any]]]:
        """The records at ``indices`` made one at a time (``torch_dataset.collate_bytes`` copies each image
        into a batch buffer and drops the record before the next is read: a batch's records are never all
        in memory at once, so the allocator does not hand that memory back to the system and fault it in
        again on every batch), and the bytes they take in the shards (a bound on their images' size). Local
        shards are read record by record; on S3 the batch's bytes are fetched together as ``__getitems__``
        does, then parsed one at a time. Indices are checked before anything is read."""
        local = self._state()
        located = [self._locate(local, i) for i in indices]
        size = sum(length for _, (_, _, length) in located)

        def records() -> Iterator[dict[str, Any]]:
            if located and is_s3(self._shards[located[0][1][0]].uri):
                datas: Iterable[bytes] = self._read(local, [where for _, where in located])
            else:
                datas = (os.pread(local.fds[shard], length, start) for _, (shard, start, length) in located)
            for (i, (shard, start, _)), data in zip(located, datas, strict=True):
                yield self._record(i, shard, start, data)

        return size, records()

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return f"RecordSource({self.version!r}, {self.split!r}, records={len(self)}, verify={self.verify!r})"

    # -- pickling and processes ---------------------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_local": None}  # files, clients and caches stay in their process

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def verify_shards(self) -> None:
        """Check every shard of the split against the manifest's SHA-256 now, in this process
        (ShardChecksumError names the first that differs). A local shard hashed here is not hashed again
        by this process, nor by the DataLoader workers it forks afterwards (they start with what it knows)."""
        storage = self._state().storage
        for shard in self._shards:
            _verify(storage, shard)

    def close(self) -> None:
        """Close this process's open shard files (a later read opens them again)."""
        if self._local is not None:
            self._local.close()
            self._local = None

    def __enter__(self) -> RecordSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _state(self) -> _Local:
        """This process's state, made on first use and anew in a forked child (which must not share the
        parent's S3 connections)."""
        local = self._local
        if local is None or local.pid != os.getpid():
            with _state_lock:
                local = self._local
                if local is None or local.pid != os.getpid():
                    local = self._local = _Local(copy.copy(self._storage))  # a Storage copies without its client
        return local

    # -- finding and reading records ------------------------------------------------------------------
    def _locate(self, local: _Local, index: int) -> tuple[int, tuple[int, int, int]]:
        """Record ``index`` (negative: from the end) as (index, (shard, start, length))."""
        count = len(self)
        i = int(index)
        if i < 0:
            i += count
        if not 0 <= i < count:
            raise IndexError(f"record {index} of a split of {count}")
        shard = bisect.bisect_right(self._ends, i)
        position = i - (self._ends[shard - 1] if shard else 0)
        offsets = local.offsets.get(shard) or self._open(local, shard)
        return i, (shard, int(offsets[0][position]), int(offsets[1][position]))

    def _open(self, local: _Local, shard: int) -> tuple[np.ndarray, np.ndarray]:
        """Load a shard's index and verify the shard (once per process); open a local shard."""
        with local.lock:
            if shard in local.offsets:
                return local.offsets[shard]
            entry = self._shards[shard]
            offsets = _load_index(local.storage, entry, self.verify != "none")
            if self.verify == "shard":
                _verify(local.storage, entry)
            if not is_s3(entry.uri):
                fd = os.open(entry.uri, os.O_RDONLY | os.O_CLOEXEC)
                size = os.fstat(fd).st_size
                if size != entry.num_bytes:
                    os.close(fd)
                    raise ShardChecksumError(f"shard {entry.uri} has {size} bytes, the manifest says "
                                             f"{entry.num_bytes}: it is corrupt or was changed after publishing")
                local.fds[shard] = fd
            local.offsets[shard] = offsets
            return offsets

    def _read(self, local: _Local, wanted: list[tuple[int, int, int]]) -> list[bytes]:
        """The bytes of each (shard, start, length)."""
        if not wanted:
            return []
        if not is_s3(self._shards[wanted[0][0]].uri):
            return [os.pread(local.fds[shard], length, start) for shard, start, length in wanted]
        return _S3Reads(self, local).read(wanted)

    def _record(self, index: int, shard: int, start: int, data: bytes) -> dict[str, Any]:
        """The record's dict, once its framing and CRCs are checked and its Example parsed."""
        try:
            payload = _unframe(data)
            message = parse_example(payload)
        except ValueError as exc:
            raise DamagedRecordError(f"damaged record in {self._shards[shard].uri} at byte offset {start} "
                                     f"(record {index} of split {self.split!r}): {exc}") from None
        features = message.features.feature
        out: dict[str, Any] = {"index": index} if self._index else {}
        for spec in self._features:
            if spec.key not in features:
                raise DamagedRecordError(f"damaged record in {self._shards[shard].uri} at byte offset {start} "
                                         f"(record {index} of split {self.split!r}): no {spec.key} feature")
            values = getattr(features[spec.key], spec.kind).value
            if spec.text:
                values = [v.decode("utf-8", "replace") for v in values]
            out[spec.name] = (values[0] if values else None) if spec.scalar else list(values)
        if self._raw:
            pixels = np.frombuffer(bytearray(out["image"]), np.uint8)  # writable, for torch.from_numpy
            out["image"] = pixels.reshape(out.pop("shape"))
        return out


class _S3Reads:
    """Ranged GETs for one batch: records up to ``block_size`` come from cached blocks (runs of missing
    blocks of a shard fetched by one request), bigger ones by an exact range; requests run concurrently."""

    def __init__(self, source: RecordSource, local: _Local) -> None:
        self.source, self.local = source, local
        self.size = source._block_size

    def read(self, wanted: list[tuple[int, int, int]]) -> list[bytes]:
        if not self.size:
            return self._map(lambda w: self._get(*w), wanted)
        blocks = self._cached(wanted)
        need = sorted({(shard, b) for shard, start, length in wanted if length <= self.size
                       for b in range(start // self.size, (start + length - 1) // self.size + 1)} - set(blocks))
        large = [w for w in wanted if w[2] > self.size]
        runs = _runs(need)
        fetched = self._map(self._fetch, [("run", r) for r in runs] + [("exact", w) for w in large])
        exact: dict[tuple[int, int, int], bytes] = {}
        for (kind, what), data in zip([("run", r) for r in runs] + [("exact", w) for w in large], fetched,
                                      strict=True):
            if kind == "exact":
                exact[what] = data
                continue
            shard, first, last = what
            for b in range(first, last + 1):
                blocks[(shard, b)] = data[(b - first) * self.size:(b - first + 1) * self.size]
        self._keep({k: blocks[k] for k in need})
        out = []
        for shard, start, length in wanted:
            if length > self.size:
                out.append(exact[(shard, start, length)])
                continue
            first, last = start // self.size, (start + length - 1) // self.size
            joined = b"".join(blocks[(shard, b)] for b in range(first, last + 1))
            out.append(joined[start - first * self.size:start - first * self.size + length])
        return out

    def _fetch(self, job: tuple[str, Any]) -> bytes:
        kind, what = job
        if kind == "exact":
            return self._get(*what)
        shard, first, last = what
        end = min((last + 1) * self.size, self.source._shards[shard].num_bytes)
        return self._get(shard, first * self.size, end - first * self.size)

    def _get(self, shard: int, start: int, length: int) -> bytes:
        return self.local.storage.read_range(self.source._shards[shard].uri, start, length)

    def _map(self, fn: Any, jobs: list[Any]) -> list[Any]:
        if len(jobs) <= 1:
            return [fn(job) for job in jobs]
        with self.local.lock:
            if self.local.pool is None:
                self.local.storage.prime(self.source.version)  # the client made once, before threads share it
                self.local.pool = concurrent.futures.ThreadPoolExecutor(S3_THREADS, thread_name_prefix="s3-range")
            pool = self.local.pool
        return list(pool.map(fn, jobs))

    def _cached(self, wanted: list[tuple[int, int, int]]) -> dict[tuple[int, int], bytes]:
        found: dict[tuple[int, int], bytes] = {}
        with self.local.lock:
            for shard, start, length in wanted:
                if length <= self.size:
                    for b in range(start // self.size, (start + length - 1) // self.size + 1):
                        data = self.local.blocks.get((shard, b))
                        if data is not None:
                            self.local.blocks.move_to_end((shard, b))
                            found[(shard, b)] = data
        return found

    def _keep(self, blocks: dict[tuple[int, int], bytes]) -> None:
        limit = self.source._cache_blocks
        with self.local.lock:
            for key, data in list(blocks.items())[-limit:] if limit else []:
                self.local.blocks[key] = data
                self.local.blocks.move_to_end(key)
            while len(self.local.blocks) > limit:
                self.local.blocks.popitem(last=False)


def _runs(blocks: list[tuple[int, int]], longest: int = 8) -> list[tuple[int, int, int]]:
    """Sorted (shard, block) pairs as (shard, first, last) runs of consecutive blocks, at most ``longest`` long."""
    runs: list[tuple[int, int, int]] = []
    for shard, b in blocks:
        if runs and runs[-1][0] == shard and runs[-1][2] == b - 1 and b - runs[-1][1] < longest:
            runs[-1] = (shard, runs[-1][1], b)
        else:
            runs.append((shard, b, b))
    return runs


# -- versions, indexes, checks --------------------------------------------------------------------------
def _version_uri(storage: Storage, uri: str, version: str | None) -> str:
    """The published version to read: ``uri`` resolved (a version, or a dataset through ``latest.json``),
    or ``uri/version``; NotPublishedError lists the published versions when that one is not."""
    if version is None:
        return resolve(storage, uri)
    if not is_name(version):
        raise ValueError(f"{version!r} is not a version name")
    try:
        return resolve(storage, join(uri, version))
    except NotPublishedError:
        versions = sorted(published_before(storage, uri.rstrip("/")), key=version_key)
        raise NotPublishedError(f"{join(uri, version)} is not a published version; published versions of {uri}: "
                                f"{', '.join(versions) or 'none'}") from None


def _features(manifest: Manifest) -> list[_Feature]:
    """What a record dict holds, from the manifest's features: the image (bytes, or raw pixels and their
    shape), filename, label id(s) and text(s), format, size, SHA-256, and every metadata column."""
    features = manifest.features
    if features is None:
        raise ValueError("the manifest lists no features (a version made before they were listed): rebuild it")
    names = {FILENAME_KEY: "filename", LABEL_KEY: "label", TEXT_KEY: "label_text", IMAGE_KEY: "image",
             RAW_KEY: "image", SHAPE_KEY: "shape", FORMAT_KEY: "format", HEIGHT_KEY: "height", WIDTH_KEY: "width",
             CHANNELS_KEY: "channels", SHA256_KEY: "sha256"}
    out = []
    order = list(names)
    for key, spec in sorted(features.items(), key=lambda item: (order.index(item[0]) if item[0] in names else
                                                               len(order), item[0])):
        kind = _KIND.get(spec.get("dtype"))
        if kind is None:
            raise ValueError(f"feature {key!r} has an unknown dtype {spec.get('dtype')!r}")
        binary = key in (IMAGE_KEY, RAW_KEY)
        name = names.get(key, key)
        if (key not in names and name in names.values()) or name == "index":
            name = f"column:{key}"  # a metadata column never hides a field of the record
        out.append(_Feature(key, name, kind, kind == "bytes_list" and not binary, list(spec.get("shape", [])) == []))
    return out


def _load_index(storage: Storage, shard: _Shard, verify: bool) -> tuple[np.ndarray, np.ndarray]:
    """A shard's ``.tfindex`` as (starts, lengths), checked: one line per record, contiguous, ending at the
    shard's size (and, with ``verify``, its SHA-256 as the manifest lists it)."""
    try:
        data = storage.read_bytes(shard.index_uri)
    except FileNotFoundError:
        raise DamagedFile(f"{shard.index_uri} is missing: random access needs each shard's .tfindex") from None
    if verify and shard.index_sha256 and hashlib.sha256(data).hexdigest() != shard.index_sha256:
        raise ShardChecksumError(f"{shard.index_uri} does not match its sha256 in the manifest "
                                 f"({shard.index_sha256}): it is corrupt or was changed after publishing")
    try:
        table = np.array(data.split(), dtype=np.int64).reshape(-1, 2)
    except ValueError:
        raise DamagedFile(f"{shard.index_uri} is not a .tfindex (lines of 'start length')") from None
    starts, lengths = np.ascontiguousarray(table[:, 0]), np.ascontiguousarray(table[:, 1])
    expected = np.concatenate(([0], np.cumsum(lengths)[:-1])) if len(lengths) else starts
    if (len(starts) != shard.num_records or not np.array_equal(starts, expected) or (lengths < _FRAMING).any()
            or int(lengths.sum()) != shard.num_bytes):
        raise DamagedFile(f"{shard.index_uri} does not index the {shard.num_records} records of "
                          f"{shard.num_bytes} bytes the manifest lists for {shard.uri}")
    return starts, lengths


_hashed: dict[str, tuple[int, int, str]] = {}  # local shard path -> (size, mtime_ns, sha256): hashed in this process
_hashed_lock = threading.Lock()
_state_lock = threading.Lock()


def _new_locks() -> None:
    """In a forked child: locks that no thread of the child holds (one of the parent's may have held them)."""
    global _hashed_lock, _state_lock
    _hashed_lock, _state_lock = threading.Lock(), threading.Lock()


os.register_at_fork(after_in_child=_new_locks)


def _verify(storage: Storage, shard: _Shard) -> None:
    """ShardChecksumError unless the shard has the manifest's SHA-256 (see RecordSource's ``verify``)."""
    if is_s3(shard.uri):
        actual = storage.sha256_of(shard.uri)
        if actual is None:
            digest = hashlib.sha256()
            with storage.open_read(shard.uri) as body:
                while chunk := body.read(1 << 20):
                    digest.update(chunk)
            actual = digest.hexdigest()
    else:
        st = os.stat(shard.uri)
        stamp = (st.st_size, st.st_mtime_ns)
        with _hashed_lock:
            known = _hashed.get(shard.uri)
        if known and known[:2] == stamp:
            actual = known[2]
        else:
            actual = sha256_file(shard.uri)
            with _hashed_lock:
                _hashed[shard.uri] = (*stamp, actual)
    if actual != shard.sha256:
        raise ShardChecksumError(f"shard {shard.uri} does not match its sha256 in the manifest ({shard.sha256}): "
                                 "it is corrupt or was changed after publishing")


def _unframe(data: bytes) -> bytes:
    """A framed record's data, its length and both CRCs checked (ValueError says which failed)."""
    if len(data) < _FRAMING:
        raise ValueError(f"truncated: {len(data)} bytes")
    length, length_crc = _HEADER.unpack_from(data)
    if masked_crc(data[:8]) != length_crc:
        raise ValueError("length checksum mismatch")
    if length + _FRAMING != len(data):
        raise ValueError(f"its length field says {length} bytes, the index {len(data) - _FRAMING}")
    payload = data[_HEADER.size:_HEADER.size + length]
    if masked_crc(payload) != _FOOTER.unpack_from(data, _HEADER.size + length)[0]:
        raise ValueError("data checksum mismatch")
    return payload

