"""Stage 8: publish the validated build atomically: files, then ``_SUCCESS``, then ``latest.json``."""

from __future__ import annotations

import hashlib
from typing import Any

from .. import layout
from ..config import BuildConfig
from ..documents import read_json
from ..errors import BuildError
from ..parallel import ordered_map
from ..progress import ProgressLog, summarized
from ..storage import Storage, join
from ..tfds_metadata import tfds_metadata_files
from .reuse import COPY_THREADS
from .staging import CARD, CARD_INDEX, INSPECTED, LABELS, MANIFEST, REJECTS, SHARDS, staged


@summarized
def publish_stage(cfg: BuildConfig, storage: Storage, threads: int = COPY_THREADS) -> dict[str, Any]:
    """Copy the validated build to ``DEST/DATASET/VERSION/``: shards and their ``.tfindex`` files, the
    card, labels.csv, rejects.csv, inspected.csv, TFDS's metadata, ``manifest.json``; then ``_SUCCESS`` (the manifest's
    SHA-256), then move ``latest.json`` forward. Rerunning it after success changes nothing.

    The copies run on ``threads`` threads (server-side ``CopyObject`` on S3, hard links or copies locally).
    """
    final = cfg.version_uri
    staged_manifest = staged(cfg, MANIFEST)
    if storage.exists(join(final, layout.SUCCESS)):
        if not storage.exists(staged_manifest):  # already published and cleaned up: a rerun
            return _finish(cfg, storage, layout.read_manifest(storage, final), already=True)
        published = layout.manifest_uri(storage, final)
        if published is None or storage.read_bytes(published) != storage.read_bytes(staged_manifest):
            raise BuildError(f"version {cfg.version} is already published at {final} with different "
                             "content; published versions are immutable, so pick another version")
        return _finish(cfg, storage, read_json(storage, staged_manifest), already=True)
    manifest = read_json(storage, staged_manifest)
    copies: list[tuple[str, str, str | None]] = []  # (staged, published, sha256 to check or None)
    for split in manifest["splits"].values():
        for shard in split["shards"]:
            copies.append((staged(cfg, SHARDS, shard["file"]), join(final, shard["file"]), shard["sha256"]))
            index = layout.index_file(shard["file"])
            copies.append((staged(cfg, SHARDS, index), join(final, index), None))
    card_files = read_json(storage, staged(cfg, CARD_INDEX))
    copies += [(staged(cfg, CARD, name), join(final, name), None) for name in card_files]
    copies += [(staged(cfg, name), join(final, name), None) for name in (LABELS, REJECTS, INSPECTED)]
    with ProgressLog(f"publish {cfg.version}", len(copies), "files") as done:  # nothing is visible until _SUCCESS
        for _ in ordered_map(lambda copy: storage.copy(*copy), copies, threads):
            done(1)
    for name, data in sorted(tfds_metadata_files(manifest).items()):
        storage.write_bytes(join(final, name), data)
    storage.copy(staged_manifest, join(final, layout.MANIFEST))
    manifest_sha = hashlib.sha256(storage.read_bytes(join(final, layout.MANIFEST))).hexdigest()
    storage.write_bytes(join(final, layout.SUCCESS), (manifest_sha + "\n").encode())
    return _finish(cfg, storage, manifest, already=False)


def _finish(cfg: BuildConfig, storage: Storage, manifest: dict[str, Any], already: bool) -> dict[str, Any]:
    latest = layout.update_latest(storage, cfg.dataset_uri, cfg.version)
    storage.delete_tree(cfg.staging_uri)
    storage.prune(join(cfg.dataset_uri, layout.STAGING))  # the _staging/ folder, once no build uses it
    return {"uri": cfg.version_uri, "version": cfg.version, "num_records": manifest["num_records"],
            "num_rejected": manifest["num_rejected"], "latest": latest, "already_published": already,
            "splits": {name: s["num_records"] for name, s in manifest["splits"].items()}}
