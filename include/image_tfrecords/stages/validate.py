"""Stage 6: check every staged shard against the plan and labels.csv; stage the manifest.

Write tasks check each shard right after writing it (``shards.checks.validate_shard``, which stages
its result). ``validate_stage`` then adds the per-shard results up (checking again any shard not
checked yet, or changed since): counts per split, the set of file names per split, and no image
content in two splits.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError
from ..progress import summarized
from ..published.manifest import FORMAT_VERSION, Manifest
from ..rules.base_version import INSPECTOR
from ..rules.splits import hex_prefixes
from ..shards.checks import validate_shard
from ..staging import (
    CHECKED,
    DISCOVER_SUMMARY,
    INSPECT_SUMMARY,
    INSPECTED,
    LABELS,
    MANIFEST,
    MEMBERS,
    PLAN,
    RECEIPTS,
    SHARDS,
    SPLIT_SUMMARY,
    Progress,
    no_progress,
    staged,
    staged_schema,
)
from ..storage import Storage
from ..storage.documents import read_json, read_rows, write_json
from ..storage.tables import polars, read_table


def _check_no_content_in_two_splits(cfg: BuildConfig, storage: Storage, contents: dict[str, Any]) -> None:
    """Raise BuildError if any image content is in two splits (``contents``: per split, its records' 64-bit
    SHA-256 prefixes, a numpy array; 8 bytes of memory per record)."""
    import numpy as np

    seen = {split: np.unique(prefixes) for split, prefixes in contents.items()}
    names = sorted(seen)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = np.intersect1d(seen[first], seen[second], assume_unique=True)
            if not len(shared):
                continue
            shared_set = {int(p) for p in shared[:100]}
            with read_rows(storage, staged(cfg, LABELS)) as rows:
                where = {r["split"]: r["filename"] for r in rows if int(r["sha256"][:16], 16) in shared_set}
            if len(where) > 1:  # not only a collision of 64-bit prefixes
                raise BuildError(f"identical image content in splits {first} and {second} "
                                 f"({where.get(first)}, {where.get(second)})")


def _checked(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress) -> dict[str, Any]:
    """The staged result of ``validate_shard`` if it checked the shard as it is now against the members
    planned now; else a fresh check."""
    try:
        result = read_json(storage, staged(cfg, CHECKED, shard + ".json"))
        receipt = read_json(storage, staged(cfg, RECEIPTS, shard + ".json"))
        members = hashlib.sha256(storage.read_bytes(staged(cfg, MEMBERS, shard + ".csv"))).hexdigest()
    except FileNotFoundError:
        return validate_shard(cfg, storage, shard, progress)
    current = storage.change_tag(staged(cfg, SHARDS, shard))  # None if it is missing
    if not (current is not None and result.get("change_tag") == current  # not rewritten or damaged since
            and result.get("sha256") == receipt.get("sha256")
            and result.get("members_sha256") == receipt.get("members_sha256") == members):  # nor replanned
        return validate_shard(cfg, storage, shard, progress)
    progress(result["num_records"])
    return result


def _manifest_entry(shard: dict[str, Any]) -> dict[str, Any]:
    """A shard's entry in the manifest: its file, counts and checksums, and where a reused or rewritten
    one came from."""
    entry = {key: shard[key] for key in ("file", "num_records", "num_bytes", "sha256", "index_sha256")}
    for key in ("reused_from", "rewritten_from"):
        if key in shard:
            entry[key] = shard[key]
    return entry


def _build_facts(plan: dict[str, Any], inspected: dict[str, Any], shards: list[dict[str, Any]],
                 damaged: list[str]) -> dict[str, Any]:
    """The manifest's ``build``: how this version was made from the source and the previous version
    (``damaged``: the newer published versions passed over as damaged)."""
    return {
        **plan["build"], "inspector": INSPECTOR, "record_positions": True,
        "files_inspected": inspected["files_read"], "inspections_reused": inspected["files_reused"],
        "shards_reused": sum("reused_from" in s for s in shards),
        "shards_rewritten": sum("rewritten_from" in s for s in shards),
        "shards_written": sum("reused_from" not in s and "rewritten_from" not in s for s in shards),
        "source_bytes_read": inspected["bytes_read"] + sum(s.get("source_bytes", 0) for s in shards),
        "shards_spliced": sum("bytes_copied" in s and "rewritten_from" in s for s in shards),
        "records_parsed": sum(s.get("records_parsed", 0) for s in shards),
        "base_bytes_read": sum(s.get("base_bytes_read", 0) for s in shards),  # base shards read (hashed) by workers
        "bytes_kept": sum(s.get("bytes_kept", 0) for s in shards),  # kept records' bytes spliced from base shards
        "bytes_copied": sum(s.get("bytes_copied", 0) for s in shards),  # by the kernel or the store, not a worker
        "bytes_written": sum(s.get("bytes_written", 0) for s in shards),  # shard bytes a worker wrote
        "shards_from_source_after_damage": [s["file"] for s in shards if s.get("fallback")],
        "inspections_not_reused_because": inspected.get("not_reused_because", ""),
        "damaged_versions": damaged,
    }


def _label_columns(cfg: BuildConfig, storage: Storage) -> tuple[Counter[str], Counter[str], dict[str, Any]]:
    """Per split of labels.csv: its records, the sum of their name hashes (as ``set_digest``) and their contents'
    64-bit SHA-256 prefixes (a numpy uint64 array, in the table's order). One pass over the table as polars
    columns, whatever its names hold. A damaged table: ``BuildError`` (``read_table``), ``KeyError`` for a missing
    column, ``ValueError`` for a sha256 that is not hex digits."""
    pl = polars()

    uri = staged(cfg, LABELS)
    table = read_table(storage, uri)
    for column in ("filename", "split", "sha256"):
        if column not in table.columns:
            raise KeyError(column)
    prefixes = hex_prefixes(table["sha256"])
    if prefixes.null_count():
        at = int(prefixes.is_null().arg_true()[0])
        raise ValueError(f"{uri}: the sha256 of {table['filename'][at]!r} is not hex digits: {table['sha256'][at]!r}")
    table = table.select(pl.col("filename", "split").fill_null(""), prefixes.alias("prefix"))
    counts: Counter[str] = Counter()
    digests: Counter[str] = Counter()
    contents: dict[str, Any] = {}
    for (split,), part in table.group_by("split", maintain_order=True):  # (each split's rows in the table's order)
        counts[split] = part.height
        digests[split] = _name_hash_sum(part["filename"].cast(pl.Binary).to_list())
        contents[split] = part["prefix"].to_numpy()
    return counts, digests, contents


def _name_hash_sum(names: list[bytes]) -> int:
    """The sum of ``name_hash`` of each of ``names`` (UTF-8), taken as four 32-bit columns."""
    import numpy as np

    if not names:
        return 0
    sha256 = hashlib.sha256
    words = np.frombuffer(b"".join([sha256(n).digest() for n in names]), dtype=">u4").reshape(-1, 8)[:, :4]
    sums = words.sum(axis=0, dtype=np.uint64).tolist()
    return sum(int(total) << (32 * (3 - k)) for k, total in enumerate(sums))


@summarized
def validate_stage(cfg: BuildConfig, storage: Storage, progress: Progress = no_progress) -> dict[str, Any]:
    """Add up the per-shard checks (checking any shard not checked yet) and stage ``manifest.json``."""
    plan = read_json(storage, staged(cfg, PLAN))
    summary = read_json(storage, staged(cfg, SPLIT_SUMMARY))
    counts, digests, contents = _label_columns(cfg, storage)
    _check_no_content_in_two_splits(cfg, storage, contents)
    splits: dict[str, Any] = {}
    checked: list[dict[str, Any]] = []
    for split, shard_files in plan["splits"].items():
        shards = [_checked(cfg, storage, f, progress) for f in shard_files]
        total = sum(s["num_records"] for s in shards)
        expected = summary["splits"][split]["num_records"]
        if total != expected or total != counts[split]:
            raise BuildError(f"split {split} holds {total} records, labels.csv says {expected}")
        if sum(int(s["names"], 16) for s in shards) % 2**128 != digests[split] % 2**128:
            raise BuildError(f"split {split}: the records in its shards are not the ones labels.csv lists")
        splits[split] = {"num_records": total, "shards": [_manifest_entry(s) for s in shards]}
        checked += shards
    manifest = {
        "format_version": FORMAT_VERSION,
        "dataset": cfg.dataset, "version": cfg.version, "num_records": summary["num_records"],
        "num_rejected": summary["num_rejected"], "num_skipped": summary["num_skipped"],
        "skipped_by_kind": summary.get("skipped_by_kind", {}), "rejects_by_reason": summary["rejects_by_reason"],
        "classes": summary["classes"],
        "previous_version": summary["previous_version"], "source_fingerprint": summary["source_fingerprint"],
        "as_of": cfg.as_of,
        "compression": cfg.compression, "features": staged_schema(cfg, storage).features(), "splits": splits,
        "image": cfg.image_options.describe(), "multi_label": bool(summary.get("multi_label")),
        "label_separator": cfg.label_separator, "columns": dict(cfg.columns),
        "labels_sha256": storage.sha256_of(staged(cfg, LABELS)),  # the next night trusts its places only so
        "inspected_sha256": storage.sha256_of(staged(cfg, INSPECTED)),  # and the inspections it takes over
        "build": _build_facts(plan, read_json(storage, staged(cfg, INSPECT_SUMMARY)), checked,
                              read_json(storage, staged(cfg, DISCOVER_SUMMARY)).get("damaged_versions", []))
        | {"near_duplicates": summary.get("near_duplicates", {}), "quality_flags": summary.get("quality_flags", {})},
        "source": cfg.source, "params": {"splits": cfg.splits, "salt": cfg.salt, "group_column": cfg.group_column,
                                         "shard_size_mb": cfg.shard_size_mb, "max_file_mb": cfg.max_file_mb,
                                         "max_pixels": cfg.max_pixels, **cfg.image_options.describe(),
                                         "columns": dict(cfg.columns), "label_separator": cfg.label_separator,
                                         "modern_formats": cfg.modern_formats,
                                         "near_duplicate_bits": cfg.near_duplicate_bits,
                                         "near_duplicate_labels": cfg.near_duplicate_labels,
                                         "quality_reject": cfg.quality_reject},
    }
    written = Manifest.parse(manifest, staged(cfg, MANIFEST))  # what every reader will parse, checked here
    write_json(storage, staged(cfg, MANIFEST), written.to_json())
    return {"num_records": written.num_records, "num_shards": len(written.shard_files)}
