"""Stage 9: publish the validated build atomically: files, then ``_SUCCESS``, then ``latest.json``."""

from __future__ import annotations

import hashlib
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError, GateTripped
from ..parallel import ordered_map
from ..progress import ProgressLog, log, summarized
from ..published import layout
from ..published.manifest import Manifest
from ..records.tfds_metadata import tfds_metadata_files
from ..rules.publish_gate import TRIPPED
from ..staging import (
    CARD,
    CARD_INDEX,
    COPY_THREADS,
    INSPECTED,
    LABELS,
    MANIFEST,
    NEAR_DUPLICATES,
    REJECTS,
    SHARDS,
    staged,
)
from ..storage import Storage, join
from ..storage.documents import read_json


@summarized
def publish_stage(cfg: BuildConfig, storage: Storage, threads: int = COPY_THREADS) -> dict[str, Any]:
    """Copy the validated build to ``DEST/DATASET/VERSION/``: shards and their ``.tfindex`` files, the
    card, labels.csv, rejects.csv, inspected.csv; write the files made from the staged manifest (TFDS's
    metadata, labels.txt: ``manifest_files``); then ``manifest.json``; remove whatever else
    the folder holds (what an interrupted earlier attempt at this version left); then ``_SUCCESS`` (the
    manifest's SHA-256), then move ``latest.json`` forward. Rerunning it after success changes nothing.

    The copies run on ``threads`` threads (server-side ``CopyObject`` on S3, hard links or copies locally).
    """
    final = cfg.version_uri
    staged_manifest = staged(cfg, MANIFEST)
    if storage.exists(join(final, layout.SUCCESS)):
        if not storage.exists(staged_manifest):  # already published and cleaned up: a rerun
            return _finish(cfg, storage, layout.read_manifest(storage, final), already=True)
        published = layout.manifest_uri(storage, final)
        if published is None or storage.read_bytes(published) != storage.read_bytes(staged_manifest):
            layout.update_latest(storage, cfg.dataset_uri, cfg.version)  # it is published: latest may lag
            raise BuildError(f"version {cfg.version} is already published at {final} with different "
                             "content; published versions are immutable, so pick another version")
        manifest = Manifest.parse(read_json(storage, staged_manifest), staged_manifest)
        _remove_strays(storage, final, _published_names(final, _copies(cfg, storage, manifest), manifest))
        return _finish(cfg, storage, manifest, already=True)
    manifest = Manifest.parse(read_json(storage, staged_manifest), staged_manifest)
    if (manifest.build.get("gate") or {}).get("verdict") == TRIPPED:
        raise GateTripped(f"version {cfg.version}: the publish gate tripped and nobody approved or accepted it; "
                          "nothing was published")
    copies = _copies(cfg, storage, manifest)
    with ProgressLog(f"publish {cfg.version}", len(copies), "files") as done:  # nothing is visible until _SUCCESS
        for _ in ordered_map(lambda copy: storage.copy(*copy), copies, threads):
            done(1)
    files = manifest_files(manifest)
    if layout.LABEL_MAP not in files:
        log.warning("publish: version %s has no %s: a class name holds a line break, which its id:name lines "
                    "cannot carry", cfg.version, layout.LABEL_MAP)
    for name, data in sorted(files.items()):
        storage.write_bytes(join(final, name), data)
    storage.copy(staged_manifest, join(final, layout.MANIFEST))
    _remove_strays(storage, final, _published_names(final, copies, manifest))
    manifest_sha = hashlib.sha256(storage.read_bytes(join(final, layout.MANIFEST))).hexdigest()
    storage.sync(cfg.staging_uri)  # staged files whose fsync was deferred, now also the version's: on disk first
    storage.write_bytes(join(final, layout.SUCCESS), (manifest_sha + "\n").encode())
    return _finish(cfg, storage, manifest, already=False)


def manifest_files(manifest: Manifest) -> dict[str, bytes]:
    """The files of a version made from its manifest alone, by name: TFDS's metadata (``tfds_metadata_files``)
    and ``labels.txt`` (``layout.label_map``; none when a class name holds a line break)."""
    files = tfds_metadata_files(manifest)
    if (labels := layout.label_map(manifest.classes)) is not None:
        files[layout.LABEL_MAP] = labels
    return files


def _copies(cfg: BuildConfig, storage: Storage, manifest: Manifest) -> list[tuple[str, str, str | None]]:
    """(staged, published, sha256 to check or None) of every file publish copies from staging."""
    final = cfg.version_uri
    copies: list[tuple[str, str, str | None]] = []
    for split in manifest.splits.values():
        for shard in split.shards:
            copies.append((staged(cfg, SHARDS, shard.file), join(final, shard.file), shard.sha256))
            index = layout.index_file(shard.file)
            copies.append((staged(cfg, SHARDS, index), join(final, index), None))
    card_files = read_json(storage, staged(cfg, CARD_INDEX))
    copies += [(staged(cfg, CARD, name), join(final, name), None) for name in card_files]
    copies += [(staged(cfg, name), join(final, name), None) for name in (LABELS, REJECTS, INSPECTED, NEAR_DUPLICATES)]
    return copies


def _published_names(final: str, copies: list[tuple[str, str, str | None]], manifest: Manifest) -> set[str]:
    """Every file of the published version at ``final`` (its ``copies``, ``manifest_files``, the manifest and
    ``_SUCCESS``), relative to its folder."""
    prefix = final + "/"
    return ({published[len(prefix):] for _, published, _ in copies}
            | set(manifest_files(manifest)) | {layout.MANIFEST, layout.SUCCESS})


def _remove_strays(storage: Storage, final: str, names: set[str]) -> None:
    """Delete every file under the version folder ``final`` that is not one of ``names``: shards of an
    earlier attempt at this version (another shard count), its half-made temporaries, copies it had in
    flight when it was killed. A reader that globs ``train-*.tfrecord`` then reads the manifest's shards."""
    strays = [info.key for info in storage.iter_files(final, everything=True)
              if info.kind not in ("folder_marker", "folder") and not info.key.endswith("/")
              and info.key not in names]
    for key in strays:
        try:
            storage.delete(join(final, key))
        except FileNotFoundError:
            pass
        except OSError as exc:  # a folder, a file we may not remove: say so, never fail the publish on it
            log.warning("publish: cannot remove %s from %s (%s)", key, final, exc)
    if strays:
        log.info("publish: removed %d file(s) an earlier attempt at this version left in %s (%s%s)", len(strays),
                 final, ", ".join(strays[:3]), ", ..." if len(strays) > 3 else "")


def _finish(cfg: BuildConfig, storage: Storage, manifest: Manifest, already: bool) -> dict[str, Any]:
    latest = layout.update_latest(storage, cfg.dataset_uri, cfg.version)
    storage.delete_tree(cfg.staging_uri)
    storage.prune(join(cfg.dataset_uri, layout.STAGING))  # the _staging/ folder, once no build uses it
    return {"uri": cfg.version_uri, "version": cfg.version, "num_records": manifest.num_records,
            "num_rejected": manifest.num_rejected, "latest": latest, "already_published": already,
            "splits": {name: s.num_records for name, s in manifest.splits.items()}}
