"""The published format: what a dataset folder holds and how versions are found and named.

    DEST/DATASET/
        latest.json                 {"version": V}: the newest published version
        VERSION/
            {split}-{i:05d}-of-{n:05d}.tfrecord[.gz]   the shards
            {split}-{i:05d}-of-{n:05d}.tfindex         record offsets per shard (PyTorch's ``tfrecord``)
            manifest.json           our manifest (``dataset_info.json`` in versions before 0.2)
            dataset_info.json, features.json           TFDS metadata (uncompressed versions)
            labels.txt              "id:name" per class id: TF-slim's label file (``label_map``)
            labels.csv, rejects.csv, card.md, card.html, card/
            _SUCCESS                written last: a version without it is not published
        _staging/VERSION/           a build in progress (never read by readers)

The pipeline, the loader, the UI plugin and the consumer DAG all read and write through this
module; it imports nothing heavier than the store.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from ..errors import DamagedFile, NotPublishedError, StoreBusy
from ..storage import Storage, join
from .manifest import Manifest

MANIFEST = "manifest.json"
LEGACY_MANIFEST = "dataset_info.json"  # our manifest's name before TFDS's metadata took it
TFDS_FEATURES = "features.json"  # beside TFDS's dataset_info.json: that name is TFDS's, not our manifest
SUCCESS, LATEST, LABELS, REJECTS = "_SUCCESS", "latest.json", "labels.csv", "rejects.csv"
LABEL_MAP = "labels.txt"  # TF-slim's label file (its dataset_utils.LABELS_FILENAME): one "id:name" line per class
STAGING = "_staging"
INSPECTED = "inspected.csv"  # what inspection learned of every file it read: the next build reuses it
NEAR_DUPLICATES = "near_duplicates.csv"  # the records in a near-duplicate group: filename, label, split, group, sha256
NEAR_DUPLICATES_FIELDS = ("filename", "label", "split", "near_group", "sha256")
INDEX_SUFFIX = ".tfindex"
VERSION_FORMAT = "%Y%m%dT%H%M%SZ"  # default version names: the build's (or run's logical) time in UTC
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")  # dataset and version names (fullmatch)
SHARD = re.compile(r"(?P<split>.+)-(?P<index>\d{5,})-of-(?P<count>\d{5,})\.tfrecord(?:\.gz)?")


def shard_suffix(compression: str) -> str:
    return ".tfrecord.gz" if compression == "gzip" else ".tfrecord"


def shard_file(split: str, index: int, count: int, compression: str) -> str:
    """``{split}-{index:05d}-of-{count:05d}.tfrecord[.gz]``."""
    return f"{split}-{index:05d}-of-{count:05d}{shard_suffix(compression)}"


def index_file(shard: str) -> str:
    """The offsets file of a shard: ``train-00000-of-00002.tfrecord`` -> ``train-00000-of-00002.tfindex``."""
    match = SHARD.fullmatch(shard)
    if not match:
        raise ValueError(f"not a shard file name: {shard}")
    return shard[: match.end("count")] + INDEX_SUFFIX


def label_map(classes: Sequence[str]) -> bytes | None:
    """``labels.txt`` for ``classes`` (the manifest's, index == class id): ``f"{id}:{name}\\n"`` per id in
    order, UTF-8, as TF-slim's ``dataset_utils.write_label_file`` writes it and its ``read_label_file`` reads
    it (lines split at ``\\n``, each at its first ``:``). None when a name holds a line break, which that
    format cannot carry."""
    if any("\n" in name for name in classes):
        return None
    return "".join(f"{label}:{name}\n" for label, name in enumerate(classes)).encode()


def version_name(when: datetime) -> str:
    """The default version name for a build at ``when``: ``YYYYMMDDTHHMMSSZ`` in UTC."""
    return when.astimezone(UTC).strftime(VERSION_FORMAT)


def version_key(version: str) -> list[Any]:
    """Natural sort key: ``v2 < v10``; timestamps sort chronologically."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", version)]


def is_name(text: str) -> bool:
    """A dataset or version name: no separators, no ``..``, never ``_staging``."""
    return bool(NAME.fullmatch(text))


