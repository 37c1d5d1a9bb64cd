"""SHA-256 whose state can be saved midway and resumed in another process: a base shard's digest, cut at
regular offsets, so that a spliced shard's digest starts where the base's left off.

A spliced shard begins with the bytes of its base shard up to the first record the night drops. The prover
(``shards.proofs``) hashes each base shard ahead, in a pool process; with the state saved every
``STATE_EVERY`` bytes, the process that later splices that shard takes the last state before its first drop
and hashes only from there, instead of hashing that prefix a second time. ``hashlib`` cannot save a state
outside its process, so this is OpenSSL's own ``SHA256_Init``/``SHA256_Update``/``SHA256_Final`` on a
``SHA256_CTX`` held in a buffer, through ``ctypes`` (the library ``hashlib`` itself uses: the same code, as fast;
``ctypes`` lets go of the GIL in each call). A state is that buffer's bytes: it holds for this library on this
machine, which is all a build's proofs promise (``shards.proofs.host``).

Where the library or those calls are missing, or a self-check at first use fails, ``available()`` is False and
``Sha256`` is not used: the prefix is hashed again, as before.

``update_pair`` hashes two streams at once (two base shards in the prover, a base and the shard spliced from it):
with the compiled ``_sha256x2`` on a CPU with SHA extensions, their whole blocks interleaved in one pass on the
same ``SHA256_CTX`` layout (about 1.85x the bytes a core-second of one stream here); else one after the other.
"""

from __future__ import annotations

import ctypes
import hashlib
from typing import Any

STATE_EVERY = 1 << 20  # bytes between saved states: at most this much of a prefix is hashed again
CTX_BYTES = 112  # sizeof(SHA256_CTX): h[8], Nl, Nh, data[16], num, md_len (32-bit each)
_LIBRARIES = ("libcrypto.so.3", "libcrypto.so", "libcrypto.dylib")

_lib: Any = None
_checked = False
_pair: Any = None  # the compiled two-stream update, once it has passed its self-check
_pair_checked = False


def _library() -> Any:
    """libcrypto with its SHA-256 calls typed, once it has passed a self-check; None where it cannot."""
    global _lib, _checked
    if _checked:
        return _lib
    _checked = True
    for name in _LIBRARIES:
        try:
            lib = ctypes.CDLL(name)
            for call in (lib.SHA256_Init, lib.SHA256_Update, lib.SHA256_Final):
                call.restype = ctypes.c_int
            lib.SHA256_Update.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)
            lib.SHA256_Final.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
            lib.SHA256_Init.argtypes = (ctypes.c_void_p,)
        except (OSError, AttributeError):
            continue
        _lib = lib
        if _self_check():
            return lib
        _lib = None
    return None


def _self_check() -> bool:
    """Whether a state saved midway and resumed gives hashlib's digest (a layout this module does not know
    would not)."""
    data = bytes(range(256)) * 41  # 10,496 bytes: whole blocks and a partial one on either side of the cut
    try:
        first = Sha256()
        first.update(data[:4099])
        second = Sha256(first.state())
        second.update(data[4099:])
        return second.hexdigest() == hashlib.sha256(data).hexdigest() and \
            Sha256().hexdigest() == hashlib.sha256().hexdigest()
    except Exception:
        return False


def available() -> bool:
    """Whether states can be saved and resumed here."""
    return _library() is not None


def _pair_update() -> Any:
    """``_sha256x2.update2`` where it is built, this CPU runs it and it gives OpenSSL's states and hashlib's
    digests on a self-check; else None."""
    global _pair, _pair_checked
    if _pair_checked:
        return _pair
    _pair_checked = True
    try:
        from . import _sha256x2
    except ImportError:  # installed without its C part
        return None
    if not _sha256x2.available() or _library() is None:
        return None
    data = bytes(range(251)) * 67  # 16,817 bytes, cut so that partial and whole blocks meet on both sides
    cuts = [(0, 3, 0, 70), (3, 64, 70, 100), (64, 4224, 100, 100), (4224, 13224, 100, 9000),
            (13224, 16817, 9000, 16817)]
    try:
        a, b, c = Sha256(), Sha256(), Sha256()
        for first, last, start, stop in cuts:
            _sha256x2.update2(a._ctx, data[first:last], b._ctx, data[::-1][start:stop])
            c.update(data[first:last])
        ok = (a.state() == c.state() and a.hexdigest() == hashlib.sha256(data).hexdigest()
              and b.hexdigest() == hashlib.sha256(data[::-1]).hexdigest())
    except Exception:
        ok = False
    _pair = _sha256x2.update2 if ok else None
    return _pair


def pairs_compiled() -> bool:
    """Whether ``update_pair`` hashes its two streams in one interleaved pass here."""
    return _pair_update() is not None


def update_pair(first: Sha256, first_data: Any, second: Sha256, second_data: Any) -> None:
    """``first.update(first_data)`` and ``second.update(second_data)``, in one pass where ``pairs_compiled()``."""
    pair = _pair_update()
    if pair is None:
        first.update(first_data)
        second.update(second_data)
        return
    pair(first._ctx, first_data, second._ctx, second_data)


