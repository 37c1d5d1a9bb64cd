"""Prove the base version's shards ahead, on the cores the metadata stages leave idle.

A night splices or reuses the shards of the version it builds on, and uses a base shard only once it is
proven: its SHA-256 must be the one its version published. Hashing them is most of a large night's work
(4.65 GB at 100,000 images, about 3 s of a core), and the stages before the write (inspect's join, split,
plan: Python over every row) keep one core busy and leave the others idle. So ``run_pipeline`` starts a
``Prover`` once discovery has found changes: it hashes the base shards in the build's process pool
(``prove_files``, up to ``--workers`` - 1 jobs at a time, each hashing two shards at once as two streams in one
pass, ``sha256_states.update_pair``; on a thread of this process without a pool) while those
stages run, and is stopped before the first stage that uses them, whatever it got through (the DAG runs
``stages.prove_stage`` as a task beside those stages instead, which stops once the attempt's plan is staged).
It stages what it proved (``proofs.json``): for each shard that hashed to its published digest, the file's
identity when it did (``identity``: device, inode, size, modification and change times), with this machine's
boot id (``host``), and the SHA-256 states saved every MiB as it hashed (``storage.sha256_states``, staged in
``proof-states/``, named in the proof by their own digest). A splice or a reuse on this machine that finds its
base with that same identity takes the proof instead of hashing the base again (a splice checks the identity
once more after its copy), and a splice starts its new shard's digest from the last state before the first
record it drops, where the prefix it shares with its base ends; any other (a
shard not reached, a file replaced, touched or rewritten since, an S3 destination, a task on another machine)
is hashed where it is used, as before. A shard that did not hash to its digest is only left unproven: the stage
that uses it finds the damage itself and says so. The shards are mapped, as the splices that use them map them
(``storage.base.mapped_chunks``): a bad sector or a file cut short while it is mapped is a SIGBUS there, as in a
splice; a lone shard is read into one buffer. Once discovery has
listed the source, ``predict`` asks which runs of records each base shard keeps (``shards.prepare``): a shard that
loses records is then proven and its kept bytes copied in the same pass (``prove_and_copy``); one proven before
the prediction came has its kept bytes copied first, two shards a job (``copy_proven``); those copies are staged too.

The pool's first task forks its workers, so ``start`` is called on the main thread; the pool's jobs stop at a
flag file (``STOP_FLAG``) between chunks, and the callbacks that hand out the next shard take only this
object's lock.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import shutil
import socket
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Executor, Future, wait
from typing import Any

from ..config import BuildConfig
from ..progress import log
from ..records.schema import schema_of
from ..rules.base_version import base_of, why_not_reuse_shards
from ..staging import staged
from ..storage import Storage, is_s3, join, sha256_states
from ..storage.base import MAPPED_CHUNK, mapped_chunks, read_chunks, sha256_read
from ..storage.documents import read_json, write_json

PROOFS = "proofs.json"  # in the build's staging prefix
STOP_FLAG = "stop"  # in the pool prover's temporary folder: its jobs stop when it appears
STATES = "proof-states"  # in the staging prefix: each proven shard's saved SHA-256 states (storage.sha256_states)
Held = tuple[str, list[int], bytes]  # a hashed shard's digest, identity and saved states


def identity(stat: os.stat_result) -> list[int]:
    """What a proof holds of a file: a file replaced, rewritten or touched since has another."""
    return [stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns]


def host() -> str:
    """This machine as it runs now (its boot id; its name where there is none): a proof holds only here. On a
    network file system another machine may see the same device and inode numbers for another file."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return socket.gethostname()


def prepared_entry(cfg: BuildConfig, storage: Storage, origin: dict[str, Any]) -> dict[str, Any] | None:
    """This build's prepared copy of the kept bytes of the base shard ``origin`` (``shards.prepare``), as its
    prover staged it; None when there is none."""
    try:
        proofs = read_json(storage, staged(cfg, PROOFS))
        if (proofs.get("version"), proofs.get("host")) != (origin["version"], host()):
            return None
        entry = proofs.get("prepared", {}).get(origin["file"])
        return entry if isinstance(entry, dict) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def proven(cfg: BuildConfig, storage: Storage, origin: dict[str, Any]) -> list[int] | None:
    """The identity of the base shard ``origin`` (a plan's ``{"version", "file", "sha256", ...}``) when this
    build's prover proved it; None when it did not (or none ran)."""
    entry = proof_of(cfg, storage, origin)
    return list(entry["identity"]) if entry else None


