"""The pipeline's stages, shared by the DAG (one task each) and the command line.

Every stage reads its inputs from, and writes its outputs to, the build's staging prefix
(``DEST/DATASET/_staging/VERSION/``) and returns a small dict (counts, URIs): nothing of
unbounded size passes between stages except through the store, so tasks can run on any worker.
Each stage is idempotent: run again on the same inputs, it writes the same bytes.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import Executor
from functools import partial
from typing import Any

from . import __version__, planning
from .config import BuildConfig
from .csvio import RowWriter, read_json, read_rows, write_json
from .discovery import DiscoveryCounts, discover
from .errors import BuildError, StoreBusy
from .example import decode_example, encode_example
from .manifest import FEATURES, LABELS_FIELDS, REJECTS_FIELDS, example_features, feature_spec
from .parallel import batched_map, ordered_map
from .probe import RejectedImage, inspect_image, stored_bytes
from .reading import read_source
from .splitting import DuplicateResolver, assign_split
from .storage import HashingReader, HashingWriter, Storage, is_s3, join
from .tfrecord import CorruptRecordError, TFRecordWriter, read_records

Progress = Callable[[int], None]
TMP_PREFIX = ".tmp-"  # temporary files and folders inside a local staging prefix
MAX_MAP_LENGTH = 1024  # Airflow's default [core] max_map_length

# Staging layout (relative to BuildConfig.staging_uri).
DISCOVERED, DISCOVER_REJECTS, DISCOVER_SUMMARY = "discovered.csv", "rejects-discover.csv", "discover.json"
INSPECTED, INSPECT_REJECTS = "inspected.csv", "rejects-inspect.csv"
LABELS, REJECTS, SPLIT_SUMMARY = "labels.csv", "rejects.csv", "split.json"
PLAN, MANIFEST, SUCCESS, LATEST = "plan.json", "dataset_info.json", "_SUCCESS", "latest.json"
CARD, CARD_INDEX = "card-files", "card-files.json"  # staged card files (published as card.md, card.html, card/)
INSPECTED_FIELDS = ("filename", "label", "sha256", "format", "width", "height", "channels", "num_bytes",
                    "source_format", "transform", "encoded_sha256", "encoded_bytes")




def _staged(cfg: BuildConfig, *parts: str) -> str:
    return join(cfg.staging_uri, *parts)


def _no_progress(_: int) -> None:
    pass


# -- 1. discover ---------------------------------------------------------------------------------
def discover_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """List the source: candidate images to inspect, rejects, and skipped non-image files."""
    counts = DiscoveryCounts()
    with RowWriter(storage, _staged(cfg, DISCOVERED), ("filename", "label", "num_bytes")) as found, \
            RowWriter(storage, _staged(cfg, DISCOVER_REJECTS), REJECTS_FIELDS) as rejects:
        for candidate in discover(storage, cfg.source, counts, cfg.cutoff):
            if candidate.reason:
                rejects.write(vars(candidate))
            else:
                found.write(vars(candidate))
    counts.fingerprint.update(json.dumps([__version__, cfg.fingerprint_params], sort_keys=True).encode())
    fingerprint = counts.fingerprint.hexdigest()
    previous = previous_version(storage, cfg)
    unchanged = previous if previous and read_json(storage, join(cfg.dataset_uri, previous, MANIFEST)).get(
        "source_fingerprint") == fingerprint else None
    summary = {"layout": counts.layout, "listed": counts.listed, "skipped": counts.skipped,
               "skipped_by_kind": dict(sorted(counts.skipped_by_kind.items())),
               "after_cutoff": counts.after_cutoff, "candidates": found.count, "rejected": rejects.count,
               "fingerprint": fingerprint, "previous_version": previous, "unchanged_since": unchanged}
    write_json(storage, _staged(cfg, DISCOVER_SUMMARY), summary)
    if not found.count:
        raise BuildError(f"no labelled images found under {cfg.source} ({counts.listed} files listed, "
                         f"{rejects.count} rejected): expected one folder per class or a labels.csv")
    return summary


def discard_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Drop this build's staging prefix (when there is nothing new to build)."""
    storage.delete_tree(cfg.staging_uri)
    return {"discarded": cfg.staging_uri}