# -- versions --------------------------------------------------------------------------------
def published_before(storage: Storage, dataset_uri: str, version: str | None = None) -> Iterator[str]:
    """The published versions (with ``_SUCCESS``) that sort before ``version`` (None: all), newest first.

    One delimiter listing, then an existence check per version as the caller asks for the next one.
    """
    names = [v for v in storage.list_dirs(dataset_uri)
             if is_name(v) and (version is None or version_key(v) < version_key(version))]
    for name in sorted(names, key=version_key, reverse=True):
        if storage.exists(join(dataset_uri, name, SUCCESS)):
            yield name


def previous_version(storage: Storage, dataset_uri: str, version: str) -> str | None:
    """The newest published version that sorts before ``version``."""
    return next(published_before(storage, dataset_uri, version), None)


def read_latest(storage: Storage, dataset_uri: str) -> str | None:
    """The version ``latest.json`` names, or None when there is none (or it is unreadable)."""
    try:
        return _latest_version(storage.read_bytes(join(dataset_uri, LATEST)))
    except FileNotFoundError:
        return None


def _latest_version(data: bytes | None) -> str | None:
    """The version a ``latest.json``'s bytes name; None if absent or damaged (the next publish repairs it)."""
    try:
        version = json.loads(data).get("version") if data else None
    except (ValueError, AttributeError):
        return None
    return version if isinstance(version, str) and is_name(version) else None


def update_latest(storage: Storage, dataset_uri: str, version: str, attempts: int = 20) -> str:
    """Point ``latest.json`` at ``version`` unless it already names a newer published one; returns its version.

    A conditional write (compare-and-swap on the object's ETag, or a lock locally), so two builds
    finishing at once never move it backwards. A ``latest.json`` that names a version which is not
    published (deleted, or never finished) is repaired: it then names the newest published version.
    """
    uri = join(dataset_uri, LATEST)
    for _ in range(attempts):
        data, tag = storage.read_with_tag(uri)
        current = _latest_version(data)
        if current == version:
            return current
        target = version
        if current is None or version_key(current) > version_key(version):
            if current is not None and storage.exists(join(dataset_uri, current, SUCCESS)):
                return current
            # absent, damaged, or naming a version that is not published: the newest published one
            newest = next(published_before(storage, dataset_uri), None)
            if newest is None and current is not None:
                return current  # nothing published to point it at
            target = newest or version
        if storage.write_if_unchanged(uri, (json.dumps({"version": target}) + "\n").encode(), tag):
            return target
    raise StoreBusy(f"{uri} kept changing while it was being updated")


# -- manifests -------------------------------------------------------------------------------
def manifest_uri(storage: Storage, version_uri: str) -> str | None:
    """Where a version's manifest is: ``manifest.json``, or the old ``dataset_info.json`` (when it is ours,
    not TFDS's); None if there is neither."""
    uri = join(version_uri, MANIFEST)
    if storage.exists(uri):
        return uri
    legacy = join(version_uri, LEGACY_MANIFEST)
    if storage.exists(legacy) and not storage.exists(join(version_uri, TFDS_FEATURES)):
        return legacy
    return None


def read_manifest(storage: Storage, version_uri: str) -> Manifest:
    """A version's manifest (either name), parsed (``manifest.Manifest``). FileNotFoundError if it has none,
    DamagedFile if it is not a manifest."""
    uri = manifest_uri(storage, version_uri)
    if uri is None:
        raise FileNotFoundError(join(version_uri, MANIFEST))
    try:
        raw = json.loads(storage.read_bytes(uri))
    except ValueError as exc:
        raise DamagedFile(f"{uri} is not valid JSON ({exc}): the version's manifest is damaged") from None
    return Manifest.parse(raw, uri)


def resolve(storage: Storage, uri: str) -> str:
    """The published version URI for ``uri``: a version, or a dataset resolved through ``latest.json``.

    Raises NotPublishedError for a version without ``_SUCCESS`` or a folder that is neither.
    """
    uri = uri.rstrip("/")
    version = uri
    if manifest_uri(storage, uri) is None:
        latest = read_latest(storage, uri)
        if latest is None:
            raise NotPublishedError(f"{uri}: no {MANIFEST} (a version) nor {LATEST} (a dataset)")
        version = join(uri, latest)
    if not storage.exists(join(version, SUCCESS)):
        raise NotPublishedError(f"{version} has no {SUCCESS}: it is not published (still being built, or failed)")
    return version