def proof_states(cfg: BuildConfig, storage: Storage, origin: dict[str, Any],
                 entry: dict[str, Any] | None) -> tuple[bytes, int] | None:
    """The SHA-256 states this build's prover saved while it proved the base shard ``origin`` (``entry``: its proof,
    ``proof_of``) and the bytes between them (``storage.sha256_states``); None when it saved none, or they are not
    the ones it named."""
    saved = entry.get("states") if entry else None
    if not isinstance(saved, dict) or saved.get("every") != sha256_states.STATE_EVERY or \
            not sha256_states.available():
        return None
    try:
        states = storage.read_bytes(staged(cfg, STATES, origin["file"]))
    except OSError:
        return None
    return (states, saved["every"]) if hashlib.sha256(states).hexdigest() == saved.get("sha256") else None


def proof_of(cfg: BuildConfig, storage: Storage, origin: dict[str, Any]) -> dict[str, Any] | None:
    """This build's prover's proof of the base shard ``origin`` (its ``identity`` and, where it saved them, its
    ``states``); None when it has none."""
    try:
        proofs = read_json(storage, staged(cfg, PROOFS))
        entry = proofs["shards"].get(origin["file"]) if (proofs.get("version"), proofs.get("host")) == \
            (origin["version"], host()) else None
        return entry if isinstance(entry, dict) and entry.get("sha256") == origin["sha256"] and \
            isinstance(entry.get("identity"), list) else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none staged, or not what a prover stages
        return None