# -- 2. inspect (the label CSV's facts) -----------------------------------------------------------
def _inspect_one(storage: Storage, cfg: BuildConfig, row: dict[str, str]) -> dict[str, Any]:
    try:
        data = read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
        facts = inspect_image(data, cfg.max_pixels)
    except RejectedImage as exc:
        return {"filename": row["filename"], "reason": exc.reason, "detail": exc.detail}
    return {"filename": row["filename"], "label": row["label"], **vars(facts)}


def inspect_stage(cfg: BuildConfig, storage: Storage, workers: int = 4, progress: Progress = _no_progress,
                  processes: Executor | None = None) -> dict[str, Any]:
    """Hash, identify and fully decode every candidate.

    Runs on ``workers`` threads (decoders release the GIL), or on the ``processes`` pool (with
    ``workers`` processes) when given, which also spreads the per-file Python work.
    """
    inspect = partial(_inspect_one, storage, cfg)
    with read_rows(storage, _staged(cfg, DISCOVERED)) as rows, \
            RowWriter(storage, _staged(cfg, INSPECTED), INSPECTED_FIELDS) as good, \
            RowWriter(storage, _staged(cfg, INSPECT_REJECTS), REJECTS_FIELDS) as rejects:
        results = batched_map(inspect, rows, processes, workers) if processes else ordered_map(inspect, rows, workers)
        for result in results:
            (rejects if "reason" in result else good).write(result)
            progress(1)
    return {"inspected": good.count, "rejected": rejects.count}


