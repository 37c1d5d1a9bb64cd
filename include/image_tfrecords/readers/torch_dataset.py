"""A PyTorch ``Dataset`` over a ``RecordSource`` (the ``torch`` extra; see docs/readers.md)::

    train = ImageDataset(RecordSource(DATASET, "train"), image_size=(224, 224))
    loader = DataLoader(train, batch_size=32, shuffle=True, num_workers=2)  # each record once per epoch

    raw = ImageDataset(RecordSource(DATASET, "train"), decode=False)  # the stored bytes, decoded elsewhere
    loader = DataLoader(raw, batch_size=64, shuffle=True, num_workers=2, collate_fn=collate_bytes)
    for batch in loader:
        images = split_bytes(batch)  # one uint8 tensor per record (views): its JPEG or PNG bytes

A map-style dataset: the DataLoader's sampler picks the order (``shuffle=True``, ``DistributedSampler``),
so every record is read exactly once per epoch whatever the workers. Each worker opens its own shard
files (the source pickles without them). Images are decoded with Pillow (``decode.decode_image``).

``collate_bytes`` is how stored bytes leave the workers cheaply. The default collate returns them as
``bytes`` objects, which a worker pickles through a pipe to the training process: with 2 workers that
costs more than reading them. ``collate_bytes`` copies a batch's images, one record at a time as they
are read, into one buffer in shared memory that the worker keeps and reuses (a file in ``/dev/shm``, up
to ``SLOTS`` per worker), and sends only its name, the offsets and the small fields; the training
process maps the buffer, and the worker takes it back once the batch's image tensor is freed. A
worker that cannot (no ``/dev/shm``, all its buffers held, or no space) falls back to a shared-memory
tensor of torch's own (torch's usual way). A worker's buffers are removed when it exits, or, if it was
killed, when the training process exits.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import math
import mmap
import multiprocessing.util
import os
import secrets
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import default_collate, get_worker_info

from .decode import decode_image
from .record_source import RecordSource

__all__ = ["ImageDataset", "collate_bytes", "split_bytes"]

SHM = "/dev/shm"  # where a worker keeps its batch buffers (Linux; elsewhere the fallback)
SLOTS = 8  # buffers per worker: a batch in flight or held by the training process holds one
_PREFIX = "image-tfrecords-batch"
_HEADER = 64  # bytes before a buffer's data; byte 0 is 1 from when a worker fills it until the batch is freed
_ROUND = 1 << 20  # buffer sizes: a quarter more than the batch that made them, in whole MiB


class ImageDataset(torch.utils.data.Dataset):
    """``source``'s records as dicts (see ``RecordSource``), the image decoded to a ``uint8 [channels, height,
    width]`` tensor (``decode=False``: the stored bytes, or raw pixels, as read; batch them with
    ``collate_bytes``); ``channels`` and ``image_size`` as in ``decode.decode_image``; ``transform`` is
    applied to the image last."""

    def __init__(self, source: RecordSource, *, decode: bool = True, channels: int | None = 3,
                 image_size: tuple[int, int] | None = None, transform: Callable[[Any], Any] | None = None) -> None:
        if not decode and (channels != 3 or image_size is not None):
            raise ValueError("channels and image_size need decode=True")
        self.source, self.decode, self.channels, self.image_size = source, decode, channels, image_size
        self.transform = transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self._prepare(self.source[index])

    def __getitems__(self, indices: Sequence[int]) -> Sequence[dict[str, Any]]:
        """A DataLoader batch: its records, read together when the batch is first looked at (the default
        collate gets them all at once); ``collate_bytes`` has them read one at a time instead."""
        return _Batch(self, list(indices))

    def _prepare(self, record: dict[str, Any]) -> dict[str, Any]:
        image = record["image"]
        if self.decode:
            pixels = decode_image(image, self.channels, self.image_size)
            # [c, h, w], transposed by numpy: a torch copy would start its intra-op threads, which on a
            # training process's cores slow decoding down (3x on 2 cores)
            image = torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))
        record["image"] = self.transform(image) if self.transform else image
        return record

    def __repr__(self) -> str:
        return f"ImageDataset({self.source!r}, decode={self.decode}, image_size={self.image_size})"


class _Batch(Sequence[dict[str, Any]]):
    """The records of a batch of an ``ImageDataset``, read (together) when first looked at."""

    def __init__(self, dataset: ImageDataset, indices: list[int]) -> None:
        self.dataset, self.indices = dataset, indices
        self._records: list[dict[str, Any]] | None = None

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: Any) -> Any:
        return self.records()[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records())

    def records(self) -> list[dict[str, Any]]:
        if self._records is None:
            self._records = [self.dataset._prepare(r) for r in self.dataset.source.__getitems__(self.indices)]
        return self._records

    def stream(self) -> tuple[int, Iterator[dict[str, Any]]] | None:
        """(a bound on the batch's image bytes, its records made one at a time), when it has not been read
        and its images are as stored (None otherwise)."""
        stream = getattr(self.dataset.source, "_stream", None)  # a RecordSource's
        if self._records is not None or self.dataset.decode or self.dataset.transform is not None or not stream:
            return None
        return stream(self.indices)


# -- collate_bytes ----------------------------------------------------------------------------------------------
def collate_bytes(batch: Sequence[dict[str, Any]], key: str = "image") -> dict[str, Any]:
    """A DataLoader ``collate_fn`` for records whose ``key`` holds bytes (``ImageDataset(..., decode=False)``):
    the batch as ``{key: uint8 tensor, f"{key}_offsets": int64 tensor, ...}``, the images' bytes one after
    another in one tensor, record ``i``'s from ``offsets[i]`` to ``offsets[i + 1]`` (``split_bytes`` cuts
    them apart), every other field collated as the default collate does (``label``: an int64 tensor,
    ``filename``: a list). Images that are arrays or tensors (raw pixels) are stacked into one tensor
    ``[batch, ...]`` instead (no offsets; they must have one shape and dtype). In a DataLoader worker the
    image tensor is made in a shared buffer the worker reuses (see the module): it reaches the training
    process without being copied or pickled. ``functools.partial(collate_bytes, key=...)`` packs another
    field (e.g. the ``tfrecord`` package's ``"image/encoded"``)."""
    if not len(batch):
        raise ValueError("collate_bytes: an empty batch")
    streamed = batch.stream() if isinstance(batch, _Batch) else None
    if streamed is not None:
        capacity, records = streamed
    else:
        listed = batch.records() if isinstance(batch, _Batch) else list(batch)
        capacity, records = sum(_nbytes(r[key]) for r in listed), iter(listed)
    worker = get_worker_info() is not None
    slot = _pool().take(capacity) if worker else None
    if slot is not None:
        try:
            with memoryview(slot.mm)[_HEADER:_HEADER + capacity] as data:
                packed = _pack(records, len(batch), key, data)
        except BaseException:
            slot.mm[0] = 0
            raise
        return _Shipped(packed, key, slot)
    # in a worker, torch's own shared memory (slower to make and to send, but always there)
    flat = _shared_tensor(capacity) if worker else torch.from_numpy(np.empty(capacity, np.uint8))
    with memoryview(flat.numpy()) as data:
        packed = _pack(records, len(batch), key, data)
    return packed.result(key, flat)


def split_bytes(batch: dict[str, Any], key: str = "image") -> list[torch.Tensor]:
    """A ``collate_bytes`` batch's images: one 1-D ``uint8`` tensor per record, views of ``batch[key]``
    (``bytes(t.numpy())`` copies one out; ``torchvision.io.decode_image`` takes them as they are)."""
    image, offsets = batch[key], batch[f"{key}_offsets"].tolist()
    return [image[start:end] for start, end in itertools.pairwise(offsets)]


class _Packed:
    """A batch's images written into a buffer: where they are, and the batch's other fields per record."""

    def __init__(self, kind: str, total: int, offsets: np.ndarray | None, dtype: str, shape: tuple[int, ...],
                 rest: list[dict[str, Any]]) -> None:
        self.kind, self.total, self.offsets, self.rest = kind, total, offsets, rest
        self.dtype, self.shape = dtype, shape

    def result(self, key: str, flat: torch.Tensor) -> dict[str, Any]:
        """The batch dict, its images a view of ``flat`` (a 1-D uint8 tensor that starts with them)."""
        image = flat[:self.total]
        if self.kind == "array":
            image = image.view(torch.from_numpy(np.empty(0, self.dtype)).dtype).reshape(self.shape)
        out: dict[str, Any] = {key: image}
        if self.offsets is not None:
            out[f"{key}_offsets"] = torch.from_numpy(self.offsets)
        return {**out, **(default_collate(self.rest) if self.rest[0] else {})}


def _pack(records: Iterator[dict[str, Any]], count: int, key: str, data: memoryview) -> _Packed:
    """Each record's ``key`` copied into ``data``, one after another, the record dropped before the next."""
    offsets = np.zeros(count + 1, np.int64)
    rest: list[dict[str, Any]] = []
    kind, dtype, shape, position = "", "uint8", (), 0
    for i, record in enumerate(records):
        value = record[key]
        if i == 0 and f"{key}_offsets" in record:
            raise ValueError(f"collate_bytes: the records have a field {key}_offsets, where the offsets would go")
        if isinstance(value, (bytes, bytearray, memoryview)):
            if kind not in ("", "bytes"):
                raise TypeError(f"collate_bytes: {key!r} holds both bytes and arrays")
            kind, size = "bytes", len(value)
            data[position:position + size] = value
        else:
            array = np.ascontiguousarray(value.numpy() if isinstance(value, torch.Tensor) else value)
            if array.dtype == object:
                raise TypeError(f"collate_bytes: {key!r} holds {type(value).__name__}, not bytes or arrays")
            if kind == "":
                kind, dtype, shape = "array", array.dtype.str, array.shape
            elif kind != "array" or array.dtype.str != dtype or array.shape != shape:
                raise ValueError(f"collate_bytes: {key!r} holds arrays of different shapes or dtypes ({shape}, "
                                 f"{dtype} and {array.shape}, {array.dtype.str}), or both bytes and arrays")
            size = array.nbytes
            data[position:position + size] = array.reshape(-1).view(np.uint8)
        position += size
        offsets[i + 1] = position
        rest.append({name: field for name, field in record.items() if name != key})
        del record, value
    if len(rest) != count:
        raise RuntimeError(f"collate_bytes: {len(rest)} records for a batch of {count}")
    if kind == "array":
        return _Packed(kind, position, None, dtype, (count, *shape), rest)
    return _Packed("bytes", position, offsets, dtype, (), rest)


def _nbytes(value: Any) -> int:
    if isinstance(value, (bytes, bytearray)):
        return len(value)
    if isinstance(value, memoryview):
        return value.nbytes
    if isinstance(value, torch.Tensor):
        return int(value.numel() * value.element_size())
    return int(np.asarray(value).nbytes)


def _shared_tensor(size: int) -> torch.Tensor:
    storage = torch.UntypedStorage._new_shared(max(size, 1))
    return torch.empty(0, dtype=torch.uint8).set_(storage, 0, (max(size, 1),))


# -- a worker's buffers ------------------------------------------------------------------------------------------
class _Slot:
    """One buffer of a worker: a file in ``SHM``, mapped."""

    def __init__(self, path: str, size: int) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.posix_fallocate(fd, 0, size)  # ENOSPC here, not a SIGBUS on a full /dev/shm later
            self.mm = mmap.mmap(fd, size)
        except BaseException:
            os.unlink(path)
            raise
        finally:
            os.close(fd)
        self.path, self.size = path, size


class _Pool:
    """This worker's buffers, made on demand and reused: one is free (byte 0 of its header is 0) once the
    training process has freed the batch made in it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.slots: list[_Slot] = []
        self.paths: list[str] = []  # every buffer file made, for the exit
        self.prefix = f"{SHM}/{_PREFIX}-{os.getppid()}-{self.pid}-{secrets.token_hex(4)}"
        self.made = 0
        self.growable = os.path.isdir(SHM) and hasattr(os, "posix_fallocate")
        # at the worker's exit (multiprocessing runs these in its processes; atexit is not run there)
        multiprocessing.util.Finalize(self, _unlink, args=(self.pid, self.paths), exitpriority=10)

    def take(self, need: int) -> _Slot | None:
        """A free buffer of at least ``need`` bytes, marked taken; None if there is none and none can be made."""
        free = [slot for slot in self.slots if slot.mm[0] == 0]
        fits = [slot for slot in free if slot.size - _HEADER >= need]
        if fits:
            slot = min(fits, key=lambda s: s.size)
        else:
            if free and len(self.slots) >= SLOTS:  # replace the smallest free buffer by a bigger one
                self._drop(min(free, key=lambda s: s.size))
            if len(self.slots) >= SLOTS or not self.growable:
                return None
            size = _HEADER + math.ceil((need + need // 4 + 1) / _ROUND) * _ROUND
            path = f"{self.prefix}-{self.made}"
            self.made += 1
            try:
                slot = _Slot(path, size)
            except OSError:  # no space (or no /dev/shm): the buffers made so far, else torch's way
                self.growable = False
                return None
            self.slots.append(slot)
            self.paths.append(path)
        slot.mm[0] = 1
        return slot

    def _drop(self, slot: _Slot) -> None:
        self.slots.remove(slot)
        self.paths.remove(slot.path)
        with contextlib.suppress(OSError):
            os.unlink(slot.path)  # the mapping goes with the last reference to it


_POOL: _Pool | None = None


def _pool() -> _Pool:
    global _POOL
    if _POOL is None or _POOL.pid != os.getpid():
        _POOL = _Pool()
    return _POOL


def _unlink(pid: int, paths: list[str]) -> None:
    if os.getpid() == pid:
        for path in paths:
            with contextlib.suppress(OSError):
                os.unlink(path)


class _Shipped(dict[str, Any]):
    """A batch packed in a worker's buffer: in the worker the batch dict itself; pickled (to the training
    process), only the buffer's name, the offsets and the other fields travel."""

    def __init__(self, packed: _Packed, key: str, slot: _Slot) -> None:
        super().__init__(packed.result(key, torch.from_numpy(np.frombuffer(slot.mm, np.uint8, packed.total, _HEADER))))
        self._ship = (slot.path, slot.size, key, packed)

    def __reduce__(self) -> tuple[Any, ...]:
        return _unship, self._ship


