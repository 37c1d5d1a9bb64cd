"""SHA-256 states saved midway and resumed (``storage.sha256_states``): the same digests as ``hashlib``, from any
cut, for every kind of buffer a splice hashes, in another process too."""

from __future__ import annotations

import hashlib
import itertools
import mmap
import random
import subprocess
import sys
from pathlib import Path

import pytest

from image_tfrecords.storage import sha256_states
from image_tfrecords.storage.sha256_states import CTX_BYTES, Sha256, hash_with_states, resumed

pytestmark = pytest.mark.skipif(not sha256_states.available(), reason="no libcrypto with SHA256_* calls here")


def _data(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


def test_digests_are_hashlibs_for_every_kind_of_buffer(tmp_path: Path) -> None:
    data = _data(300_001)
    path = tmp_path / "f"
    path.write_bytes(data)
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        view = memoryview(mapped)  # read-only, as a splice's base
        try:
            for cut in (0, 1, 63, 64, 65, 4096, 150_000, len(data)):
                digest = Sha256()
                digest.update(data[:cut])  # bytes
                digest.update(view[cut:cut + 1000])  # a slice of a read-only map
                digest.update(bytearray(data[cut + 1000:]))  # a writable buffer
                assert digest.hexdigest() == hashlib.sha256(data).hexdigest(), cut
                assert digest.digest() == hashlib.sha256(data).digest()
        finally:
            view.release()
    assert Sha256().hexdigest() == hashlib.sha256().hexdigest()
    twice = Sha256()
    twice.update(b"abc")
    assert twice.hexdigest() == twice.hexdigest() == hashlib.sha256(b"abc").hexdigest()  # a digest does not end it
    twice.update(b"d")
    assert twice.hexdigest() == hashlib.sha256(b"abcd").hexdigest()
    copy = twice.copy()
    copy.update(b"e")
    assert (twice.hexdigest(), copy.hexdigest()) == (hashlib.sha256(b"abcd").hexdigest(),
                                                    hashlib.sha256(b"abcde").hexdigest())


@pytest.mark.parametrize("every", [64, 4096, 100_000])
def test_saved_states_resume_at_each_offset(every: int) -> None:
    data = _data(250_000)
    chunks = [data[:777], memoryview(data)[777:131_072], bytearray(data[131_072:])]
    digest, states = hash_with_states(chunks, every)
    assert digest.hexdigest() == hashlib.sha256(data).hexdigest()
    assert len(states) == len(data) // every * CTX_BYTES
    for upto in (0, every - 1, every, every + 1, 3 * every + 5, 200_000, len(data), len(data) + every):
        resumed_digest, offset = resumed(states, upto, every)
        assert offset == min(upto, len(data)) // every * every <= upto
        resumed_digest.update(data[offset:upto])
        assert resumed_digest.hexdigest() == hashlib.sha256(data[:upto]).hexdigest(), upto


def test_a_state_resumes_in_another_process() -> None:
    data = _data(10_000)
    first = Sha256()
    first.update(data[:5_000])
    script = ("import sys; from image_tfrecords.storage.sha256_states import Sha256; "
              "d = Sha256(bytes.fromhex(sys.argv[1])); d.update(bytes.fromhex(sys.argv[2])); print(d.hexdigest())")
    out = subprocess.run([sys.executable, "-c", script, first.state().hex(), data[5_000:].hex()], check=True,
                         capture_output=True, text=True).stdout.strip()
    assert out == hashlib.sha256(data).hexdigest()


def test_a_state_of_the_wrong_size_is_refused() -> None:
    with pytest.raises(ValueError, match="112 bytes"):
        Sha256(b"\0" * 100)


def test_without_the_library_no_states_are_saved(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where libcrypto or its calls are missing, ``available`` says so (and the prover saves no states)."""
    monkeypatch.setattr(sha256_states, "_LIBRARIES", ("libnothing-here.so.0",))
    monkeypatch.setattr(sha256_states, "_checked", False)
    monkeypatch.setattr(sha256_states, "_lib", None)
    assert not sha256_states.available()


def _pieces(data: bytes, rng: random.Random) -> list[bytes]:
    """``data`` cut at random places (pieces of 0 to 3000 bytes: partial blocks, whole ones and empty pieces)."""
    out, at = [], 0
    while at < len(data):
        step = rng.choice((0, 1, 63, 64, 65, rng.randrange(0, 3000)))
        out.append(data[at:at + step])
        at += step
    return out


@pytest.mark.parametrize("compiled", [True, False])
def test_two_streams_at_once_give_the_digests_and_states_of_one_after_the_other(
        compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """``update_pair`` and ``hash_two_with_states``: byte for byte the states OpenSSL saves one stream at a time,
    whatever the cuts, with the compiled two-stream pass or without it."""
    if compiled and not sha256_states.pairs_compiled():
        pytest.skip("no compiled two-stream SHA-256 on this machine (no C part, or a CPU without SHA extensions)")
    if not compiled:
        monkeypatch.setattr(sha256_states, "_pair", None)
        monkeypatch.setattr(sha256_states, "_pair_checked", True)
    assert sha256_states.pairs_compiled() is compiled
    rng = random.Random(11)
    for size_a, size_b in ((0, 0), (1, 200_000), (70_000, 3), (123_457, 98_765), (4096, 4096)):
        a, b = _data(size_a, 1), _data(size_b, 2)
        first, second = Sha256(), Sha256()
        for piece_a, piece_b in itertools.zip_longest(_pieces(a, rng), _pieces(b, rng), fillvalue=b""):
            sha256_states.update_pair(first, piece_a, second, memoryview(piece_b))
        alone_a, alone_b = Sha256(), Sha256()
        alone_a.update(a)
        alone_b.update(b)
        assert (first.state(), second.state()) == (alone_a.state(), alone_b.state()), (size_a, size_b)
        assert (first.hexdigest(), second.hexdigest()) == (hashlib.sha256(a).hexdigest(), hashlib.sha256(b).hexdigest())
        chunks_b = [b[i:i + 5000] for i in range(0, len(b), 5000)]
        (da, sa, na), (db, sb, nb) = sha256_states.hash_two_with_states(_pieces(a, rng), chunks_b, every=4096)
        (ra, rsa), (rb, rsb) = hash_with_states([a], every=4096), hash_with_states([b], every=4096)
        assert (da.state(), sa, db.state(), sb) == (ra.state(), rsa, rb.state(), rsb), (size_a, size_b)
        assert (na, nb) == (size_a, size_b)
        assert len(sa) == size_a // 4096 * CTX_BYTES