# -- 3. split ---------------------------------------------------------------------------------------
def split_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Resolve duplicates, assign class ids and splits; write labels.csv and rejects.csv."""
    inspected = _staged(cfg, INSPECTED)
    with read_rows(storage, inspected) as rows:
        resolver = DuplicateResolver((r["filename"], r["label"], r["sha256"]) for r in rows)
    found = read_json(storage, _staged(cfg, DISCOVER_SUMMARY))
    previous = found["previous_version"]
    known = read_json(storage, join(cfg.dataset_uri, previous, MANIFEST))["classes"] if previous else []
    classes = known + sorted(resolver.kept_labels() - set(known))  # ids never change once given
    class_ids = {name: i for i, name in enumerate(classes)}
    per_split: dict[str, Counter[str]] = {name: Counter() for name in cfg.splits}
    reasons: Counter[str] = Counter()
    with RowWriter(storage, _staged(cfg, LABELS), LABELS_FIELDS) as labels, \
            RowWriter(storage, _staged(cfg, REJECTS), REJECTS_FIELDS) as rejects:
        for earlier in (DISCOVER_REJECTS, INSPECT_REJECTS):
            with read_rows(storage, _staged(cfg, earlier)) as rows:
                for row in rows:
                    rejects.write(row)
                    reasons[row["reason"]] += 1
        with read_rows(storage, inspected) as rows:
            for row in rows:
                verdict = resolver.verdict(row["filename"], row["sha256"])
                if verdict:
                    rejects.write({"filename": row["filename"], "reason": verdict[0], "detail": verdict[1]})
                    reasons[verdict[0]] += 1
                    continue
                split = assign_split(row["sha256"], cfg.salt, cfg.splits)
                labels.write({**row, "label_id": class_ids[row["label"]], "split": split})
                per_split[split]["records"] += 1
                per_split[split]["bytes"] += int(row["encoded_bytes"])
    skipped = found["skipped"]
    summary = {"classes": classes, "previous_version": previous, "source_fingerprint": found["fingerprint"],
               "num_records": labels.count,
               "num_rejected": rejects.count, "num_skipped": skipped,
               "skipped_by_kind": found.get("skipped_by_kind", {}),
               "rejects_by_reason": dict(sorted(reasons.items())),
               "splits": {name: {"num_records": c["records"], "num_bytes": c["bytes"]}
                          for name, c in per_split.items()}}
    write_json(storage, _staged(cfg, SPLIT_SUMMARY), summary)
    why = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))
    if not labels.count:
        raise BuildError(f"no valid images to publish: all {rejects.count} files were rejected ({why})")
    share = rejects.count / (labels.count + rejects.count)
    if share > cfg.max_reject_fraction:
        raise BuildError(f"{rejects.count} of {labels.count + rejects.count} files rejected ({share:.0%}, more "
                         f"than max_reject_fraction {cfg.max_reject_fraction:g}): {why}; see {_staged(cfg, REJECTS)}")
    return {key: summary[key] for key in ("num_records", "num_rejected", "num_skipped")} | {
        "num_classes": len(classes)}


def previous_version(storage: Storage, cfg: BuildConfig) -> str | None:
    """The newest published version (one with _SUCCESS) that sorts before ``cfg.version``."""
    if not (is_s3(cfg.dataset_uri) or os.path.isdir(cfg.dataset_uri)):
        return None
    published = {info.key.split("/")[0] for info in storage.iter_files(cfg.dataset_uri)
                 if info.key.count("/") == 1 and info.key.endswith("/" + SUCCESS)}
    earlier = [v for v in published if version_key(v) < version_key(cfg.version)]
    return max(earlier, key=version_key) if earlier else None


# -- 4. plan ----------------------------------------------------------------------------------------
def plan_stage(cfg: BuildConfig, storage: Storage, max_tasks: int = MAX_MAP_LENGTH) -> dict[str, Any]:
    """Decide the shards of each split and their members; returns the number of write tasks.

    Memory: 16 bytes per record (order keys and row numbers in arrays), besides one shard's rows.
    """
    import numpy as np

    summary = read_json(storage, _staged(cfg, SPLIT_SUMMARY))
    keys: dict[str, array[float]] = defaultdict(lambda: array("d"))
    numbers: dict[str, array[int]] = defaultdict(lambda: array("q"))
    with read_rows(storage, _staged(cfg, LABELS)) as rows:
        for number, row in enumerate(rows):
            keys[row["split"]].append(planning.order_key(cfg.salt, row["sha256"]))
            numbers[row["split"]].append(number)
    ranks = np.zeros(summary["num_records"], dtype=np.int64)  # row number -> rank in its split's order
    specs: dict[str, list[planning.ShardSpec]] = {}
    for split, info in summary["splits"].items():
        count = planning.shard_count(info["num_bytes"], info["num_records"], cfg.shard_size_mb)
        specs[split] = [planning.ShardSpec(split, i, count, cfg.compression) for i in range(count)]
        if split in keys:  # sort by (key, row number): a stable sort of rows listed in number order
            order = np.argsort(np.frombuffer(keys.pop(split), dtype=np.float64), kind="stable")
            ranks[np.frombuffer(numbers.pop(split), dtype=np.int64)[order]] = np.arange(len(order))
    with tempfile.TemporaryDirectory() as tmp:
        _write_members(cfg, storage, specs, ranks, tmp)
    shard_files = [spec.file for split in specs.values() for spec in split]
    tasks = planning.group_tasks(shard_files, max_tasks)
    plan = {"compression": cfg.compression, "shard_size_mb": cfg.shard_size_mb, "tasks": tasks,
            "splits": {split: [spec.file for spec in s] for split, s in specs.items()}}
    write_json(storage, _staged(cfg, PLAN), plan)
    return {"num_shards": len(shard_files), "num_tasks": len(tasks)}


def _write_members(cfg: BuildConfig, storage: Storage, specs: dict[str, list[planning.ShardSpec]],
                   ranks: Any, tmp: str) -> None:
    """Write each shard's member rows (labels.csv rows, in record order) to ``members/``.

    Records are dealt round-robin in rank order: rank r of a split with n shards goes to shard r % n.
    """
    buffers: dict[str, list[str]] = defaultdict(list)

    def flush() -> None:
        for shard, lines in buffers.items():
            with open(os.path.join(tmp, shard), "a", encoding="utf-8") as f:
                f.writelines(lines)
        buffers.clear()

    with read_rows(storage, _staged(cfg, LABELS)) as rows:
        for number, row in enumerate(rows):
            split_specs = specs[row["split"]]
            rank = int(ranks[number])
            buffers[split_specs[rank % len(split_specs)].file].append(json.dumps([rank, row]) + "\n")
            if number % 5_000 == 4_999:
                flush()
    flush()
    for shard in sorted(os.listdir(tmp)):
        with open(os.path.join(tmp, shard), encoding="utf-8") as f:
            members = sorted(json.loads(line) for line in f)  # one shard's rows: bounded by the shard size
        with RowWriter(storage, _staged(cfg, "members", shard + ".csv"), LABELS_FIELDS) as out:
            for _, row in members:
                out.write(row)


# -- 5. write shards --------------------------------------------------------------------------------
def task_shards(cfg: BuildConfig, storage: Storage, task_index: int) -> list[str]:
    """The shard files that write task ``task_index`` produces."""
    return read_json(storage, _staged(cfg, PLAN))["tasks"][task_index]


def write_task(cfg: BuildConfig, storage: Storage, task_index: int, progress: Progress = _no_progress,
               read_workers: int = 4) -> list[dict[str, Any]]:
    """Write every shard of one write task; returns their receipts."""
    return [write_shard(cfg, storage, shard, progress, read_workers)
            for shard in task_shards(cfg, storage, task_index)]


def write_shard(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress = _no_progress,
                read_workers: int = 4) -> dict[str, Any]:
    """Write one shard from its member list and stage it whole; skip if already staged identically."""
    members_uri = _staged(cfg, "members", shard + ".csv")
    receipt_uri = _staged(cfg, "receipts", shard + ".json")
    members_sha = hashlib.sha256(storage.read_bytes(members_uri)).hexdigest()
    if storage.exists(receipt_uri):
        receipt = read_json(storage, receipt_uri)
        if receipt.get("members_sha256") == members_sha and \
                storage.sha256_of(_staged(cfg, "shards", shard)) == receipt["sha256"]:
            progress(receipt["num_records"])
            return receipt

    def fetch(row: dict[str, str]) -> tuple[dict[str, str], bytes]:
        try:
            return row, read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
        except RejectedImage as exc:
            raise BuildError(f"{row['filename']} changed since it was inspected ({exc}); rerun the build") from None

    with tempfile.TemporaryDirectory(dir=_local_dir(_staged(cfg, "shards")), prefix=TMP_PREFIX) as tmp:
        path = os.path.join(tmp, shard)
        with read_rows(storage, members_uri) as rows, open(path, "wb") as file, \
                TFRecordWriter(raw := HashingWriter(file), cfg.compression) as writer:
            for row, data in ordered_map(fetch, rows, read_workers):
                if hashlib.sha256(data).hexdigest() != row["sha256"]:
                    raise BuildError(f"{row['filename']} changed since it was inspected; rerun the build")
                try:
                    encoded = stored_bytes(data, row, cfg.max_pixels)
                except (ValueError, RejectedImage) as exc:
                    raise BuildError(f"{row['filename']}: {exc}") from exc
                writer.write(encode_example(example_features(row, encoded)))
                progress(1)
        receipt = {"file": shard, "num_records": writer.num_records, "num_bytes": raw.num_bytes,
                   "sha256": raw.sha256.hexdigest(), "members_sha256": members_sha}
        storage.upload(path, _staged(cfg, "shards", shard), receipt["sha256"])
    write_json(storage, receipt_uri, receipt)
    return receipt


def _local_dir(uri: str) -> str | None:
    """For a local staging folder, the folder itself (made if needed), so finished files are hard-linked
    into place rather than copied; None (the system's temp dir) for S3."""
    if is_s3(uri):
        return None
    os.makedirs(uri, exist_ok=True)
    return uri


# -- 6. validate ------------------------------------------------------------------------------------
def _name_hash(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:16], "big")


