"""Base shards proven ahead (issue 22): hashed beside the metadata stages, their proof taken by a splice or a reuse
only while the file is the very one that was hashed, untouched since.

Real parts: a local folder, the pipeline's stages, a real process pool, TensorFlow reading what was published.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.parallel import process_pool
from image_tfrecords.shards import splice
from image_tfrecords.shards.proofs import PROOFS, STATES, Prover, proof_of, proof_states, proven
from image_tfrecords.staging import PLAN, staged
from image_tfrecords.storage import Storage, join, sha256_states
from image_tfrecords.storage.documents import read_json
from tests.pipeline.test_incremental import Images, add, base_source, build, check_version, config, read
from tests.pipeline.test_splice import _splice_again, _splices_are_the_reference, night


def _prove(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Prove every base shard of ``cfg``'s night (on this thread, to its end) and stage the proofs."""
    found = read_json(storage, staged(cfg, "discover.json"))
    prover = Prover(cfg, storage, found["previous_version"], bool(found.get("multi_label")))
    prover.run()
    return prover.stop()


def _base_file(cfg: BuildConfig, origin: dict[str, Any]) -> Path:
    return Path(join(cfg.dataset_uri, origin["version"], origin["file"]))


def test_proven_bases_splice_to_the_reference_without_hashing_them_again(tmp_path: Path) -> None:
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    assert _prove(cfg, storage) == {"proven": len(plan["rewrite"]) + len(plan["reuse"]),
                                    "of": len(plan["rewrite"]) + len(plan["reuse"])}
    for origin in plan["rewrite"].values():
        assert proven(cfg, storage, origin) is not None
        assert proven(cfg, storage, {**origin, "sha256": "0" * 64}) is None  # a proof is of one digest
        assert proven(cfg, storage, {**origin, "version": "v0"}) is None  # and of one version's file
    _splices_are_the_reference(storage, cfg, plan["rewrite"])  # byte for byte, digest and index included
    for shard, origin in sorted(plan["rewrite"].items()):  # and each of them took its proof
        assert _splice_again(storage, cfg, shard, origin)["base_proven_ahead"] is True, shard


needs_states = pytest.mark.skipif(not sha256_states.available(), reason="no libcrypto with SHA256_* calls here")