class Prover:
    """Hashes the base shards of a build on a thread of this process until ``stop``; see the module."""

    def __init__(self, cfg: BuildConfig, storage: Storage, previous: str | None, multi_label: bool | None) -> None:
        """``multi_label``: whether discovery found a multi-label source (None: not listed yet, taken as the base
        was: a prover started before discovery, whose proofs go unused if the plan cannot take the base)."""
        self.cfg, self.storage = cfg, storage
        self.version: str | None = None
        self.shards: list[tuple[str, str, int]] = []  # (file, sha256, bytes) of each base shard
        self.proofs: dict[str, dict[str, Any]] = {}
        self.states: dict[str, bytes] = {}  # base shard file -> its saved SHA-256 states (sha256_states)
        self.bytes_hashed, self.seconds, self.failed = 0, 0.0, ""
        self._stop = threading.Event()
        self._until: Callable[[], bool] = lambda: False
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()  # a callback may run at once, on the thread that holds it
        self._pool: Executor | None = None
        self._flag_dir, self._started = "", 0.0
        self._todo: deque[tuple[str, str, int]] = deque()
        self._width, self._deferred = 1, False  # jobs at a time; whether they wait for the prediction
        self._in_flight: dict[Future[Any], list[tuple[str, str]]] = {}
        self._copying: set[Future[Any]] = set()  # the jobs of ``_in_flight`` that copy shards proven already
        self._copy_todo: deque[str] = deque()  # shards proven before their runs were known, to copy (``copy_proven``)
        self.runs: dict[str, list[list[int]]] | None = None  # the predicted runs of the base shards that lose records
        self.base_uri, self.records = "", {}
        self.prepared: dict[str, dict[str, Any]] = {}  # base shard file -> its prepared copy (shards.prepare)
        self._prepared_dir = ""
        self._side: set[Future[Any]] = set()  # the prediction and the copies
        if is_s3(cfg.dataset_uri) or not previous:  # an S3 base is hashed where it is downloaded, once
            return
        try:
            base = base_of(cfg, storage, previous)
            if base is None or why_not_reuse_shards(cfg, base, schema_of(
                    cfg, base.manifest.multi_label if multi_label is None else multi_label)):
                return
            entries = [s for split in base.manifest.splits.values() for s in split.shards]
        except Exception:  # a damaged base is the plan's to find and report
            return
        self.version, self.base_uri = base.version, base.uri
        self.shards = [(s.file, s.sha256, s.num_bytes) for s in entries]
        self.records = {s.file: s.num_records for s in entries}

    def start(self, pool: Executor | None = None, width: int = 1, predict: bool = False) -> Prover:
        """Start hashing (nothing to do for a build that uses no base shards): on a thread of this process, or
        with ``pool``, ``width`` jobs at a time in its processes (``prove_files``, ``prove_and_copy``), where no
        hashing waits for this process's GIL; ``predict``: discovery has listed the source, and the jobs start once
        ``predict`` has told which runs each base shard keeps. The pool's first task forks its workers: call this
        on the thread that imports (the main one), never while another thread of this process may hold a lock."""
        if not self.shards:
            return self
        self._started = time.perf_counter()
        if pool is None:
            self._thread = threading.Thread(target=self.run, name="prove-base", daemon=True)
            self._thread.start()
            return self
        try:
            self._flag_dir = tempfile.mkdtemp(prefix="prove-")
        except OSError:  # no temporary folder: only a head start, so none
            return self
        self._pool, self._todo, self._width = pool, deque(self.shards), max(1, width)
        self._deferred = predict
        if not (predict and self.predict()):
            self._deferred = False
            for _ in range(self._width):
                self._submit_next()
        return self

    def predict(self) -> bool:
        """Predict which runs of records the night keeps of each base shard (``shards.prepare.predicted_runs``, in
        the pool ``start`` was given, once discovery has listed the source): from then on, a base shard that loses
        records is proven and its kept bytes copied in one pass (``prove_and_copy``), the disk writing them while
        the metadata stages run; the others are proven two at a time. Returns whether a prediction was asked."""
        from .prepare import predicted_runs, prepared_dir

        folder = prepared_dir(self.cfg, self.storage) if self.shards and self.cfg.compression == "none" else None
        if folder is None or self._pool is None or self._stop.is_set() or self._prepared_dir or \
                not sha256_states.available():
            return False  # (gzip shards are rewritten record by record: no byte range of theirs is kept)
        try:
            os.makedirs(folder, exist_ok=True)
            self._prepared_dir = folder
            job = self._pool.submit(predicted_runs, self.cfg, self.storage, self.base_uri)
        except Exception:  # only a head start
            return False
        with self._lock:
            self._side.add(job)
        job.add_done_callback(self._predicted)
        return True

    def _predicted(self, job: Future[dict[str, list[list[int]]]]) -> None:
        with self._lock:
            self._side.discard(job)
            try:
                runs = None if job.cancelled() else job.result()
            except Exception:  # only a head start
                runs = None
            if runs is not None:
                self.runs = {file: kept for file, kept in runs.items() if file in self.records and kept}
                self._copy_todo.extend(file for file, _, _ in self.shards if file in self.proofs and file in self.runs)
            self._deferred = False  # (``start`` may have left the jobs to this moment; they may all be done too)
            for _ in range(self._width - len(self._in_flight)):
                self._submit_next()

    def drop_prepared(self) -> None:
        """Remove the prepared copies no splice took (after the write stage, or when the build ends)."""
        if self._prepared_dir:
            shutil.rmtree(self._prepared_dir, ignore_errors=True)

    def _submit_next(self) -> None:
        """Hand the next shards to the pool (``start``, then each finished job's callback): first the shards proven
        before their kept runs were predicted, two at a time (``copy_proven``: their new digests as two streams of
        one pass, where the splices would hash each alone); then a shard whose kept runs are predicted is proven and
        copied (``prove_and_copy``); others two at a time, hashed at once as two streams in one pass
        (``prove_files``)."""
        from .prepare import copy_proven, prove_and_copy

        with self._lock:
            if self._stop.is_set() or not (self._todo or self._copy_todo):
                return
            runs = self.runs or {}
            if self._copy_todo:
                files = [self._copy_todo.popleft() for _ in range(min(2, len(self._copy_todo)))]
                items = [{"base_path": join(self.cfg.dataset_uri, self.version or "", file),
                          "num_records": self.records[file], "identity": self.proofs[file]["identity"],
                          "runs": runs[file], "out_path": os.path.join(self._prepared_dir, file),
                          "states": self.states.get(file, b"")} for file in files]
                try:
                    job = self._pool.submit(copy_proven, items, os.path.join(self._flag_dir, STOP_FLAG))  # type: ignore[union-attr]
                except Exception as exc:  # a pool shut down or broken: only a head start
                    self.failed = f"{type(exc).__name__}: {exc}"
                    return
                self._in_flight[job] = [(file, self.proofs[file]["sha256"]) for file in files]
                self._copying.add(job)
                job.add_done_callback(self._finished)
                return
            items = [self._todo.popleft()]
            if items[0][0] not in runs and self._todo and self._todo[0][0] not in runs:
                items.append(self._todo.popleft())
            paths = [join(self.cfg.dataset_uri, self.version or "", file) for file, _, _ in items]
            flag = os.path.join(self._flag_dir, STOP_FLAG)
            try:
                if items[0][0] in runs:
                    file, _, size = items[0]
                    job = self._pool.submit(prove_and_copy, paths[0], size, self.records[file], runs[file],  # type: ignore[union-attr]
                                            os.path.join(self._prepared_dir, file), flag)
                else:
                    job = self._pool.submit(prove_files, [(path, size) for path, (_, _, size) in  # type: ignore[union-attr]
                                                          zip(paths, items, strict=True)], flag)
            except Exception as exc:  # a pool shut down or broken: only a head start
                self.failed = f"{type(exc).__name__}: {exc}"
                return
            self._in_flight[job] = [(file, sha256) for file, sha256, _ in items]
        job.add_done_callback(self._finished)  # (at once, on this thread, when it is done already)

    def _finished(self, job: Future[Any]) -> None:
        """A job's proofs (``prove_files``: a list of (proof, bytes read); ``prove_and_copy``: one, and its copy)."""
        with self._lock:  # the next shards are handed out before the lock is let go: no one sees none in flight between
            items = self._in_flight.pop(job)
            try:
                result = None if job.cancelled() else job.result()
            except Exception as exc:  # a broken pool: only a head start
                self.failed = self.failed or f"{type(exc).__name__}: {exc}"
                result = None
            if job in self._copying:  # copy_proven's: a copy, or None, for each
                self._copying.discard(job)
                for (file, _), entry in zip(items, result or [None] * len(items), strict=True):
                    if entry is not None:
                        self.prepared[file] = entry
                self.seconds = time.perf_counter() - self._started
                self._submit_next()
                return
            copy = None
            if isinstance(result, tuple):  # prove_and_copy's
                held, read, copy = result
                result = [(held, read)]
            for (file, sha256), (held, read) in zip(items, result or [(None, 0)] * len(items), strict=True):
                self.bytes_hashed += read
                if held is not None and held[0] == sha256:
                    self._proved(file, sha256, held[1], held[2])
                    if copy is not None:
                        self.prepared[file] = copy
                    elif self.runs and file in self.runs and self._prepared_dir:  # proven before its runs were known
                        self._copy_todo.append(file)
            self.seconds = time.perf_counter() - self._started
            self._submit_next()

    def run(self, until: Callable[[], bool] = lambda: False) -> None:
        """Hash the base shards one after another until the last, ``stop``, or ``until()`` (asked between
        chunks) is true: the thread ``start`` starts runs this."""
        started = time.perf_counter()
        self._until = until
        try:
            for first in range(0, len(self.shards), 2):
                if self._stopped():
                    break
                pair = self.shards[first:first + 2]
                for (file, sha256, _), held in zip(pair, self._prove([(join(self.cfg.dataset_uri, self.version or "",
                                                                            file), size) for file, _, size in pair]),
                                                   strict=True):
                    if held is not None and held[0] == sha256:
                        self._proved(file, sha256, held[1], held[2])
        except Exception as exc:  # only a head start: the shards are hashed where they are used
            self.failed = f"{type(exc).__name__}: {exc}"  # told by ``stop``: this thread logs nothing (see above)
        finally:
            self.seconds = time.perf_counter() - started

    def _proved(self, file: str, sha256: str, ident: list[int], states: bytes) -> None:
        self.proofs[file] = {"sha256": sha256, "identity": ident}
        if states:
            self.proofs[file]["states"] = {"every": sha256_states.STATE_EVERY,
                                           "sha256": hashlib.sha256(states).hexdigest()}
            self.states[file] = states

    def _prove(self, files: list[tuple[str, int]]) -> list[Held | None]:
        """``_hash_shards`` of the files (path, bytes), stopping when this prover is stopped; counts the bytes read."""
        results = _hash_shards(files, self._stopped)
        self.bytes_hashed += sum(read for _, read in results)
        return [held for held, _ in results]

    def _stopped(self) -> bool:
        if not self._stop.is_set() and self._until():
            self._stop.set()
        return self._stop.is_set()

    def stop(self) -> dict[str, Any]:
        """Stop hashing and copying (after the chunk or run in hand), stage what was proved and copied, and say so
        in the log. Returns ``{"proven": N, "of": M}``, and ``"copied"`` (base shards whose kept bytes were copied
        ahead) when ``start`` was asked to copy."""
        self.cancel()
        if not self.shards:
            return {"proven": 0, "of": 0}
        with self._lock:  # a job's callback may still be recording it (``wait`` returns before callbacks have run)
            proofs, all_states, prepared = dict(self.proofs), dict(self.states), dict(self.prepared)
        try:
            for file, states in all_states.items():  # (before the proofs that name them)
                self.storage.write_bytes(staged(self.cfg, STATES, file), states)
            write_json(self.storage, staged(self.cfg, PROOFS),
                       {"version": self.version, "host": host(), "shards": proofs, "prepared": prepared})
        except OSError as exc:  # only a head start: never a reason for a build to fail
            log.warning("the proofs of the base shards could not be staged (%s): they are hashed where they are used",
                        exc)
            return {"proven": 0, "of": len(self.shards)}
        log.log(logging.WARNING if self.failed else logging.INFO,
                "proved %d of %d base shards of version %s ahead (%.1f MB hashed in %.2f s, beside the metadata "
                "stages)%s%s", len(proofs), len(self.shards), self.version, self.bytes_hashed / 1e6, self.seconds,
                f"; kept bytes of {len(prepared)} copied ahead" if self._prepared_dir else "",
                f"; stopped by {self.failed}: the rest are hashed where they are used" if self.failed else "")
        done = {"proven": len(proofs), "of": len(self.shards)}
        return {**done, "copied": len(prepared)} if self._prepared_dir else done

    def cancel(self) -> None:
        """Stop hashing (after the chunk in hand) and stage nothing (the build ended early)."""
        with self._lock:
            self._stop.set()
            jobs = [*self._in_flight, *self._side]
            if self._flag_dir:
                with contextlib.suppress(OSError):
                    open(os.path.join(self._flag_dir, STOP_FLAG), "x").close()  # the pool's jobs stop at it
        for job in jobs:
            job.cancel()  # those not begun yet
        if jobs:
            wait(jobs, timeout=60)  # each stops after the chunk in hand; a stuck read is only waited for so long
        if self._flag_dir:
            shutil.rmtree(self._flag_dir, ignore_errors=True)
            self._flag_dir = ""
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def prove_files(files: list[tuple[str, int]], stop_flag: str) -> list[tuple[Held | None, int]]:
    """In a pool's process: ``_hash_shards`` of the files (path, bytes); stops when ``stop_flag`` exists (asked
    between chunks)."""
    return _hash_shards(files, lambda: os.path.exists(stop_flag))