def _set_digest(names: Iterator[str]) -> str:
    """An order-independent digest of a multiset of names (sum of their hashes mod 2^128)."""
    return f"{sum(map(_name_hash, names)) % 2**128:032x}"


def validate_shard(cfg: BuildConfig, storage: Storage, shard: str,
                   progress: Progress = _no_progress) -> dict[str, Any]:
    """Re-read a staged shard: CRCs, every record parses with the schema, and matches its plan."""
    uri = _staged(cfg, "shards", shard)
    with read_rows(storage, _staged(cfg, "members", shard + ".csv")) as rows:
        members = list(rows)  # one shard's rows: bounded by the shard size
    count = 0
    try:
        with storage.open_read(uri) as stream:
            raw = HashingReader(stream)
            try:
                for count, record in enumerate(read_records(raw, cfg.compression), start=1):  # type: ignore[arg-type]
                    if count > len(members):
                        raise BuildError(f"shard {shard} holds more records than the {len(members)} planned")
                    _check_record(shard, count - 1, record, members[count - 1])
                    progress(1)
            except CorruptRecordError as exc:
                raise BuildError(f"shard {shard} is corrupt: {exc}") from exc
            raw.drain()
    except FileNotFoundError:
        raise BuildError(f"shard {shard} is missing from staging") from None
    sha, num_bytes = raw.sha256.hexdigest(), raw.num_bytes
    if count != len(members):
        raise BuildError(f"shard {shard} holds {count} records, the plan says {len(members)}")
    receipt = read_json(storage, _staged(cfg, "receipts", shard + ".json"))
    if receipt["sha256"] != sha:
        raise BuildError(f"shard {shard} changed after it was written (sha256 {sha} != {receipt['sha256']})")
    return {"file": shard, "num_records": count, "num_bytes": num_bytes, "sha256": sha,
            "names": _set_digest(m["filename"] for m in members)}


