"""Stage 7: render the dataset card (card.md, card.html, card/*.png) of the validated build."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..config import BuildConfig
from ..errors import DamagedFile
from ..images.transform import record_image
from ..progress import log, summarized
from ..published import layout
from ..published.manifest import Manifest
from ..source import spool
from ..source.reading import read_source
from ..staging import CARD, CARD_INDEX, LABELS, MANIFEST, NEAR_DUPLICATES, REJECTS, SPLIT_SUMMARY, staged
from ..storage import Storage, join
from ..storage.documents import read_json, write_json
from ..storage.tables import read_table

if TYPE_CHECKING:
    import polars as pl

    from ..card.sections import LabelFacts


class _Rows:
    """A table in the store (labels.csv, rejects.csv, near_duplicates.csv): ``table()`` reads it with polars, every
    column text (``storage.tables.read_table``: one code path for every file name, however odd), for the card's pass
    over labels.csv (``card.label_table``); called, it gives a fresh iterator over its rows as dicts (an empty field
    ""), for the passes over the small tables (rejects, near-duplicates)."""

    def __init__(self, storage: Storage, uri: str) -> None:
        self._storage, self._uri = storage, uri

    def table(self, columns: list[str] | None = None) -> pl.DataFrame:
        return read_table(self._storage, self._uri, columns=columns)

    def __call__(self) -> Iterator[dict[str, str]]:
        return self.table().fill_null("").iter_rows(named=True)


def _rows(storage: Storage, uri: str) -> _Rows:
    return _Rows(storage, uri)


def card_facts(cfg: BuildConfig, storage: Storage) -> LabelFacts:
    """The card's pass over the staged rows and its diff against the previous version (``scan_labels``), which
    needs no manifest: possible once plan has staged labels.csv. The command line runs it on a thread beside
    the shards' writing (which keeps the pool's processes busy), so that the card stage only renders."""
    from ..card.sections import scan_labels

    summary = read_json(storage, staged(cfg, SPLIT_SUMMARY))
    separator = cfg.label_separator if summary.get("multi_label") else None
    previous = _previous(cfg, storage, summary["previous_version"])
    return scan_labels(separator, len(summary["classes"]), _rows(storage, staged(cfg, LABELS)),
                       _rows(storage, staged(cfg, REJECTS)), previous, _near_rows(cfg, storage))


def _near_rows(cfg: BuildConfig, storage: Storage) -> Callable[[], Iterator[dict[str, str]]] | None:
    return _rows(storage, staged(cfg, NEAR_DUPLICATES)) if storage.exists(staged(cfg, NEAR_DUPLICATES)) else None


@summarized
def card_stage(cfg: BuildConfig, storage: Storage, facts: LabelFacts | None = None) -> dict[str, Any]:
    """Render the card into staging (``card-files/``, listed in ``card-files.json``); ``facts``: ``card_facts``,
    when made already (else made here: the DAG's gate task)."""
    from ..card.sections import build_card

    manifest = Manifest.parse(read_json(storage, staged(cfg, MANIFEST)), staged(cfg, MANIFEST))
    facts = facts if facts is not None else card_facts(cfg, storage)
    previous = _previous(cfg, storage, manifest.previous_version)

    def fetch_image(row: dict[str, str]) -> bytes | None:
        """The record's image bytes, from the source (None if it changed or vanished since the build)."""
        try:
            data = spool.take(row["sha256"])
            if data is None or hashlib.sha256(data).hexdigest() != row["sha256"]:  # no copy, or a damaged one
                data = read_source(storage, cfg.source, row["filename"], cfg.max_file_bytes, int(row["num_bytes"]))
                if hashlib.sha256(data).hexdigest() != row["sha256"]:
                    return None
            return record_image(data, row, cfg.image_options, cfg.max_pixels, viewable=True)
        except Exception:  # RejectedImage, ValueError, Pillow's errors: no sample rather than no card
            return None

    files = build_card(manifest, _rows(storage, staged(cfg, LABELS)), _rows(storage, staged(cfg, REJECTS)),
                       previous, fetch_image, near_rows=_near_rows(cfg, storage),
                       previous_strip=_previous_strips(cfg, storage, manifest), facts=facts,
                       uri=join(cfg.dataset_uri, cfg.version))
    for name in sorted(files):
        storage.write_bytes(staged(cfg, CARD, name), files[name])
    write_json(storage, staged(cfg, CARD_INDEX), sorted(files))
    return {"files": len(files), "bytes": sum(map(len, files.values()))}


def _previous_strips(cfg: BuildConfig, storage: Storage,
                     manifest: Manifest) -> Callable[[str, list[str]], bytes | None]:
    """``previous_strip(path, candidates)``: the previous version's thumbnail strip at ``path`` when its card made
    it from the same candidates (content hashes) with the same image options, else None: a night's card reads
    and encodes only the strips whose images changed."""
    from ..card.stats import STRIPS_FILE

    earlier = join(cfg.dataset_uri, manifest.previous_version) if manifest.previous_version else None
    known: dict[str, list[str]] = {}
    if earlier is not None:
        with contextlib.suppress(FileNotFoundError, ValueError, TypeError, AttributeError):
            saved = json.loads(storage.read_bytes(join(earlier, STRIPS_FILE)))
            if saved.get("image") == manifest.raw.get("image"):
                known = {str(path): list(key) for path, key in saved["strips"].items()}

    def previous_strip(path: str, key: list[str]) -> bytes | None:
        if earlier is None or known.get(path) != key:
            return None
        try:
            return storage.read_bytes(join(earlier, path))
        except FileNotFoundError:
            return None
    return previous_strip


def _previous(cfg: BuildConfig, storage: Storage, version: str | None) -> Any:
    """The previous version for the card's diff; None (a card without one, said in the log) when there is
    none or its manifest or labels.csv is missing or damaged: a damaged base never stops a build."""
    from ..card.sections import PreviousVersion

    if not version:
        return None
    earlier = join(cfg.dataset_uri, version)
    labels = join(earlier, layout.LABELS)
    try:
        manifest = layout.read_manifest(storage, earlier)
        if not storage.exists(labels):
            raise FileNotFoundError(labels)
        labels_sha = storage.sha256_of(labels) or ""  # "": a store that keeps no checksum for it
        if manifest.labels_sha256 and labels_sha and labels_sha != manifest.labels_sha256:
            raise DamagedFile(f"{labels} is not the one version {version} published")
    except (FileNotFoundError, DamagedFile) as exc:
        log.warning("the card has no changes since version %s: %s", version,
                    f"{exc} is missing" if isinstance(exc, FileNotFoundError) else exc)
        return None
    return PreviousVersion(manifest, _rows(storage, labels))
