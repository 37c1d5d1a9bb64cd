"""Stage 7: render the dataset card (card.md, card.html, card/*.png) of the validated build."""

from __future__ import annotations

import contextlib
import csv
import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from ..card.row_columns import ROWS_FILE, Changes, LineReader, RowColumns, line_reader, read_card_rows
from ..card.stats import names_in
from ..config import BuildConfig
from ..errors import DamagedFile
from ..images.transform import record_image
from ..progress import log, summarized
from ..published import layout
from ..published.manifest import Manifest, as_manifest
from ..source import spool
from ..source.reading import read_source
from ..staging import CARD, CARD_INDEX, CARD_ROWS, LABELS, MANIFEST, NEAR_DUPLICATES, REJECTS, SPLIT_SUMMARY, staged
from ..storage import Storage, join
from ..storage.csv_blocks import Block, Quoted, first_fields, table_blocks
from ..storage.documents import field_end, list_rows, raw_rows, read_json, write_json

if TYPE_CHECKING:
    from ..card.sections import LabelFacts


class _Rows:
    """A callable giving a fresh iterator over the CSV rows at ``uri`` each time (dicts made from plain
    lists: cheaper than DictReader's rows, and the card reads every row more than once); ``names()`` gives
    each row's file name alone (``{"filename": ...}``: the diff's examples need no more, and it is cut from
    each row's text without splitting the rest); ``columns()`` and ``names_at()`` read it as columns, for the card's
    pass over every row (``card.label_columns``) and the diff's examples; ``lines()`` reads rows by where their
    lines are (while it is open, ``columns()`` reads the same local copy: an S3 table is downloaded once)."""

    def __init__(self, storage: Storage, uri: str) -> None:
        self._storage, self._uri = storage, uri
        self._local: str | None = None  # the copy ``lines()`` holds open

    def __call__(self) -> Iterator[dict[str, str]]:
        with list_rows(self._storage, self._uri) as it:
            names = it.fieldnames or []
            for values in it.reader:
                if values:
                    yield dict(zip(names, values, strict=False))

    def names(self) -> Iterator[dict[str, str]]:
        with raw_rows(self._storage, self._uri) as (header, texts):
            if not header.startswith("filename,"):
                yield from ({"filename": row.get("filename", "")} for row in self())
                return
            for text in texts:
                if text:
                    field = text[:field_end(text)]
                    yield {"filename": next(csv.reader([field]))[0] if field.startswith('"') else field}

    def columns(self) -> AbstractContextManager[tuple[list[str], Iterator[Block]]]:
        """The table as columns (``csv_blocks.table_blocks``: its header's names and its blocks)."""
        return table_blocks(self._storage, self._local or self._uri)

    @contextlib.contextmanager
    def lines(self) -> Iterator[LineReader]:
        """The table's rows by where their lines are (``row_columns.LineReader``)."""
        with line_reader(self._storage, self._uri) as reader:
            self._local = reader.path
            try:
                yield reader
            finally:
                self._local = None

    def names_at(self, numbers: list[int]) -> Iterator[str]:
        """The file names of rows ``numbers`` (ascending), in that order: cut from their lines where the table has
        no quote (``csv_blocks.first_fields``), else a pass over ``names`` that stops at the last number."""
        try:
            return iter(first_fields(self._storage, self._uri, numbers))
        except (Quoted, ValueError):
            return names_in(self.names(), numbers)


def _rows(storage: Storage, uri: str) -> _Rows:
    return _Rows(storage, uri)


def card_facts(cfg: BuildConfig, storage: Storage) -> LabelFacts:
    """The card's pass over the staged rows and its diff against the previous version (``scan_labels``), which
    needs no manifest: possible once plan has staged labels.csv. The command line runs it on a thread beside
    the shards' writing (which keeps the pool's processes busy), so that the card stage only renders."""
    from ..card.sections import scan_labels

    summary = read_json(storage, staged(cfg, SPLIT_SUMMARY))
    separator = cfg.label_separator if summary.get("multi_label") else None
    previous = _previous(cfg, storage, summary["previous_version"], columns=True)
    facts = scan_labels(separator, len(summary["classes"]), _rows(storage, staged(cfg, LABELS)),
                        _rows(storage, staged(cfg, REJECTS)), previous, _near_rows(cfg, storage),
                        _changes(cfg, storage, previous))
    if facts.parsed is not None:
        log.info("card: %d of %d rows of labels.csv parsed (the others' columns kept from version %s)",
                 facts.parsed, facts.columns.count if facts.columns is not None else 0, facts.previous_version)
    return facts


def _changes(cfg: BuildConfig, storage: Storage, previous: Any) -> Changes | None:
    """The rows the plan kept of the previous version (``CARD_ROWS``) with that version's saved columns, where both
    are there and of the same labels.csv; else None (every row parsed)."""
    if previous is None or previous.columns is None:
        return None
    try:
        kept = read_card_rows(storage.read_bytes(staged(cfg, CARD_ROWS)))
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None
    manifest = as_manifest(previous.manifest)
    if kept is None or kept[0] != (manifest.version, manifest.labels_sha256):
        return None
    return Changes(previous.columns, kept[1], kept[2])


def _near_rows(cfg: BuildConfig, storage: Storage) -> Callable[[], Iterator[dict[str, str]]] | None:
    return _rows(storage, staged(cfg, NEAR_DUPLICATES)) if storage.exists(staged(cfg, NEAR_DUPLICATES)) else None


@summarized
def card_stage(cfg: BuildConfig, storage: Storage, facts: LabelFacts | None = None) -> dict[str, Any]:
    """Render the card into staging (``card-files/``, listed in ``card-files.json``); ``facts``: ``card_facts``,
    when made already (else made here: the DAG's gate task, whose night parses only its new rows too)."""
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
                       previous, fetch_image, labels_sha256=storage.sha256_of(staged(cfg, LABELS)) or "",
                       near_rows=_near_rows(cfg, storage), previous_strip=_previous_strips(cfg, storage, manifest),
                       facts=facts, uri=join(cfg.dataset_uri, cfg.version))
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


def _previous(cfg: BuildConfig, storage: Storage, version: str | None, columns: bool = False) -> Any:
    """The previous version for the card's diff; None (a card without one, said in the log) when there is
    none or its manifest or labels.csv is missing or damaged: a damaged base never stops a build. ``columns``: with
    the labels.csv columns its card saved (``card/label-rows.bin``), which only the pass over the rows takes."""
    from ..card.sections import PreviousVersion
    from ..card.stats import SCAN_FILE, LabelScan

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
    scan = saved = None  # the scan and columns its card saved, when they are of its labels.csv as it is now
    with contextlib.suppress(FileNotFoundError):
        scan = LabelScan.load(storage.read_bytes(join(earlier, SCAN_FILE)), labels_sha)
    if columns:  # (only the card's pass over the rows takes them)
        with contextlib.suppress(FileNotFoundError):
            saved = RowColumns.load(storage.read_bytes(join(earlier, ROWS_FILE)), labels_sha)
    return PreviousVersion(manifest, _rows(storage, labels), scan, saved)