def _check_record(shard: str, index: int, record: bytes, member: dict[str, str]) -> None:
    where = f"shard {shard} record {index}"
    try:
        example = decode_example(record)
    except (ValueError, KeyError, IndexError) as exc:
        raise BuildError(f"{where} does not parse as a tf.train.Example: {exc}") from exc
    if set(example) != set(FEATURES):
        raise BuildError(f"{where} has keys {sorted(example)}, expected {sorted(FEATURES)}")
    expected = example_features(member, b"")
    for key, dtype in FEATURES.items():
        values = example[key]
        kind = bytes if dtype == "string" else int
        if len(values) != 1 or not isinstance(values[0], kind):
            raise BuildError(f"{where}: {key} is not one {dtype}")
        if key != "image/encoded" and values[0] != expected[key]:
            raise BuildError(f"{where}: {key} is {values[0]!r}, the plan says {expected[key]!r}")
    if hashlib.sha256(example["image/encoded"][0]).hexdigest() != member["encoded_sha256"]:  # type: ignore[arg-type]
        raise BuildError(f"{where}: image bytes do not match what inspection recorded")


def _check_no_content_in_two_splits(cfg: BuildConfig, storage: Storage, contents: dict[str, array[int]]) -> None:
    """Raise BuildError if any image content is in two splits (8 bytes of memory per record)."""
    import numpy as np

    seen = {split: np.unique(np.frombuffer(prefixes, dtype=np.uint64)) for split, prefixes in contents.items()}
    names = sorted(seen)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = np.intersect1d(seen[first], seen[second], assume_unique=True)
            if not len(shared):
                continue
            shared_set = {int(p) for p in shared[:100]}
            with read_rows(storage, _staged(cfg, LABELS)) as rows:
                where = {r["split"]: r["filename"] for r in rows if int(r["sha256"][:16], 16) in shared_set}
            if len(where) > 1:  # not only a collision of 64-bit prefixes
                raise BuildError(f"identical image content in splits {first} and {second} "
                                 f"({where.get(first)}, {where.get(second)})")