class Sha256:
    """A SHA-256 like ``hashlib``'s (``update``, ``hexdigest``, ``copy``), from a saved ``state`` or from the
    start, whose ``state()`` can be saved. Only where ``available()``."""

    __slots__ = ("_ctx",)

    def __init__(self, state: bytes | None = None) -> None:
        if _lib is None and _library() is None:
            raise RuntimeError("SHA-256 states cannot be saved here (no libcrypto with SHA256_* calls)")
        if state is not None:
            if len(state) != CTX_BYTES:
                raise ValueError(f"a SHA-256 state is {CTX_BYTES} bytes, not {len(state)}")
            self._ctx = ctypes.create_string_buffer(state, CTX_BYTES)
        else:
            self._ctx = ctypes.create_string_buffer(CTX_BYTES)
            if not _lib.SHA256_Init(self._ctx):
                raise RuntimeError("SHA256_Init failed")

    def update(self, data: Any) -> None:
        """Hash ``data`` (bytes, or any contiguous buffer: a memoryview of a read-only map too)."""
        with memoryview(data) as view:
            size = view.nbytes
            if not size:
                return
            if isinstance(data, bytes):
                address: Any = data
            else:  # the buffer's address, read-only or not: through a numpy view of it (no copy)
                import numpy as np

                array = np.frombuffer(view.cast("B") if view.format != "B" or view.ndim != 1 else view, np.uint8)
                address = array.ctypes.data
            if not _lib.SHA256_Update(self._ctx, address, size):
                raise RuntimeError("SHA256_Update failed")

    def state(self) -> bytes:
        """The state so far: ``Sha256(state)`` goes on from here."""
        return self._ctx.raw

    def copy(self) -> Sha256:
        return Sha256(self.state())

    def digest(self) -> bytes:
        out = ctypes.create_string_buffer(32)
        ctx = ctypes.create_string_buffer(self._ctx.raw, CTX_BYTES)  # Final wipes the context: this one goes on
        if not _lib.SHA256_Final(out, ctx):
            raise RuntimeError("SHA256_Final failed")
        return out.raw

    def hexdigest(self) -> str:
        return self.digest().hex()


def hash_with_states(chunks: Any, every: int | None = None) -> tuple[Sha256, bytes]:
    """The SHA-256 of the buffers ``chunks`` yields, and its states after every ``every`` (default
    ``STATE_EVERY``) bytes (``every``, ``2 * every``, ...), one after another (``CTX_BYTES`` each)."""
    every = every or STATE_EVERY
    digest, states, done = Sha256(), [], 0
    for chunk in chunks:
        with memoryview(chunk) as view:
            at = 0
            while at < len(view):
                take = min(len(view) - at, every - done % every)
                digest.update(view[at:at + take])
                at, done = at + take, done + take
                if done % every == 0:
                    states.append(digest.state())
    return digest, b"".join(states)


def hash_two_with_states(first: Any, second: Any, every: int | None = None
                         ) -> tuple[tuple[Sha256, bytes, int], tuple[Sha256, bytes, int]]:
    """``hash_with_states`` of two streams of buffers (``first``, ``second``) at once (``update_pair``), each with
    its own states: the same digests and states as one after the other; and the bytes each stream held."""
    every = every or STATE_EVERY
    streams = [_Stream(first, every), _Stream(second, every)]
    while not (streams[0].ended and streams[1].ended):
        pieces = [stream.piece() for stream in streams]
        if pieces[0] is not None and pieces[1] is not None:
            update_pair(streams[0].digest, pieces[0], streams[1].digest, pieces[1])
        else:
            for stream, piece in zip(streams, pieces, strict=True):
                if piece is not None:
                    stream.digest.update(piece)
        for stream, piece in zip(streams, pieces, strict=True):
            if piece is not None:
                stream.taken(len(piece))
    return ((streams[0].digest, b"".join(streams[0].states), streams[0].done),
            (streams[1].digest, b"".join(streams[1].states), streams[1].done))


class _Stream:
    """One of ``hash_two_with_states``' streams: its buffers cut at every ``every`` bytes hashed."""

    def __init__(self, chunks: Any, every: int) -> None:
        self.digest, self.states, self.done, self.ended = Sha256(), [], 0, False
        self._chunks, self._every, self._view, self._at = iter(chunks), every, memoryview(b""), 0

    def piece(self) -> Any:
        """The next bytes to hash, up to the next state's offset (None once the stream has ended)."""
        while not self.ended and self._at >= len(self._view):
            self._view.release()  # (before the next chunk: a map's last chunk let go of, for it to close)
            chunk = next(self._chunks, None)
            if chunk is None:
                self.ended = True
                return None
            self._view, self._at = memoryview(chunk), 0
        if self.ended:
            return None
        take = min(len(self._view) - self._at, self._every - self.done % self._every)
        return self._view[self._at:self._at + take]

    def taken(self, size: int) -> None:
        self._at, self.done = self._at + size, self.done + size
        if self.done % self._every == 0:
            self.states.append(self.digest.state())


def resumed(states: bytes, upto: int, every: int) -> tuple[Sha256, int]:
    """A SHA-256 of the first bytes of a file whose ``states`` (``hash_with_states``) are given, as far as the
    last state at or before ``upto`` bytes: it and that offset (0 and a fresh digest when there is none)."""
    count = min(upto // every, len(states) // CTX_BYTES)
    if count <= 0:
        return Sha256(), 0
    return Sha256(states[(count - 1) * CTX_BYTES:count * CTX_BYTES]), count * every
