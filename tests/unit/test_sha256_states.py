"""SHA-256 states saved midway and resumed (``storage.sha256_states``): the same digests as ``hashlib``, from any
cut, for every kind of buffer a splice hashes, in another process too."""

from __future__ import annotations

import hashlib
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