def validate_stage(cfg: BuildConfig, storage: Storage, results: list[dict[str, Any]] | None = None,
                   progress: Progress = _no_progress) -> dict[str, Any]:
    """Check every staged shard against the plan and labels.csv, then stage dataset_info.json.

    ``results`` are ``validate_shard`` outputs computed elsewhere (in parallel); missing ones are
    computed here.
    """
    plan = read_json(storage, _staged(cfg, PLAN))
    summary = read_json(storage, _staged(cfg, SPLIT_SUMMARY))
    by_file = {r["file"]: r for r in results or []}
    counts: Counter[str] = Counter()
    digests: Counter[str] = Counter()  # per split: sum of name hashes, as _set_digest
    contents: dict[str, array[int]] = defaultdict(lambda: array("Q"))  # per split: 64-bit sha256 prefixes
    with read_rows(storage, _staged(cfg, LABELS)) as rows:
        for row in rows:
            counts[row["split"]] += 1
            digests[row["split"]] += _name_hash(row["filename"])
            contents[row["split"]].append(int(row["sha256"][:16], 16))
    _check_no_content_in_two_splits(cfg, storage, contents)
    splits: dict[str, Any] = {}
    for split, shard_files in plan["splits"].items():
        shards = [by_file.get(f) or validate_shard(cfg, storage, f, progress) for f in shard_files]
        total = sum(s["num_records"] for s in shards)
        expected = summary["splits"][split]["num_records"]
        if total != expected or total != counts[split]:
            raise BuildError(f"split {split} holds {total} records, labels.csv says {expected}")
        if sum(int(s["names"], 16) for s in shards) % 2**128 != digests[split] % 2**128:
            raise BuildError(f"split {split}: the records in its shards are not the ones labels.csv lists")
        splits[split] = {"num_records": total, "shards": [
            {key: s[key] for key in ("file", "num_records", "num_bytes", "sha256")} for s in shards]}
    manifest = {
        "dataset": cfg.dataset, "version": cfg.version, "num_records": summary["num_records"],
        "num_rejected": summary["num_rejected"], "num_skipped": summary["num_skipped"],
        "skipped_by_kind": summary.get("skipped_by_kind", {}), "rejects_by_reason": summary["rejects_by_reason"],
        "classes": summary["classes"],
        "previous_version": summary["previous_version"], "source_fingerprint": summary["source_fingerprint"],
        "as_of": cfg.as_of,
        "compression": cfg.compression, "features": feature_spec(), "splits": splits,
        "source": cfg.source, "params": {"splits": cfg.splits, "salt": cfg.salt,
                                         "shard_size_mb": cfg.shard_size_mb, "max_file_mb": cfg.max_file_mb,
                                         "max_pixels": cfg.max_pixels},
    }
    write_json(storage, _staged(cfg, MANIFEST), manifest)
    return {"num_records": manifest["num_records"], "num_shards": sum(len(s["shards"]) for s in splits.values())}


# -- 7. dataset card -------------------------------------------------------------------------------
def _rows(storage: Storage, uri: str) -> Callable[[], Iterator[dict[str, str]]]:
    """A callable giving a fresh iterator over the CSV rows at ``uri`` each time."""
    def rows() -> Iterator[dict[str, str]]:
        with read_rows(storage, uri) as it:
            yield from it
    return rows


