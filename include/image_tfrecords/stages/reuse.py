"""Stage 5a: copy the previous version's shards that this version keeps whole into staging.

Copies are server-side on S3 (``CopyObject``, its SHA-256 computed by the store and compared with
the previous manifest's) and hard links locally (hashed, and compared the same way), a few at a
time on threads: no shard's bytes pass through this worker's memory. Each copy's check is staged
like a written shard's, so the validate stage adds it up with the others. A base shard that is
missing or damaged never propagates: that shard is written from the source instead (its check
says why).
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError
from ..parallel import ordered_map
from ..progress import ProgressLog, log, summarized
from ..published import layout
from ..shards.checks import members_digest, validate_shard
from ..shards.writer import write_shard
from ..staging import CHECKED, COPY_THREADS, MEMBERS, PLAN, RECEIPTS, SHARDS, Progress, no_progress, staged
from ..storage import Storage, join
from ..storage.documents import read_json, write_json


@summarized
def reuse_stage(cfg: BuildConfig, storage: Storage, progress: Progress = no_progress,
                threads: int = COPY_THREADS) -> dict[str, Any]:
    """Copy and check every reused shard of the plan; returns how many and their bytes."""
    reuse = read_json(storage, staged(cfg, PLAN))["reuse"]
    storage.prime(cfg.staging_uri)
    with ProgressLog("reuse", len(reuse), "shards") as copied:
        results = []
        for result in ordered_map(lambda item: reuse_shard(cfg, storage, *item, progress=progress),
                                  sorted(reuse.items()), threads):
            results.append(result)
            copied(1)
    return {"reused": len(results), "num_records": sum(r["num_records"] for r in results),
            "num_bytes": sum(r["num_bytes"] for r in results)}


def reuse_shard(cfg: BuildConfig, storage: Storage, shard: str, origin: dict[str, Any],
                progress: Progress = no_progress) -> dict[str, Any]:
    """Copy one shard of a previous version (and its ``.tfindex``) to ``shard`` in staging; check both
    against the previous manifest, and the members planned for it; stage its receipt and check."""
    old = join(cfg.dataset_uri, origin["version"], origin["file"])
    new = staged(cfg, SHARDS, shard)
    why = ""
    try:
        storage.copy(old, new)
        storage.copy(layout.index_file(old), layout.index_file(new))
    except FileNotFoundError:
        why = f"{old} (or its {layout.INDEX_SUFFIX}) is missing"
    if not why and (held := storage.sha256_of(new)) != origin["sha256"]:
        why = f"{old} is damaged: it hashes to {held}, not to the sha256 its version's manifest gives"
    index_sha = storage.sha256_of(layout.index_file(new))
    if not why and origin.get("index_sha256") and index_sha != origin["index_sha256"]:
        why = f"{layout.index_file(old)} is damaged: it is not the one version {origin['version']} published"
    if why:  # a damaged base never propagates: this shard's records come from the source
        log.warning("%s: shard %s is written from the source instead", why, shard)
        storage.delete(new)
        write_shard(cfg, storage, shard, progress, fallback=why)
        return validate_shard(cfg, storage, shard)
    members = storage.read_bytes(staged(cfg, MEMBERS, shard + ".csv"))  # bounded by the shard size
    names, count = members_digest(members)
    if count != origin["num_records"]:
        raise BuildError(f"{old} holds {origin['num_records']} records, the plan keeps {count} of them")
    members_sha = hashlib.sha256(members).hexdigest()
    source = {"version": origin["version"], "file": origin["file"]}
    common = {"file": shard, "num_records": count, "num_bytes": origin["num_bytes"], "sha256": origin["sha256"],
              "members_sha256": members_sha, "index_sha256": index_sha, "reused_from": source}
    write_json(storage, staged(cfg, RECEIPTS, shard + ".json"), common)
    result = {**common, "names": names, "source_bytes": 0, "change_tag": storage.change_tag(new),
              "records_parsed": 0, "bytes_copied": origin["num_bytes"]}
    write_json(storage, staged(cfg, CHECKED, shard + ".json"), result)
    progress(count)
    return result
