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


def resumed(states: bytes, upto: int, every: int) -> tuple[Sha256, int]:
    """A SHA-256 of the first bytes of a file whose ``states`` (``hash_with_states``) are given, as far as the
    last state at or before ``upto`` bytes: it and that offset (0 and a fresh digest when there is none)."""
    count = min(upto // every, len(states) // CTX_BYTES)
    if count <= 0:
        return Sha256(), 0
    return Sha256(states[(count - 1) * CTX_BYTES:count * CTX_BYTES]), count * every
