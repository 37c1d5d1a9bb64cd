"""Stage 3: resolve duplicates, assign class ids and splits; stage labels.csv and rejects.csv."""

from __future__ import annotations

from collections import Counter
from typing import Any

from .. import layout
from ..config import BuildConfig
from ..documents import RowWriter, read_json, read_rows, write_json
from ..errors import BuildError
from ..manifest import RECORD_FIELDS, REJECTS_FIELDS
from ..progress import summarized
from ..splitting import DuplicateResolver, assign_split
from ..storage import Storage, join
from .staging import (
    DISCOVER_REJECTS,
    DISCOVER_SUMMARY,
    IMAGES,
    INSPECT_REJECTS,
    RECORDS,
    REJECTS,
    SPLIT_SUMMARY,
    staged,
)


@summarized
def split_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Stage the records (labels.csv's rows, with class id and split; plan adds the shard) and rejects.csv.

    Class ids never change once given: the previous version's classes keep theirs, new ones are
    appended in sorted order. Fails before anything is written to the shards when nothing is left,
    or when more than ``max_reject_fraction`` of the files were rejected.
    """
    inspected = staged(cfg, IMAGES)
    with read_rows(storage, inspected) as rows:  # plain lists, not dicts: both passes run over every image
        col = {name: i for i, name in enumerate(rows.fieldnames or ())}
        name, label, sha = col["filename"], col["label"], col["sha256"]
        resolver = DuplicateResolver((v[name], v[label], v[sha]) for v in rows.reader)
    found = read_json(storage, staged(cfg, DISCOVER_SUMMARY))
    previous = found["previous_version"]
    known = layout.read_manifest(storage, join(cfg.dataset_uri, previous))["classes"] if previous else []
    classes = known + sorted(resolver.kept_labels() - set(known))
    class_ids = {name: i for i, name in enumerate(classes)}
    per_split: dict[str, Counter[str]] = {name: Counter() for name in cfg.splits}
    reasons: Counter[str] = Counter()
    with RowWriter(storage, staged(cfg, RECORDS), RECORD_FIELDS) as labels, \
            RowWriter(storage, staged(cfg, REJECTS), REJECTS_FIELDS) as rejects:
        for earlier in (DISCOVER_REJECTS, INSPECT_REJECTS):
            with read_rows(storage, staged(cfg, earlier)) as rows:
                for row in rows:
                    rejects.write(row)
                    reasons[row["reason"]] += 1
        with read_rows(storage, inspected) as rows:
            if {name: i for i, name in enumerate(rows.fieldnames or ())} != col:  # (reads the header)
                raise BuildError(f"{inspected} changed while it was read")
            take = [col.get(field, -1) for field in RECORD_FIELDS]  # -1: label_id and split, set below
            label_id, split_at, size = RECORD_FIELDS.index("label_id"), RECORD_FIELDS.index("split"), \
                col["encoded_bytes"]
            for values in rows.reader:
                verdict = resolver.verdict(values[name], values[sha])
                if verdict:
                    rejects.write({"filename": values[name], "reason": verdict[0], "detail": verdict[1]})
                    reasons[verdict[0]] += 1
                    continue
                split = assign_split(values[sha], cfg.salt, cfg.splits)
                record = [values[i] if i >= 0 else "" for i in take]
                record[label_id], record[split_at] = class_ids[values[label]], split
                labels.write_values(record)
                per_split[split]["records"] += 1
                per_split[split]["bytes"] += int(values[size])
    summary = {"classes": classes, "previous_version": previous, "source_fingerprint": found["fingerprint"],
               "num_records": labels.count, "num_rejected": rejects.count, "num_skipped": found["skipped"],
               "skipped_by_kind": found.get("skipped_by_kind", {}),
               "rejects_by_reason": dict(sorted(reasons.items())),
               "splits": {name: {"num_records": c["records"], "num_bytes": c["bytes"]}
                          for name, c in per_split.items()}}
    write_json(storage, staged(cfg, SPLIT_SUMMARY), summary)
    why = ", ".join(f"{k}: {v}" for k, v in sorted(reasons.items()))
    if not labels.count:
        raise BuildError(f"no valid images to publish: all {rejects.count} files were rejected ({why})")
    share = rejects.count / (labels.count + rejects.count)
    if share > cfg.max_reject_fraction:
        raise BuildError(f"{rejects.count} of {labels.count + rejects.count} files rejected ({share:.0%}, more "
                         f"than max_reject_fraction {cfg.max_reject_fraction:g}): {why}; see {staged(cfg, REJECTS)}")
    return {key: summary[key] for key in ("num_records", "num_rejected", "num_skipped")} | {
        "num_classes": len(classes)}
