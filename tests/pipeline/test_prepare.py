"""Kept bytes copied ahead (issue 22, ``shards.prepare``): the kept runs the night will most likely splice are
copied in the pass that proves their base, while the metadata stages run, and a splice takes such a copy only when it
holds exactly the bytes it would copy itself (and then hashes none of them again).

Real parts: a local folder, the pipeline's stages, a real process pool, TensorFlow reading what was published.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from image_tfrecords import stages
from image_tfrecords.config import BuildConfig
from image_tfrecords.parallel import process_pool
from image_tfrecords.published import layout
from image_tfrecords.shards import prepare, splice
from image_tfrecords.shards.prepare import copy_proven, predicted_runs, prepared_dir, prove_and_copy, take_prepared
from image_tfrecords.shards.proofs import Prover
from image_tfrecords.shards.writer import rewrite_shard
from image_tfrecords.staging import PLAN, SHARDS, staged
from image_tfrecords.storage import Storage, join, sha256_states
from image_tfrecords.storage.documents import read_json
from tests.pipeline.test_incremental import build, check_version, config, read
from tests.pipeline.test_proofs import let_provers_finish, pool_night
from tests.pipeline.test_splice import _splice_again, night


def _prover(cfg: BuildConfig, storage: Storage) -> Prover:
    found = read_json(storage, staged(cfg, "discover.json"))
    return Prover(cfg, storage, found["previous_version"], bool(found.get("multi_label")))


def _dropping(plan: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The plan's rewrites whose base shard loses records, by base shard file."""
    return {origin["file"]: origin for origin in plan["rewrite"].values() if origin["kept"] < origin["num_records"]}


def _proven_all(cfg: BuildConfig, storage: Storage) -> tuple[Prover, dict[str, list[list[int]]], str]:
    """A prover that proved every base shard here (``run``), the predicted runs, and the folder of the copies."""
    prover = _prover(cfg, storage)
    prover.run()
    runs = predicted_runs(cfg, storage, prover.base_uri)
    folder = prepared_dir(cfg, storage)
    assert folder is not None
    os.makedirs(folder, exist_ok=True)
    prover._prepared_dir = folder  # as ``Prover.predict`` leaves it, for ``drop_prepared``
    return prover, runs, folder


def _prepare_all(cfg: BuildConfig, storage: Storage) -> tuple[Prover, dict[str, list[list[int]]]]:
    """Prove every base shard, and prove and copy every predicted one ahead (``prove_and_copy``), here, to its end;
    the proofs staged."""
    prover, runs, folder = _proven_all(cfg, storage)
    for file, kept in runs.items():
        size = os.path.getsize(join(prover.base_uri, file))
        held, read, entry = prove_and_copy(join(prover.base_uri, file), size, prover.records[file], kept,
                                           os.path.join(folder, file), os.path.join(folder, "no-stop-flag"))
        assert entry is not None and held is not None and read == size, file
        assert held[:2] == (prover.proofs[file]["sha256"], prover.proofs[file]["identity"])  # the same proof
        assert held[2] == prover.states.get(file, b"")  # and the same saved states, byte for byte
        assert len(held[2]) == size // sha256_states.STATE_EVERY * sha256_states.CTX_BYTES
        prover.prepared[file] = entry
    assert prover.stop()["copied"] == len(runs)
    return prover, runs


def _proven_item(prover: Prover, file: str, runs: list[list[int]], out: str) -> dict[str, Any]:
    """What ``Prover`` hands ``copy_proven`` for the base shard ``file`` it proved."""
    return {"base_path": join(prover.base_uri, file), "num_records": prover.records[file],
            "identity": prover.proofs[file]["identity"], "runs": runs, "out_path": out,
            "states": prover.states.get(file, b"")}


def _copy_proven_all(cfg: BuildConfig, storage: Storage) -> tuple[Prover, dict[str, list[list[int]]]]:
    """Prove every base shard first (``Prover.run``: its runs not known yet), then copy every predicted one two at a
    time (``copy_proven``, the last alone when their number is odd); the proofs staged."""
    prover, runs, folder = _proven_all(cfg, storage)
    files = sorted(runs)
    for first in range(0, len(files), 2):
        pair = files[first:first + 2]
        entries = copy_proven([_proven_item(prover, file, runs[file], os.path.join(folder, file)) for file in pair],
                              os.path.join(folder, "no-stop-flag"))
        for file, entry in zip(pair, entries, strict=True):
            assert entry is not None and entry["base_identity"] == prover.proofs[file]["identity"], file
            prover.prepared[file] = entry
    assert prover.stop()["copied"] == len(runs)
    return prover, runs