def card_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Render the dataset card (card.md, card.html, card/*.png) of the validated build into staging."""
    from .card import PreviousVersion, build_card

    manifest = read_json(storage, _staged(cfg, MANIFEST))
    previous = None
    if manifest["previous_version"]:
        earlier = join(cfg.dataset_uri, manifest["previous_version"])
        previous = PreviousVersion(read_json(storage, join(earlier, MANIFEST)), _rows(storage, join(earlier, LABELS)))

    def fetch_image(row: dict[str, str]) -> bytes | None:
        """The record's image bytes, from the source (None if it changed or vanished since the build)."""
        try:
            data = read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
            if hashlib.sha256(data).hexdigest() != row["sha256"]:
                return None
            return stored_bytes(data, row, cfg.max_pixels)
        except (RejectedImage, ValueError):
            return None

    files = build_card(manifest, _rows(storage, _staged(cfg, LABELS)), _rows(storage, _staged(cfg, REJECTS)),
                       previous, fetch_image)
    for name in sorted(files):
        storage.write_bytes(_staged(cfg, CARD, name), files[name])
    write_json(storage, _staged(cfg, CARD_INDEX), sorted(files))
    return {"files": len(files), "bytes": sum(map(len, files.values()))}


# -- 8. publish -------------------------------------------------------------------------------------
def version_key(version: str) -> list[Any]:
    """Natural sort key: ``v2 < v10``; timestamps sort chronologically."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", version)]


def publish_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Copy the validated build to ``DEST/DATASET/VERSION/``, then ``_SUCCESS``, then ``latest.json``."""
    final = cfg.version_uri
    staged_manifest = _staged(cfg, MANIFEST)
    if storage.exists(join(final, SUCCESS)):
        if not storage.exists(staged_manifest):  # already published and cleaned up: a rerun
            manifest = read_json(storage, join(final, MANIFEST))
            return _finish(cfg, storage, manifest, already=True)
        if storage.read_bytes(join(final, MANIFEST)) != storage.read_bytes(staged_manifest):
            raise BuildError(f"version {cfg.version} is already published at {final} with different "
                             "content; published versions are immutable, so pick another version")
        return _finish(cfg, storage, read_json(storage, staged_manifest), already=True)
    manifest = read_json(storage, staged_manifest)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            storage.copy(_staged(cfg, "shards", shard["file"]), join(final, shard["file"]), shard["sha256"])
    for name in read_json(storage, _staged(cfg, CARD_INDEX)):
        storage.copy(_staged(cfg, CARD, name), join(final, name))
    for name in (LABELS, REJECTS, MANIFEST):
        storage.copy(_staged(cfg, name), join(final, name))
    manifest_sha = hashlib.sha256(storage.read_bytes(join(final, MANIFEST))).hexdigest()
    storage.write_bytes(join(final, SUCCESS), (manifest_sha + "\n").encode())
    return _finish(cfg, storage, manifest, already=False)


def _finish(cfg: BuildConfig, storage: Storage, manifest: dict[str, Any], already: bool) -> dict[str, Any]:
    latest = update_latest(storage, cfg.dataset_uri, cfg.version)
    storage.delete_tree(cfg.staging_uri)
    if not is_s3(cfg.staging_uri):  # drop the local _staging/ folder once no build uses it
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(cfg.staging_uri))
    return {"uri": cfg.version_uri, "version": cfg.version, "num_records": manifest["num_records"],
            "num_rejected": manifest["num_rejected"], "latest": latest, "already_published": already,
            "splits": {name: s["num_records"] for name, s in manifest["splits"].items()}}


def update_latest(storage: Storage, dataset_uri: str, version: str, attempts: int = 20) -> str:
    """Point ``latest.json`` at ``version`` unless it already names a newer one; returns its version."""
    uri = join(dataset_uri, LATEST)
    for _ in range(attempts):
        data, tag = storage.read_with_tag(uri)
        current = json.loads(data)["version"] if data else None
        if current is not None and version_key(current) >= version_key(version):
            return current
        if storage.write_if_unchanged(uri, (json.dumps({"version": version}) + "\n").encode(), tag):
            return version
    raise StoreBusy(f"{uri} kept changing while it was being updated")
