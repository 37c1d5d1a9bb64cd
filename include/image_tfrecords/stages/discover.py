"""Stage 1: list the source into staging, and decide whether anything changed."""

from __future__ import annotations

import json
from typing import Any

from .. import __version__
from ..config import BuildConfig
from ..errors import BuildError, DamagedFile
from ..progress import log, summarized
from ..published import layout
from ..records.schema import REJECTS_FIELDS
from ..rules.base_version import RETRIED_REASONS
from ..source.listing import DISCOVERED_FIELDS, CandidateRun, DiscoveryCounts, discover
from ..staging import DISCOVER_REJECTS, DISCOVER_SUMMARY, DISCOVERED, GROUPS, METADATA, staged
from ..storage import Storage, join
from ..storage.documents import RowWriter, read_json, write_json


def plain(text: str) -> bool:
    """Whether ``text`` is a CSV field as it is (no comma, quote, line end; not empty)."""
    return bool(text) and "," not in text and '"' not in text and "\n" not in text and "\r" not in text


def _write_run(found: RowWriter, run: CandidateRun) -> None:
    """A class folder's candidates (``CandidateRun``) as rows of discovered.csv: one text where every field is plain
    (names from a listing are never empty), else row by row."""
    files, label = run.files, run.label
    if plain(files.prefix) and plain(label) and plain("\0".join(files.names)):
        prefix = files.prefix
        found.write_lines("".join([f"{prefix}{name},{label},{size},{stamp}\n" for name, size, stamp in
                                   zip(files.names, files.sizes, files.stamps, strict=True)]), len(files.names))
    else:
        for candidate in run.candidates():
            found.write_values((candidate.filename, label, candidate.num_bytes, candidate.stamp))


@summarized
def discover_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """List the source: candidate images to inspect, rejects, and skipped non-image files.

    ``unchanged_since`` names the previous published version when the source listing and the
    params fingerprint the same (the rest of the build can then be skipped), unless it rejected
    files that could not be read (``base_version.RETRIED_REASONS``): those are tried again.
    """
    counts = DiscoveryCounts()
    with RowWriter(storage, staged(cfg, DISCOVERED), DISCOVERED_FIELDS) as found, \
            RowWriter(storage, staged(cfg, DISCOVER_REJECTS), REJECTS_FIELDS) as rejects, \
            RowWriter(storage, staged(cfg, METADATA), ("filename", *cfg.columns)) as metadata, \
            RowWriter(storage, staged(cfg, GROUPS), ("filename", "group")) as groups:
        write_line = found.write_line
        for candidate in discover(storage, cfg.source, counts, cfg.cutoff, cfg.columns, cfg.label_separator,
                                  cfg.modern_formats, cfg.group_column, runs=True):
            if isinstance(candidate, CandidateRun):  # (a folder layout: no metadata or group columns)
                _write_run(found, candidate)
            elif candidate.reason:
                rejects.write(vars(candidate))
            else:  # plain values: this runs over every file
                name, label = candidate.filename, candidate.label
                if plain(name) and plain(label):  # what write_values checks, once for the two texts
                    write_line(f"{name},{label},{candidate.num_bytes},{candidate.stamp}\n")
                else:
                    found.write_values((name, label, candidate.num_bytes, candidate.stamp))
                if cfg.columns:
                    metadata.write_values((candidate.filename, *candidate.values))
                if cfg.group_column:
                    groups.write_values((candidate.filename, candidate.group))
    counts.fingerprint.update(json.dumps([__version__, cfg.fingerprint_params], sort_keys=True).encode())
    fingerprint = counts.fingerprint.hexdigest()
    previous, manifest, damaged = readable_previous(cfg, storage)
    unchanged = None
    # Never skipped: after a damaged version (it must not stay the newest), or when this version is itself
    # published (a rerun after a publish that was cut short: publish finishes it, or says it differs)
    if manifest is not None and not damaged and not storage.exists(join(cfg.version_uri, layout.SUCCESS)):
        retry = set(manifest.rejects_by_reason) & set(RETRIED_REASONS)  # files to read again
        unchanged = previous if manifest.source_fingerprint == fingerprint and not retry else None
    summary = {"layout": counts.layout, "multi_label": counts.multi_label, "listed": counts.listed,
               "skipped": counts.skipped,
               "skipped_by_kind": dict(sorted(counts.skipped_by_kind.items())),
               "after_cutoff": counts.after_cutoff, "candidates": found.count, "rejected": rejects.count,
               "fingerprint": fingerprint, "previous_version": previous, "unchanged_since": unchanged,
               "damaged_versions": damaged}
    write_json(storage, staged(cfg, DISCOVER_SUMMARY), summary)
    left_out = after_cutoff(cfg, counts.after_cutoff)
    if not found.count:
        layout_hint = "expected one folder per class or a labels.csv"
        why = f"{left_out}; {layout_hint}" if left_out and counts.listed else left_out or layout_hint
        raise BuildError(f"no labelled images found under {cfg.source} ({counts.listed} files listed, "
                         f"{rejects.count} rejected): {why}")
    if left_out:
        log.info("discover: %s", left_out)
    return summary


def after_cutoff(cfg: BuildConfig, count: int) -> str:
    """What the snapshot cutoff (``as_of``) left out of the build, and how to build it ("" when nothing)."""
    if not count:
        return ""
    files = "1 file was" if count == 1 else f"{count} files were"
    return (f"{files} modified after this build's snapshot cutoff {cfg.as_of} and left out (scheduled runs and "
            "backfills see the source as of their logical date): to build them, trigger the DAG manually (a manual "
            "run sees every file), or give a later as_of (the command line's --as-of)")


def readable_previous(cfg: BuildConfig, storage: Storage) -> tuple[str | None, dict[str, Any] | None, list[str]]:
    """The version this build follows: the newest published version before it whose manifest reads, its
    manifest, and the newer published ones passed over because theirs is missing or damaged (each
    ``"VERSION: why"``, also logged). Such a version is never a base: nothing of it is read again."""
    damaged: list[str] = []
    for version in layout.published_before(storage, cfg.dataset_uri, cfg.version):
        try:
            return version, layout.read_manifest(storage, join(cfg.dataset_uri, version)), damaged
        except FileNotFoundError:
            why = f"{version}: its {layout.MANIFEST} is missing"
        except DamagedFile as exc:
            why = f"{version}: {exc}"
        damaged.append(why)
        log.warning("version %s is published but damaged (%s): it is passed over, and this build follows the "
                    "version before it", version, why.split(": ", 1)[1])
    return None, None, damaged


def discard_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Drop this build's staging prefix (when there is nothing new to build), and make sure ``latest.json``
    names a published version (it may name a deleted one)."""
    unchanged = read_json(storage, staged(cfg, DISCOVER_SUMMARY)).get("unchanged_since")
    if unchanged:
        layout.update_latest(storage, cfg.dataset_uri, unchanged)
    storage.delete_tree(cfg.staging_uri)
    storage.prune(join(cfg.dataset_uri, layout.STAGING))  # the _staging/ folder, once no build uses it
    return {"discarded": cfg.staging_uri}