@needs_states
def test_a_splice_starts_its_digest_from_the_provers_last_state_before_its_first_drop(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prover saves its SHA-256 state every ``STATE_EVERY`` bytes (4 KiB here); a splice of a proven base
    resumes the new shard's digest from the last one before the end of the prefix it shares with its base, and
    its shard, digest and index are still the record-by-record reference's."""
    monkeypatch.setattr(sha256_states, "STATE_EVERY", 4096)
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    _prove(cfg, storage)
    resumed: list[tuple[int, int]] = []
    real = sha256_states.resumed

    def spy(states: bytes, upto: int, every: int) -> tuple[Any, int]:
        digest, offset = real(states, upto, every)
        resumed.append((upto, offset))
        return digest, offset

    monkeypatch.setattr(sha256_states, "resumed", spy)
    _splices_are_the_reference(storage, cfg, plan["rewrite"])
    prefixes = [origin for origin in plan["rewrite"].values() if origin["runs"] and origin["runs"][0][0] == 0]
    assert prefixes and len(resumed) == len(prefixes)  # each splice that shares a prefix with its base
    assert all(upto - 4096 < offset <= upto for upto, offset in resumed), resumed
    assert any(offset > 0 for _, offset in resumed), resumed


@needs_states
def test_saved_states_that_are_not_the_provers_are_not_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """States altered after the prover staged them (their digest is in its proof), or saved at another spacing,
    are not taken: the splice hashes its prefix itself, and is still the reference."""
    monkeypatch.setattr(sha256_states, "STATE_EVERY", 4096)
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    _prove(cfg, storage)
    altered = 0
    for origin in plan["rewrite"].values():
        uri = staged(cfg, STATES, origin["file"])
        if not storage.exists(uri):
            continue
        assert proof_states(cfg, storage, origin, proof_of(cfg, storage, origin)) is not None
        monkeypatch.setattr(sha256_states, "STATE_EVERY", 8192)
        assert proof_states(cfg, storage, origin, proof_of(cfg, storage, origin)) is None  # saved at another spacing
        monkeypatch.setattr(sha256_states, "STATE_EVERY", 4096)
        data = bytearray(storage.read_bytes(uri))
        data[len(data) // 2] ^= 0x01
        storage.write_bytes(uri, bytes(data))
        assert proof_states(cfg, storage, origin, proof_of(cfg, storage, origin)) is None
        altered += 1
    assert altered

    def never(*_: Any) -> Any:
        raise AssertionError("a state that is not the prover's was resumed")

    monkeypatch.setattr(sha256_states, "resumed", never)
    _splices_are_the_reference(storage, cfg, plan["rewrite"])


def test_a_proof_recorded_while_stop_stages_the_proofs_does_not_break_it(tmp_path: Path) -> None:
    """A pool job's done-callback can record its proof after ``stop`` has waited for the job (``wait`` returns before
    callbacks run), while ``stop`` writes the states it holds: ``stop`` stages what it took under the prover's lock,
    proofs and states alike (it failed so once: "dictionary changed size during iteration")."""
    import threading

    storage, _, cfg = night(tmp_path)
    found = read_json(storage, staged(cfg, "discover.json"))
    prover = Prover(cfg, storage, found["previous_version"], bool(found.get("multi_label")))
    (first, first_sha, _), (late, late_sha, _) = prover.shards[:2]
    prover._proved(first, first_sha, [1, 2, 3, 4, 5, 6], b"\x01" * 112)
    write_bytes = storage.write_bytes

    def write_while_a_callback_records(uri: str, data: bytes) -> None:
        if uri.endswith(first):  # the first states file: a callback records another proof meanwhile
            def callback() -> None:  # as ``_finished`` does, under the prover's lock
                with prover._lock:
                    prover._proved(late, late_sha, [1, 2, 3, 4, 5, 6], b"\x02" * 112)
            recorder = threading.Thread(target=callback)
            recorder.start()
            recorder.join(10)
        write_bytes(uri, data)

    storage.write_bytes = write_while_a_callback_records  # type: ignore[method-assign]
    assert prover.stop() == {"proven": 1, "of": len(prover.shards)}
    staged_proofs = read_json(storage, staged(cfg, PROOFS))["shards"]
    assert list(staged_proofs) == [first]  # what it took, states staged with it
    assert storage.read_bytes(staged(cfg, STATES, first)) == b"\x01" * 112


def test_a_base_damaged_before_the_prover_reads_it_is_not_proven(tmp_path: Path) -> None:
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    shard, origin = sorted(plan["rewrite"].items())[0]
    old = _base_file(cfg, origin)
    data = bytearray(old.read_bytes())
    data[len(data) // 3] ^= 0x01
    old.write_bytes(bytes(data))
    used = len(plan["rewrite"]) + len(plan["reuse"])
    assert _prove(cfg, storage) == {"proven": used - 1, "of": used}
    assert proven(cfg, storage, origin) is None
    checked = _splice_again(storage, cfg, shard, origin)
    assert checked["fallback"].startswith(f"{old} is damaged") and not checked.get("base_proven_ahead"), checked


def test_a_prover_stops_when_asked_between_chunks(tmp_path: Path) -> None:
    storage, _, cfg = night(tmp_path)
    found = read_json(storage, staged(cfg, "discover.json"))
    prover = Prover(cfg, storage, found["previous_version"], bool(found.get("multi_label")))
    assert len(prover.shards) > 2
    prover.run(until=lambda: len(prover.proofs) >= 1)  # asked between chunks: after the first two shards (one pass)
    assert prover.stop() == {"proven": 2, "of": len(prover.shards)}


def test_a_proven_base_edited_while_it_is_spliced_is_not_trusted(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Its proof held when the splice opened it; an edit in place during the copy (the same inode, new times) is
    seen after the copy and the hashing: the shard is written from the source instead."""
    storage, _, cfg = night(tmp_path)
    _prove(cfg, storage)
    shard, origin = sorted(read_json(storage, staged(cfg, PLAN))["rewrite"].items())[0]
    old = _base_file(cfg, origin)

    def then_edit(copy: Any) -> Any:
        def copy_then_edit(*args: Any) -> None:
            copy(*args)
            with open(old, "r+b") as f:
                f.seek(0)
                f.write(f.read(1))  # the same byte again: only the times say it was written
        return copy_then_edit

    for name in ("_copy_range", "_write_hashed"):  # the kernel's copy, or the pass that hashes and writes
        monkeypatch.setattr(splice, name, then_edit(getattr(splice, name)))
    checked = _splice_again(storage, cfg, shard, origin)
    assert checked.get("fallback") == f"{old} changed while it was spliced", checked


def test_a_base_touched_but_unchanged_is_hashed_again_and_spliced(tmp_path: Path) -> None:
    storage, _, cfg = night(tmp_path)
    _prove(cfg, storage)
    shard, origin = sorted(read_json(storage, staged(cfg, PLAN))["rewrite"].items())[0]
    os.utime(_base_file(cfg, origin))  # same bytes, other times: the proof no longer holds, the base is fine
    checked = _splice_again(storage, cfg, shard, origin)
    assert checked["base_proven_ahead"] is False and "fallback" not in checked, checked


def test_proofs_from_another_machine_prove_nothing(tmp_path: Path) -> None:
    """On a network file system another machine may see the same device and inode numbers for another file."""
    storage, _, cfg = night(tmp_path)
    _prove(cfg, storage)
    origin = next(iter(read_json(storage, staged(cfg, PLAN))["rewrite"].values()))
    assert proven(cfg, storage, origin) is not None
    proofs = read_json(storage, staged(cfg, PROOFS))
    storage.write_bytes(staged(cfg, PROOFS), json.dumps({**proofs, "host": "another machine"}).encode())
    assert proven(cfg, storage, origin) is None


@pytest.mark.parametrize("change", ["bytes", "bytes_under_the_same_mtime", "replaced"])
def test_a_base_changed_after_its_proof_is_hashed_again_and_found_out(change: str, tmp_path: Path) -> None:
    """A base shard damaged after the prover hashed it, even with its modification time put back, or replaced by
    another file: its proof no longer holds, the splice hashes it, finds the damage and writes from the source."""
    storage, _, cfg = night(tmp_path)
    _prove(cfg, storage)
    shard, origin = sorted(read_json(storage, staged(cfg, PLAN))["rewrite"].items())[0]
    old = _base_file(cfg, origin)
    stat, data = old.stat(), bytearray(old.read_bytes())
    data[len(data) // 2] ^= 0x01
    if change == "replaced":
        old.with_name("new").write_bytes(bytes(data))
        os.replace(old.with_name("new"), old)
    else:
        with open(old, "r+b") as f:  # in place: the same inode
            f.write(bytes(data))
    if change == "bytes_under_the_same_mtime":
        os.utime(old, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # only the change time tells
    checked = _splice_again(storage, cfg, shard, origin)
    assert checked["fallback"].startswith(f"{old} is damaged"), checked
    assert stages.validate_shard(cfg, storage, shard)["num_records"] == checked["num_records"]


def test_a_reused_shard_takes_its_proof_only_for_the_file_that_was_hashed(tmp_path: Path) -> None:
    storage = Storage()
    source = base_source(tmp_path, storage, None, per_class=12)
    dest = str(tmp_path / "out")
    build(storage, source.uri, dest, "d", "v1")
    add(source, Images(tmp_path / "new"), "triangles", "n", 2)  # additions only: all but a tail shard reused
    cfg = config(source.uri, dest, "d", "v2")
    for stage in stages.PIPELINE[:4]:
        stage.run(cfg, storage, **({"workers": 1} if stage.per_image else {}))
    reuse = sorted(read_json(storage, staged(cfg, PLAN))["reuse"].items())
    assert len(reuse) >= 2
    _prove(cfg, storage)
    (kept, kept_origin), (damaged, damaged_origin) = reuse[:2]
    old = _base_file(cfg, damaged_origin)
    data = bytearray(old.read_bytes())
    data[-1] ^= 0x01
    with open(old, "r+b") as f:
        f.write(bytes(data))
    assert stages.reuse_shard(cfg, storage, kept, kept_origin)["base_proven_ahead"] is True
    redone = stages.reuse_shard(cfg, storage, damaged, damaged_origin)
    assert "reused_from" not in redone and redone.get("fallback", "").startswith(f"{old} is damaged"), redone


def test_the_dags_prove_task_proves_until_the_plan_is_staged(tmp_path: Path) -> None:
    """``prove_stage`` (the DAG's ``prove_base``, which the write tasks do not wait for) stops once the plan is
    staged: started before it, it proves every base shard; started after it, none (the writes hash them)."""
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    used = len(plan["rewrite"]) + len(plan["reuse"])
    assert stages.prove_stage(cfg, storage) == {"proven": 0, "of": used}  # the plan is staged: nothing to do
    summary, plan_file = Path(staged(cfg, "discover.json")), Path(staged(cfg, PLAN))
    stamp = plan_file.stat().st_mtime_ns
    os.utime(summary, ns=(stamp + 10**9, stamp + 10**9))  # a plan older than this attempt's discovery: a rerun's
    assert stages.prove_stage(cfg, storage) == {"proven": used, "of": used}
    shard, origin = sorted(plan["rewrite"].items())[0]
    assert _splice_again(storage, cfg, shard, origin)["base_proven_ahead"] is True
    summary.unlink()  # the build's staging gone (published, or discarded) before the task ran: nothing to do
    assert stages.prove_stage(cfg, storage) == {"proven": 0, "of": 0}


def test_a_proofs_file_that_is_not_a_provers_proves_nothing(tmp_path: Path) -> None:
    storage, _, cfg = night(tmp_path)
    origin = next(iter(read_json(storage, staged(cfg, PLAN))["rewrite"].values()))
    for junk in (b"not json", b"[]", b'{"version": "v1"}', b'{"version": "v1", "shards": {"%s": 3}}'
                 % origin["file"].encode()):
        storage.write_bytes(staged(cfg, PROOFS), junk)
        assert proven(cfg, storage, origin) is None


def test_proofs_of_an_earlier_attempt_are_dropped_by_discovery(tmp_path: Path) -> None:
    storage, _, cfg = night(tmp_path)
    _prove(cfg, storage)
    assert storage.exists(staged(cfg, PROOFS))
    stages.discover_stage(cfg, storage)
    assert not storage.exists(staged(cfg, PROOFS))


def pool_night(tmp_path: Path) -> tuple[Storage, Any, str]:
    """v1 (12 images a class), then a night: every sixth file deleted, three images added. (storage, source, dest)"""
    storage = Storage()
    source = base_source(tmp_path, storage, None, per_class=12)
    dest = str(tmp_path / "out")
    build(storage, source.uri, dest, "d", "v1")
    names = sorted(source.files())
    for name in names[::6]:
        source.delete(name)
    add(source, Images(tmp_path / "new"), "triangles", "n", 3)
    return storage, source, dest


def let_provers_finish(monkeypatch: pytest.MonkeyPatch) -> list[Prover]:
    """Make ``Prover.stop`` wait until the prover has done all it was given (its thread, or its pool's jobs: the
    proofs, and a prediction and copies ahead) before it stops; returns the provers stopped so."""
    stop, stopped = Prover.stop, []

    def finish_then_stop(self: Prover) -> dict[str, Any]:
        if self._thread is not None:
            self._thread.join()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with self._lock:
                if not self._in_flight and not self._side:
                    break
            time.sleep(0.01)
        stopped.append(self)
        return stop(self)

    monkeypatch.setattr(Prover, "stop", finish_then_stop)
    return stopped


def test_a_night_on_a_pool_proves_its_bases_and_equals_the_full_build(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``run_pipeline`` with a process pool: the prover runs beside the metadata stages (here let finish
    before it is stopped, so every base shard is proven), and the version is the full build's, record for record."""
    storage, source, dest = pool_night(tmp_path)
    let_provers_finish(monkeypatch)
    monkeypatch.setattr(sha256_states, "STATE_EVERY", 4096)  # states saved in the pool, splices resumed from them
    cfg = config(source.uri, dest, "d", "v2")
    with process_pool(2) as pool:
        result = stages.run_pipeline(cfg, storage, pool=pool, workers=2)
    v2 = read(storage, result["uri"])
    check_version(storage, v2, source.files())
    facts = v2.build
    assert result["proven_ahead"]["proven"] == result["proven_ahead"]["of"] == facts["shards_spliced"] + \
        facts["shards_reused"] > 0
    full = read(storage, build(storage, source.uri, str(tmp_path / "full"), "d", "v2", full=True)["uri"])
    assert v2.rows == full.rows  # filename, content hash, label, label id, split of every record, as TF reads them


def test_a_prover_started_before_discovery_on_another_base_is_replaced(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The prover starts before discovery, on the newest version published before this one as the listing of the
    destination shows it then; when discovery's base is another (a version published meanwhile, here a wrong
    guess forced), that prover is cancelled and one of discovery's base proves it instead."""
    storage, source, dest = pool_night(tmp_path)
    provers = let_provers_finish(monkeypatch)
    started: list[str | None] = []
    start = Prover.start

    def record_start(self: Prover, *args: Any, **kwargs: Any) -> Prover:
        started.append(self.version)
        return start(self, *args, **kwargs)

    monkeypatch.setattr(Prover, "start", record_start)
    monkeypatch.setattr(stages, "EARLY_PROVER_RECORDS", 0)  # (this base is small: its prover would start after)
    monkeypatch.setattr(stages.layout, "previous_version", lambda *_args: None)  # the guess: no base
    cfg = config(source.uri, dest, "d", "v2")
    with process_pool(2) as pool:
        result = stages.run_pipeline(cfg, storage, pool=pool, workers=2)
    assert started == [None, "v1"]
    assert [p.version for p in provers] == ["v1"]
    assert result["proven_ahead"]["proven"] == result["proven_ahead"]["of"] > 0
    check_version(storage, read(storage, result["uri"]), source.files())


def test_an_unchanged_night_on_a_pool_stops_its_prover_and_leaves_no_staging(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A base of ``EARLY_PROVER_RECORDS`` or more is proven from the start of discovery; a night that finds nothing
    changed stops that prover before it drops the staging, so nothing of this build is left (no proofs, no staging
    folder). A smaller base's prover starts after discovery, so an unchanged night starts none."""
    storage = Storage()
    source = base_source(tmp_path, storage, None, per_class=12)
    dest = tmp_path / "out"
    build(storage, source.uri, str(dest), "d", "v1")
    events: list[str] = []
    cancel, discard = Prover.cancel, stages.discard_stage

    def noted_cancel(self: Prover) -> None:
        events.append(f"cancel {self.version} {len(self.shards)} shards")
        cancel(self)

    def noted_discard(*args: Any) -> Any:
        events.append("discard")
        return discard(*args)

    monkeypatch.setattr(Prover, "cancel", noted_cancel)
    monkeypatch.setattr(stages, "discard_stage", noted_discard)
    cfg = config(source.uri, str(dest), "d", "v2")
    with process_pool(2) as pool:
        assert stages.run_pipeline(cfg, storage, pool=pool, workers=2) == {"unchanged_since": "v1", "version": "v1"}
    assert events == ["discard"]  # 36 records: no prover before discovery, none after it
    events.clear()
    monkeypatch.setattr(stages, "EARLY_PROVER_RECORDS", 36)
    with process_pool(2) as pool:
        result = stages.run_pipeline(cfg, storage, pool=pool, workers=2)
    assert result == {"unchanged_since": "v1", "version": "v1"}
    assert events[1] == "discard" and events[0].startswith("cancel v1 ") and events[0] != "cancel v1 0 shards", events
    assert not (dest / "d" / "_staging").exists()
    assert sorted(p.name for p in (dest / "d").iterdir()) == ["latest.json", "v1"]


def test_two_shards_hashed_at_once_are_each_proven_or_not_on_their_own(tmp_path: Path) -> None:
    """``prove_files`` hashes two files in one pass (``sha256_states.hash_two_with_states``): each gets its own
    digest and states, as hashed alone; a missing file, or one of another size than published, costs only its own
    proof."""
    import hashlib
    import random

    from image_tfrecords.shards.proofs import prove_files

    first, second = tmp_path / "a", tmp_path / "b"
    data_a, data_b = random.Random(1).randbytes(3_500_000), random.Random(2).randbytes(1_200_001)
    first.write_bytes(data_a)
    second.write_bytes(data_b)
    flag = str(tmp_path / "stop")
    both = prove_files([(str(first), len(data_a)), (str(second), len(data_b))], flag)
    assert [(held[0], read) for held, read in both] == [(hashlib.sha256(data_a).hexdigest(), len(data_a)),
                                                         (hashlib.sha256(data_b).hexdigest(), len(data_b))]
    alone = [prove_files([(str(path), len(data))], flag)[0] for path, data in ((first, data_a), (second, data_b))]
    assert both == alone  # the same identities and saved states too
    if sha256_states.available():
        assert len(both[0][0][2]) == 3 * sha256_states.CTX_BYTES  # a state every MiB
    missing = prove_files([(str(tmp_path / "gone"), 10), (str(second), len(data_b))], flag)
    assert missing[0] == (None, 0) and missing[1] == alone[1]
    resized = prove_files([(str(first), len(data_a)), (str(second), len(data_b) + 1)], flag)
    assert resized[0] == alone[0] and resized[1][0] is None
    open(flag, "x").close()  # asked to stop: nothing proven
    assert [held for held, _ in prove_files([(str(first), len(data_a)), (str(second), len(data_b))], flag)] == \
        [None, None]
