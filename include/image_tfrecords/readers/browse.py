"""Read-only views of published datasets, for the Airflow UI's "TFRecord datasets" page.

Pure Python (no Airflow import). Listings are cheap: one delimiter listing per destination root
and per dataset (folders only, never the shard keys), then for each version shown a HEAD of
``_SUCCESS`` and ``card.html`` and a GET of the manifest, several versions at a time.
Only published versions (with ``_SUCCESS``) are listed or served; ``_staging/`` never is, since
names must start with a letter or digit.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import DamagedFile
from ..options import DEFAULT_DESTINATION
from ..published import counts
from ..published.layout import (
    LATEST,
    LEGACY_MANIFEST,
    MANIFEST,
    SUCCESS,
    is_name,
    manifest_uri,
    read_latest,
    version_key,
)
from ..published.manifest import Manifest
from ..storage import Storage, StorageError, StoreUnreachable, is_s3, join

DESTINATION_ENV = "IMAGE_TFRECORDS_DESTINATION"
CARD = "card.html"
CARD_IMAGE = re.compile(r"card(/[A-Za-z0-9][A-Za-z0-9._-]{0,199}){1,3}\.png")  # card/x.png, card/samples/y.png
CONTENT_TYPES = {
    "card.html": "text/html; charset=utf-8",
    "card.md": "text/markdown; charset=utf-8",
    MANIFEST: "application/json",
    LEGACY_MANIFEST: "application/json",  # our manifest in versions before 0.2.0, TFDS's metadata after
    "features.json": "application/json",
    "labels.csv": "text/csv; charset=utf-8",
    "rejects.csv": "text/csv; charset=utf-8",
    "inspected.csv": "text/csv; charset=utf-8",  # versions from 0.3.0
}
CHUNK = 1 << 20
WORKERS = 8


class NotFound(LookupError):
    """No such published dataset, version or servable file (the page answers 404)."""


@dataclass(frozen=True)
class VersionInfo:
    """One published version, from its manifest."""

    version: str
    num_records: int
    num_rejected: int
    classes: list[str]
    splits: dict[str, int]
    compression: str
    latest: bool
    has_card: bool
    as_of: str | None = None
    error: str | None = None  # the manifest could not be read
    manifest_file: str = MANIFEST  # manifest.json, or dataset_info.json in versions before 0.2.0
    gate: str = ""  # the publish gate's verdict (0.7.0+: off, passed, accepted, approved); "" when not recorded
    quality_flags: dict[str, int] = field(default_factory=dict)  # records stored with each quality flag (0.7.0+)
    near_duplicate_groups: int = 0  # near-duplicate groups found by its build (0.6.0+)
    flag_shares: dict[str, str] = field(default_factory=dict)  # each flag's share of the records, as the card says


@dataclass
class DatasetInfo:
    """A dataset folder: its published versions (newest first) and what ``latest.json`` names."""

    name: str
    uri: str
    latest: str | None
    versions: list[VersionInfo] = field(default_factory=list)
    truncated: bool = False  # more version folders than were checked


@dataclass
class RootInfo:
    """One destination root and the datasets under it, or why it could not be listed."""

    index: int
    uri: str
    datasets: list[DatasetInfo] = field(default_factory=list)
    error: str | None = None


def destination_roots(value: str | None = None) -> list[str]:
    """The destination roots: ``value`` or $IMAGE_TFRECORDS_DESTINATION (comma-separated), else the default."""
    value = os.environ.get(DESTINATION_ENV, "") if value is None else value
    roots = [part.strip().rstrip("/") for part in value.split(",") if part.strip()]
    return roots or [DEFAULT_DESTINATION]


def content_type(path: str) -> str | None:
    """The content type of a servable file of a version (``card.md``, ``card/x.png``, ...), None if not served."""
    if CARD_IMAGE.fullmatch(path):
        return "image/png"
    return CONTENT_TYPES.get(path)


def safe_error(exc: BaseException) -> str:
    """A short description of a store error that names no endpoint, bucket or credential."""
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    if isinstance(exc, StoreUnreachable) or type(exc).__name__ in ("EndpointConnectionError", "ConnectionError"):
        return "the store does not answer"
    if code:
        return f"the store refused the request ({code})"
    if isinstance(exc, StorageError):
        return "the store cannot be read (missing bucket or access denied)"
    return f"the store cannot be read ({type(exc).__name__})"


# -- listing ------------------------------------------------------------------------------------
def list_children(storage: Storage, uri: str) -> tuple[list[str], list[str]]:
    """(sub-folder names, file names) directly below ``uri``, sorted; one delimiter listing on S3."""
    return storage.list_children(uri)


def version_info(storage: Storage, dataset_uri: str, version: str, latest: str | None) -> VersionInfo | None:
    """The version's summary, or None if it is not published (no ``_SUCCESS``)."""
    uri = join(dataset_uri, version)
    if not storage.exists(join(uri, SUCCESS)):
        return None
    has_card = storage.exists(join(uri, CARD))
    try:
        where = manifest_uri(storage, uri)
        if where is None:
            raise FileNotFoundError(join(uri, MANIFEST))
        manifest = Manifest.parse(json.loads(storage.read_bytes(where)), where)
        return VersionInfo(  # the numbers the card shows too, by the same functions (published.counts)
            version=version, num_records=counts.records(manifest), num_rejected=counts.rejected(manifest),
            classes=counts.classes(manifest), splits=counts.split_records(manifest), compression=manifest.compression,
            latest=version == latest, has_card=has_card, as_of=manifest.as_of,
            manifest_file=where.rsplit("/", 1)[-1], **_checks(manifest))
    except (FileNotFoundError, ValueError, DamagedFile):
        return VersionInfo(version=version, num_records=0, num_rejected=0, classes=[], splits={}, compression="?",
                           latest=version == latest, has_card=has_card, error=f"{MANIFEST} is missing or invalid")