_swept: set[int] = set()
_swept_lock = threading.Lock()


def _unship(path: str, size: int, key: str, packed: _Packed) -> dict[str, Any]:
    """In the training process: the batch, its image tensor over the worker's buffer (mapped here), which
    the worker may reuse once that tensor (and every view of it) is freed."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        mm = mmap.mmap(fd, size)
    finally:
        os.close(fd)
    images = np.frombuffer(mm, np.uint8, packed.total, _HEADER)
    weakref.finalize(images, _free, mm)  # the tensors below keep it: it goes with the last of them
    out = packed.result(key, torch.from_numpy(images))
    pid = os.getpid()
    if pid not in _swept:
        with _swept_lock:
            if pid not in _swept:
                _swept.add(pid)
                # at exit, after multiprocessing has ended the (daemonic) workers still running
                multiprocessing.util.Finalize(None, _sweep, args=(pid,), exitpriority=-10)
    return out


def _free(mm: mmap.mmap) -> None:
    mm[0] = 0  # the worker may fill it again


def _sweep(pid: int) -> None:
    """At the training process's exit: the buffers of its workers that did not remove theirs (killed)."""
    for path in glob.glob(f"{SHM}/{_PREFIX}-{pid}-*"):
        with contextlib.suppress(OSError):
            os.unlink(path)