def _hash_shards(files: list[tuple[str, int]], stopped: Callable[[], bool]) -> list[tuple[Held | None, int]]:
    """``_hash_shard`` of each file (path, bytes), two at once where their states can be saved: their bytes hashed
    as two streams in one pass (``sha256_states.hash_two_with_states``: the same digests and states)."""
    if len(files) != 2 or not sha256_states.available():
        return [_hash_shard(path, size, stopped) for path, size in files]
    with contextlib.ExitStack() as stack:
        opened = []
        for path, size in files:
            try:
                file = stack.enter_context(open(path, "rb", buffering=0))
                stat = os.fstat(file.fileno())
            except OSError:
                return [(None, 0), _hash_shard(*files[1], stopped)] if not opened else \
                    [_hash_shard(*files[0], stopped), (None, 0)]
            opened.append((file, stat, size))
        if any(stat.st_size != size or not size for _, stat, size in opened):  # not the file its version published
            return [_hash_shard(path, size, stopped) for path, size in files]
        try:
            hashed = sha256_states.hash_two_with_states(*(mapped_chunks(file, stopped, MAPPED_CHUNK)
                                                         for file, _, _ in opened))
        except (OSError, ValueError):
            return [(None, 0), (None, 0)]
        results: list[tuple[Held | None, int]] = []
        for (file, stat, size), (digest, states, read) in zip(opened, hashed, strict=True):
            try:
                same = read == size and identity(os.fstat(file.fileno())) == identity(stat)
            except OSError:
                same = False
            results.append(((digest.hexdigest(), identity(stat), states) if same else None, read))
        return results


def _hash_shard(path: str, num_bytes: int, stopped: Callable[[], bool]) -> tuple[Held | None, int]:
    """The SHA-256 of the file at ``path``, its identity before it was read and its saved SHA-256 states
    (``storage.sha256_states``; empty where they cannot be saved) (None when it is not ``num_bytes`` long, is
    missing or unreadable, changed while it was read, or ``stopped()`` became true before its end), and the bytes
    read. Read into one buffer, not mapped: a bad sector or a file cut short while it is read is an error here,
    not a SIGBUS."""
    try:
        with open(path, "rb", buffering=0) as file:
            stat = os.fstat(file.fileno())
            if stat.st_size != num_bytes or not num_bytes:
                return None, 0
            if sha256_states.available():
                digest, states = sha256_states.hash_with_states(read_chunks(file, stopped))
                read = file.tell()
            else:
                (digest, read), states = sha256_read(file, stopped), b""
            if read != num_bytes or identity(os.fstat(file.fileno())) != identity(stat):  # cut short, or changed
                return None, read
            return (digest.hexdigest(), identity(stat), states), read
    except (OSError, ValueError):
        return None, 0
