"""How an object made of byte ranges of other objects becomes an S3 multipart upload.

A spliced shard (shards/splice.py) is a list of segments: runs of records kept from its base shard,
then the new records. ``plan_parts`` turns them into parts: a kept run large enough becomes an
``UploadPartCopy`` of that byte range of the base object (the store copies it; its bytes never
pass through the worker), everything else is uploaded from the worker's bytes. S3's rules shape the
plan: every part but the last is at least ``MIN_PART`` bytes (5 MiB), none more than 5 GiB, at most
10,000 parts; an uploaded part that falls short before a copied one is topped up with the first
bytes of the run it precedes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

MIN_PART = 5 << 20  # S3's smallest part but the last
MAX_COPY_PART = 4 << 30  # under S3's 5 GiB limit on one part
MAX_PUT_PART = 64 << 20  # an uploaded part is joined in memory: bounded
MAX_PARTS = 10_000


Reader = Callable[[int, int], bytes]


@dataclass(frozen=True)
class Segment:
    """``length`` bytes, which ``read(start, count)`` gives from the worker (a local file); ``source`` and
    ``offset``: where the same bytes lie in another object of the store (None: only in the worker, e.g.
    new records)."""

    length: int
    read: Reader
    source: str | None = None
    offset: int = 0


@dataclass
class Part:
    """One part: a server-side copy of ``source`` bytes ``[offset, offset + length)``, or, with no
    ``source``, an upload of ``pieces``, each ``(read, start, count)`` of a segment, joined."""

    source: str | None = None
    offset: int = 0
    length: int = 0
    pieces: list[tuple[Reader, int, int]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.length if self.source else sum(count for _, _, count in self.pieces)

    def body(self) -> bytes:
        """An uploaded part's bytes (at most ``MAX_PUT_PART`` plus one piece)."""
        return b"".join(read(start, count) for read, start, count in self.pieces)


def plan_parts(segments: Iterable[Segment], min_part: int = MIN_PART, max_copy: int = MAX_COPY_PART,
               max_put: int = MAX_PUT_PART) -> list[Part]:
    """The parts that write ``segments`` in order (see the module). A plan without a copied part means
    nothing is gained over one PUT of the whole."""
    parts: list[Part] = []
    pending = Part()

    def flush() -> None:
        nonlocal pending
        if pending.pieces:
            parts.append(pending)
            pending = Part()

    for segment in segments:
        first, length = 0, segment.length
        held = pending.size
        top_up = min_part - held if 0 < held < min_part else 0
        if segment.source is not None and length - top_up >= min_part:
            if top_up:
                pending.pieces.append((segment.read, 0, top_up))
                first, length = top_up, length - top_up
            flush()
            chunks = -(-length // max_copy)  # each at least 2 GiB when split: never under min_part
            step = -(-length // chunks)
            for start in range(first, first + length, step):
                parts.append(Part(segment.source, segment.offset + start, min(step, first + length - start)))
            continue
        for start in range(0, length, max_put):
            if pending.size >= max_put:
                flush()
            pending.pieces.append((segment.read, start, min(max_put, length - start)))
    flush()
    return parts


def copied_bytes(parts: Sequence[Part]) -> int:
    """The bytes the store copies itself."""
    return sum(p.length for p in parts if p.source)
