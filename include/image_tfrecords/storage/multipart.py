"""How an object made of byte ranges of other objects becomes an S3 multipart upload.

A spliced shard (shards/splice.py) is a list of segments: runs of records kept from its base shard,
then the new records. ``plan_parts`` turns them into parts: a kept run becomes an ``UploadPartCopy`` of
that byte range of the base object (the store copies it; its bytes never pass through the worker), the
new records are uploaded from the worker's bytes. S3's rules shape the plan: every part but the last is
at least ``MIN_PART`` bytes (5 MiB), none more than 5 GiB, at most 10,000 parts. A part that would fall
short before another (a short run between two deleted records) is joined, in the store, to the last
5 MiB of the part before it: the two become a temporary object of their own (a multipart upload whose
last part may be short), copied whole into the shard (``Part.parts``), so no kept byte goes through the
worker. Two short parts are still uploaded, topped up to 5 MiB with the first bytes of what follows (at
most 5 MiB of kept bytes each): one at the very start, which has no part before it, and one right after a
temporary object (joining it too would nest them, each copying the last again: short runs side by side
would cost the store bytes quadratic in their number).
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
    """One part: a server-side copy of ``source`` bytes ``[offset, offset + length)``; with no ``source``, an
    upload of ``pieces``; or, with ``parts``, a temporary object made of those parts first, then copied whole.
    ``pieces`` (each ``(read, start, count)`` of a segment) are how the worker reads the part's bytes itself: a
    copy keeps them too, in case it must be uploaded after all."""

    source: str | None = None
    offset: int = 0
    length: int = 0
    pieces: list[tuple[Reader, int, int]] = field(default_factory=list)
    parts: list[Part] | None = None

    @property
    def size(self) -> int:
        if self.parts is not None:
            return sum(part.size for part in self.parts)
        return self.length if self.source else sum(count for _, _, count in self.pieces)

    @property
    def uploaded(self) -> bool:
        return self.source is None and self.parts is None

    def body(self) -> bytes:
        """An uploaded part's bytes (at most ``MAX_PUT_PART`` plus one piece)."""
        return b"".join(read(start, count) for read, start, count in self.pieces)

    def take_head(self, count: int) -> list[tuple[Reader, int, int]]:
        """Cut the first ``count`` bytes off a copy; the pieces that read them."""
        head, rest, left = [], [], count
        for read, start, size in self.pieces:
            if left >= size:
                head.append((read, start, size))
            elif left > 0:
                head.append((read, start, left))
                rest.append((read, start + left, size - left))
            else:
                rest.append((read, start, size))
            left -= min(left, size)
        self.offset, self.length, self.pieces = self.offset + count, self.length - count, rest
        return head

    def take_tail(self, count: int) -> Part:
        """Cut the last ``count`` bytes off a copy, as a copy of their own."""
        keep = self.length - count
        head = self.take_head(keep)  # this part is now the tail
        tail = Part(self.source, self.offset, self.length, self.pieces)
        self.offset, self.length, self.pieces = self.offset - keep, keep, head
        return tail


def _atoms(segment: Segment, max_copy: int, max_put: int) -> list[Part]:
    """A segment as parts before S3's minimum is applied: copies of at most ``max_copy`` (each at least 2 GiB
    when a run is split), or uploads of at most ``max_put``."""
    if segment.source is not None:
        chunks = -(-segment.length // max_copy)
        step = -(-segment.length // chunks) if chunks else 0
        return [Part(segment.source, segment.offset + start, min(step, segment.length - start),
                     [(segment.read, start, min(step, segment.length - start))])
                for start in range(0, segment.length, step or 1)]
    return [Part(pieces=[(segment.read, start, min(max_put, segment.length - start))])
            for start in range(0, segment.length, max_put)]


def plan_parts(segments: Iterable[Segment], min_part: int = MIN_PART, max_copy: int = MAX_COPY_PART,
               max_put: int = MAX_PUT_PART) -> list[Part]:
    """The parts that write ``segments`` in order (see the module). A plan without a copied part means
    nothing is gained over one PUT of the whole."""
    parts: list[Part] = []
    for segment in segments:
        for atom in _atoms(segment, max_copy, max_put):
            if atom.size:
                _append(parts, atom, min_part, max_copy, max_put)
    return parts


def _append(parts: list[Part], atom: Part, min_part: int, max_copy: int, max_put: int) -> None:
    """Add ``atom`` after ``parts``, first making the part it follows at least ``min_part`` bytes (every part
    but the last must be)."""
    last = parts[-1] if parts else None
    if last is not None and last.uploaded and atom.uploaded and last.size < max(min_part, max_put):
        last.pieces += atom.pieces  # uploads side by side are one part (bounded: at most max_put and a piece)
        return
    if last is None or last.size >= min_part:
        parts.append(atom)
        return
    before = parts[-2] if len(parts) >= 2 else None
    if before is not None and before.parts is None:
        # a short part after a whole one: both, or the whole one's last min_part bytes, joined in the store
        if before.source is not None and before.length >= 2 * min_part:
            parts[-1] = Part(parts=[before.take_tail(min_part), last])
            parts.append(atom)
            return
        if before.size + last.size <= max_copy:  # the joined object is copied whole: one part
            parts[-2:] = [Part(parts=[before, last])]
            parts.append(atom)
            return
    # a short part with nothing before it, or after a temporary object (never nested: short runs side by side
    # would copy each other over and over): uploaded, topped up from what follows
    if last.source is not None:
        parts[-1] = last = Part(pieces=last.pieces)
    need = min_part - last.size
    if atom.source is not None and atom.length > need:
        last.pieces += atom.take_head(need)  # exactly the top-up: at most min_part bytes of copies in all
        parts.append(atom)  # if short, it now has a whole part before it
    else:
        last.pieces += atom.pieces  # (still short: topped up from the next one)


def copied_bytes(parts: Sequence[Part]) -> int:
    """The bytes of the object that the store copies (never pass through the worker)."""
    return sum(copied_bytes(p.parts) if p.parts is not None else p.length if p.source else 0 for p in parts)


def part_count(parts: Sequence[Part]) -> int:
    """How many parts the object and its temporary objects take."""
    return sum(1 + (part_count(p.parts) if p.parts is not None else 0) for p in parts)