def _checks(manifest: Manifest) -> dict[str, Any]:
    """What the version's build checked (the gate's verdict, quality flags and their shares, near-duplicate groups),
    from its manifest's ``build``; empty values for a version from before them."""
    build = manifest.build or {}
    gate = build.get("gate") if isinstance(build.get("gate"), dict) else {}
    return {"gate": str(gate.get("verdict", "")), "quality_flags": counts.quality_flags(manifest),
            "flag_shares": counts.flag_shares(manifest),
            "near_duplicate_groups": counts.near_duplicate_groups(manifest)}


def _prime(storage: Storage, uri: str) -> None:
    """Create the S3 client before threads share it (its factory is not thread-safe)."""
    storage.prime(uri)


def list_dataset(storage: Storage, root: str, name: str, limit: int | None = None) -> DatasetInfo | None:
    """A dataset's published versions, newest first (at most ``limit``); None if it is not a dataset."""
    if not is_name(name):
        return None
    uri = join(root, name)
    _prime(storage, uri)
    folders, files = list_children(storage, uri)
    candidates = sorted((f for f in folders if is_name(f)), key=version_key, reverse=True)
    latest = read_latest(storage, uri) if LATEST in files else None
    info = DatasetInfo(name=name, uri=uri, latest=latest)
    batch = limit or len(candidates) or 1
    with ThreadPoolExecutor(WORKERS) as pool:
        for start in range(0, len(candidates), batch):
            chunk = candidates[start:start + batch]
            info.versions += [v for v in pool.map(lambda v: version_info(storage, uri, v, latest), chunk) if v]
            if limit and len(info.versions) >= limit:
                info.truncated = start + batch < len(candidates) or len(info.versions) > limit
                info.versions = info.versions[:limit]
                break
    return info if info.versions or latest else None


def list_root(storage: Storage, index: int, root: str, limit: int | None = 10) -> RootInfo:
    """Every dataset under ``root`` (sorted by name) with its newest ``limit`` published versions."""
    info = RootInfo(index=index, uri=root)
    try:
        _prime(storage, root)
        folders, _ = list_children(storage, root)
        datasets = [list_dataset(storage, root, name, limit) for name in folders if is_name(name)]
    except Exception as exc:  # one unreadable root must not hide the others
        info.error = safe_error(exc)
        return info
    info.datasets = [d for d in datasets if d is not None]
    return info


# -- serving ------------------------------------------------------------------------------------
def published_version_uri(storage: Storage, root: str, dataset: str, version: str) -> str:
    """The URI of a published version; NotFound for bad names or a version without ``_SUCCESS``."""
    if not (is_name(dataset) and is_name(version)):
        raise NotFound("no such version")
    uri = join(root, dataset, version)
    if not storage.exists(join(uri, SUCCESS)):
        raise NotFound("no such published version")
    return uri


def open_file(storage: Storage, root: str, dataset: str, version: str, path: str) -> tuple[Iterator[bytes], str]:
    """(chunks, content type) of an allow-listed file of a published version; NotFound otherwise."""
    kind = content_type(path)
    if kind is None:
        raise NotFound("this file is not served")
    uri = join(published_version_uri(storage, root, dataset, version), path)
    try:
        return _chunks(storage, uri), kind
    except FileNotFoundError as exc:
        raise NotFound("no such file") from exc


def _chunks(storage: Storage, uri: str) -> Iterator[bytes]:
    """Open ``uri`` now (FileNotFoundError if missing) and return an iterator over its bytes."""
    if not is_s3(uri) and (not os.path.isfile(uri) or os.path.islink(uri)):
        raise FileNotFoundError(uri)
    opened = contextlib.ExitStack()
    stream = opened.enter_context(storage.open_read(uri))

    def chunks() -> Iterator[bytes]:
        with opened:
            while chunk := stream.read(CHUNK):
                yield chunk

    return chunks()