def test_the_predicted_runs_are_the_plans(tmp_path: Path) -> None:
    """Scattered deletions, a changed image and additions: the runs predicted from the listing alone are the ones the
    plan keeps, for every base shard that loses records (and only those)."""
    storage, _, cfg = night(tmp_path)
    dropping = _dropping(read_json(storage, staged(cfg, PLAN)))
    assert len(dropping) >= 2
    base_uri = _prover(cfg, storage).base_uri
    runs = predicted_runs(cfg, storage, base_uri)
    assert runs == {file: origin["runs"] for file, origin in dropping.items()}
    assert prepare._predicted_from_rows(cfg, storage, base_uri) == runs  # the columns' answer is the rows'


@pytest.mark.parametrize("copies", ["proving", "proven"])
def test_copies_ahead_splice_to_the_reference_and_are_taken(copies: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each splice takes its copy (not copying again, its digest resumed from the copy's) and its shard is byte for
    byte the record-by-record reference, with its digest and index; the copy is the splice's own file from then on.
    Copies made in the pass that proves their base (``proving``: it saves the base's SHA-256 states as the prover
    does, here every 4 KiB) and copies of bases proven before, two at a time, their digests from the prover's states
    (``proven``; in pieces of 1 KiB, so that some lie wholly in a prefix hashed already)."""
    monkeypatch.setattr(sha256_states, "STATE_EVERY", 4096)
    monkeypatch.setattr(splice, "WRITE_PIECE", 1024)
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    prover, runs = (_prepare_all if copies == "proving" else _copy_proven_all)(cfg, storage)
    assert len(runs) >= 2
    for shard, origin in sorted(plan["rewrite"].items()):
        shard_uri = staged(cfg, SHARDS, shard)
        reference = rewrite_shard(cfg, storage, shard, origin, read_workers=1)
        want = storage.read_bytes(shard_uri), storage.read_bytes(layout.index_file(shard_uri))
        checked = _splice_again(storage, cfg, shard, origin)
        assert (storage.read_bytes(shard_uri), storage.read_bytes(layout.index_file(shard_uri))) == want, shard
        assert checked["sha256"] == reference["sha256"] and checked["index_sha256"] == reference["index_sha256"]
        assert checked["copied_ahead"] is (origin["file"] in runs), shard
        if origin["file"] in runs:
            assert not os.path.exists(prover.prepared[origin["file"]]["path"])  # moved: the splice's now
    prover.drop_prepared()


@pytest.mark.parametrize("spoil", ["runs", "touched", "cut_short", "other_base", "other_index"])
def test_a_copy_that_is_not_the_splices_own_bytes_is_not_taken(spoil: str, tmp_path: Path) -> None:
    """Another plan's runs, a copy touched or cut short since it was made, a copy of another base file or made
    through another index: the splice copies the kept bytes itself, and its shard is still the reference."""
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    prover, _ = _prepare_all(cfg, storage)
    shard, origin = next((s, o) for s, o in sorted(plan["rewrite"].items()) if o["file"] in prover.prepared)
    entry = dict(prover.prepared[origin["file"]])
    path = Path(entry["path"])
    if spoil == "runs":
        entry["runs"] = [[start, stop - 1] for start, stop in entry["runs"]]
    elif spoil == "touched":
        time.sleep(0.01)
        os.utime(path)  # same bytes, new times: nothing proves them any more
    elif spoil == "cut_short":
        os.truncate(path, path.stat().st_size - 1)
    elif spoil == "other_base":
        entry["base_identity"] = [*entry["base_identity"][:-1], entry["base_identity"][-1] + 1]
    else:
        entry["index_sha256"] = "0" * 64
    prover.prepared[origin["file"]] = entry
    prover.stop()
    shard_uri = staged(cfg, SHARDS, shard)
    reference = rewrite_shard(cfg, storage, shard, origin, read_workers=1)
    want = storage.read_bytes(shard_uri)
    checked = _splice_again(storage, cfg, shard, origin)
    assert checked["copied_ahead"] is False and "fallback" not in checked
    assert storage.read_bytes(shard_uri) == want and checked["sha256"] == reference["sha256"]
    assert path.exists()  # left as it was, for the folder's removal
    prover.drop_prepared()
    assert not path.exists()


def test_take_prepared_wants_a_base_index_digest(tmp_path: Path) -> None:
    """A plan whose base predates index digests gives no index to hold a copy to: no copy is taken."""
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    prover, _ = _prepare_all(cfg, storage)
    origin = next(o for o in plan["rewrite"].values() if o["file"] in prover.prepared)
    entry = prover.prepared[origin["file"]]
    old = {**origin, "index_sha256": None}
    assert take_prepared(entry, old, entry["base_identity"], entry["bytes"], str(tmp_path / "x")) is None
    assert take_prepared(None, origin, entry["base_identity"], entry["bytes"], str(tmp_path / "x")) is None
    assert os.path.exists(entry["path"])
    prover.drop_prepared()


def test_a_copy_stops_at_the_flag_and_leaves_no_file(tmp_path: Path) -> None:
    storage, _, cfg = night(tmp_path)
    prover = _prover(cfg, storage)
    runs = predicted_runs(cfg, storage, prover.base_uri)
    file, kept = next(iter(runs.items()))
    path = join(prover.base_uri, file)
    size = os.path.getsize(path)
    flag, out = tmp_path / "stop", tmp_path / "copy"
    flag.touch()
    assert prove_and_copy(path, size, prover.records[file], kept, str(out), str(flag))[::2] == (None, None)
    assert not out.exists()
    flag.unlink()
    assert prove_and_copy(path, size, prover.records[file] + 1, kept, str(out), str(flag))[::2] == (None, None)
    assert not out.exists()  # an index that does not list the records the manifest gives: nothing copied
    assert prove_and_copy(path, size + 1, prover.records[file], kept, str(out), str(flag))[::2] == (None, None)
    assert not out.exists()  # not the size its version published
    held, read, entry = prove_and_copy(path, size, prover.records[file], kept, str(out), str(flag))
    assert held is not None and entry is not None and read == size and out.stat().st_size == entry["bytes"]


def test_copies_of_proven_bases_stop_at_the_flag_and_want_the_proven_file(tmp_path: Path) -> None:
    """``copy_proven``: at the stop flag, neither copy is left; a base that is not the file its prover proved (touched
    since), or gone, gets no copy while the other of the pair is still made."""
    storage, _, cfg = night(tmp_path)
    prover = _prover(cfg, storage)
    prover.run()
    runs = predicted_runs(cfg, storage, prover.base_uri)
    first, second = sorted(runs)[:2]
    flag, outs = tmp_path / "stop", [str(tmp_path / "copy-a"), str(tmp_path / "copy-b")]
    items = [_proven_item(prover, first, runs[first], outs[0]), _proven_item(prover, second, runs[second], outs[1])]
    flag.touch()
    assert copy_proven(items, str(flag)) == [None, None]
    assert not any(os.path.exists(out) for out in outs)
    flag.unlink()
    time.sleep(0.01)
    os.utime(items[0]["base_path"])  # the same bytes, but not the file proved any more
    touched, made = copy_proven(items, str(flag))
    assert touched is None and not os.path.exists(outs[0])
    assert made is not None and os.path.getsize(outs[1]) == made["bytes"]
    os.unlink(outs[1])
    gone = {**items[0], "base_path": str(tmp_path / "missing.tfrecord")}
    assert copy_proven([gone, items[1]], str(flag))[0] is None and os.path.exists(outs[1])


def test_a_prover_copies_the_bases_it_proved_before_the_prediction(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool prover started before the kept runs are known (as with discovery, on a large base) proves every base;
    the prediction then has the shards it proved copied, two a job (``copy_proven``), and the splices take those
    copies and give the reference's bytes."""
    stopped = let_provers_finish(monkeypatch)
    monkeypatch.setattr(sha256_states, "STATE_EVERY", 4096)
    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    jobs: list[str] = []
    with process_pool(2) as pool:
        submit = pool.submit

        def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
            jobs.append(fn.__name__)
            return submit(fn, *args, **kwargs)

        monkeypatch.setattr(pool, "submit", counted)
        prover = _prover(cfg, storage).start(pool, 1)
        deadline = time.monotonic() + 60
        while len(prover.proofs) < len(prover.shards) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(prover.proofs) == len(prover.shards) and not prover.prepared
        assert prover.predict()
        done = prover.stop()
    runs = predicted_runs(cfg, storage, prover.base_uri)
    assert stopped == [prover] and done["copied"] == len(runs) >= 2 and set(prover.prepared) == set(runs)
    assert jobs.count("copy_proven") == (len(runs) + 1) // 2 and "prove_and_copy" not in jobs
    for shard, origin in sorted(plan["rewrite"].items()):
        shard_uri = staged(cfg, SHARDS, shard)
        reference = rewrite_shard(cfg, storage, shard, origin, read_workers=1)
        want = storage.read_bytes(shard_uri)
        checked = _splice_again(storage, cfg, shard, origin)
        assert storage.read_bytes(shard_uri) == want and checked["sha256"] == reference["sha256"], shard
        assert checked["copied_ahead"] is (origin["file"] in runs), shard
    prover.drop_prepared()


def test_a_night_on_four_processes_copies_ahead_and_equals_the_full_build(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``run_pipeline`` with a pool of four: the prover proves and copies ahead beside the metadata stages
    (here let finish before it is stopped), splices take the copies, the copies not taken are removed with their
    folder, and the version is the full build's, record for record."""
    storage, source, dest = pool_night(tmp_path)
    stopped = let_provers_finish(monkeypatch)
    taken = tmp_path / "taken"
    taken.mkdir()
    take = splice.take_prepared

    def take_and_tell(entry: Any, origin: dict[str, Any], *args: Any) -> Any:  # in the pool's processes (forked)
        copy = take(entry, origin, *args)
        if copy is not None:
            (taken / origin["file"]).touch()
        return copy

    monkeypatch.setattr(splice, "take_prepared", take_and_tell)
    cfg = config(source.uri, dest, "d", "v2")
    with process_pool(4) as pool:
        result = stages.run_pipeline(cfg, storage, pool=pool, workers=4)
    v2 = read(storage, result["uri"])
    check_version(storage, v2, source.files())
    assert result["proven_ahead"]["copied"] > 0 and len(stopped) == 1 and stopped[0]._prepared_dir
    assert len(os.listdir(taken)) == result["proven_ahead"]["copied"]  # every copy made was taken by its splice
    assert not os.path.exists(stopped[0]._prepared_dir)
    full = read(storage, build(storage, source.uri, str(tmp_path / "full"), "d", "v2", full=True)["uri"])
    assert v2.rows == full.rows  # filename, content hash, label, label id, split of every record, as TF reads them


def test_the_pool_takes_the_costliest_shards_first(tmp_path: Path) -> None:
    """``costliest_first``: shards made from the source, then splices of a base hashed in the splice (by size), then
    of a proven base, then of a base whose kept bytes were copied ahead; without staged proofs, by base size."""
    from image_tfrecords.shards.proofs import PROOFS
    from image_tfrecords.stages.plan import all_shards
    from image_tfrecords.stages.write import costliest_first
    from image_tfrecords.storage.documents import write_json

    storage, _, cfg = night(tmp_path)
    plan = read_json(storage, staged(cfg, PLAN))
    shards = all_shards(cfg, storage)
    spliced = [s for s in shards if s in plan["rewrite"]]
    assert len(spliced) >= 3
    size = {s: plan["rewrite"][s]["num_bytes"] for s in spliced}
    by_size = sorted(spliced, key=lambda s: -size[s])
    assert costliest_first(cfg, storage, shards) == [s for s in shards if s not in spliced] + by_size
    copied, proven = plan["rewrite"][by_size[0]]["file"], plan["rewrite"][by_size[1]]["file"]
    write_json(storage, staged(cfg, PROOFS), {"shards": {copied: {}, proven: {}}, "prepared": {copied: {}}})
    order = costliest_first(cfg, storage, shards)
    assert order[-2:] == [by_size[1], by_size[0]]  # the proven one, then the one copied ahead
    assert sorted(order) == sorted(shards)
