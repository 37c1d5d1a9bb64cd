"""Stage 8: the publish gate: compare the validated build with the previous published version.

Counts the records per class of the staged labels.csv (and of the previous version's, when its manifest
does not give them), evaluates ``rules.publish_gate``, stages ``gate.json`` (every check, and the report
as text) and records the verdict in the staged manifest's ``build.gate``:

- ``off``: the ``gate`` option is off;
- ``passed``: nothing tripped (a first version passes);
- ``accepted``: something tripped and ``accept_gate`` publishes it anyway;
- ``tripped``: something tripped: ``publish_stage`` refuses the build until ``approve_gate`` (a person
  approved it in the Airflow UI) makes it ``approved``, or a rerun with ``accept_gate`` ``accepted``.

With the gate on, the manifest also gets ``build.class_records`` (records per class), which the next
version's gate reads (a version without them has its labels.csv counted instead).
Run again on the same inputs, it writes the same bytes.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

from ..config import BuildConfig
from ..errors import DamagedFile
from ..progress import log, summarized
from ..published import layout
from ..published.manifest import Manifest
from ..rules.publish_gate import ACCEPTED, APPROVED, OFF, PASSED, TRIPPED, Facts, Thresholds, evaluate
from ..staging import CARD, GATE_REPORT, LABELS, MANIFEST, staged
from ..storage import Storage, join
from ..storage.documents import read_json, read_rows, write_json


def thresholds_of(cfg: BuildConfig) -> Thresholds:
    return Thresholds(cfg.gate_reject_share, cfg.gate_class_share, cfg.gate_quality_share,
                      cfg.gate_near_duplicates_across_labels)


@summarized
def gate_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Evaluate the gate; stage gate.json and the manifest's ``build.gate``. Returns the verdict, the number
    of checks that tripped and ``report`` (the report's lines, for the command line and the DAG)."""
    uri = staged(cfg, MANIFEST)
    manifest = Manifest.parse(read_json(storage, uri), uri)
    counts: dict[str, int] | None = None  # with the gate off, no pass over labels.csv: a later gate counts it
    if not cfg.gate:
        verdict, report, lines = OFF, None, ["publish gate: off"]
    else:
        counts = class_records(storage, staged(cfg, LABELS), manifest.classes,
                               manifest.separator if manifest.multi_label else None)
        previous = _previous(cfg, storage, manifest.previous_version)
        report = evaluate(Facts.of(manifest, counts), previous, thresholds_of(cfg))
        if previous is None and manifest.previous_version:
            report = dataclasses.replace(report, notes=(f"version {manifest.previous_version} does not read: "
                                                        "nothing to compare, the gate passes",))
        verdict = PASSED if report.passed else ACCEPTED if cfg.accept_gate else TRIPPED
        lines = report.render().splitlines()
        if verdict == ACCEPTED:
            lines[0] += " -- accepted (accept_gate): it is published anyway"
    gate = {"verdict": verdict, "thresholds": dataclasses.asdict(thresholds_of(cfg))}
    write_json(storage, staged(cfg, GATE_REPORT),
               gate | (report.to_json(limit=None) if report else {}) | {"report": "\n".join(lines)})
    recorded = gate | (report.to_json() if report else {})
    _card_says(cfg, storage, recorded)
    # the manifest last: what publish and approve_gate go by, so a retry after a failed write redoes all
    _rewrite(storage, uri, manifest, ({"class_records": counts} if counts is not None else {}) | {"gate": recorded})
    log.info("%s", "\n".join(lines))
    return {"verdict": verdict, "tripped": len(report.tripped) if report else 0, "report": lines}


def approve_gate(cfg: BuildConfig, storage: Storage, by: str = "") -> dict[str, Any]:
    """Record in the staged manifest that a person (``by``) approved a build whose gate tripped (verdict
    ``approved``), so that ``publish_stage`` publishes it. Any other verdict is left as it is."""
    uri = staged(cfg, MANIFEST)
    manifest = Manifest.parse(read_json(storage, uri), uri)
    gate = dict(manifest.build.get("gate") or {})
    if gate.get("verdict") == TRIPPED:
        gate |= {"verdict": APPROVED, "approved_by": by}
        _card_says(cfg, storage, gate)
        report = read_json(storage, staged(cfg, GATE_REPORT))
        write_json(storage, staged(cfg, GATE_REPORT), report | {"verdict": APPROVED, "approved_by": by})
        # the manifest last: while it says tripped, a retry (a write above failed) approves again in full
        _rewrite(storage, uri, manifest, {"gate": gate})
        log.info("publish gate: approved by %s", by or "(unknown)")
    return {"verdict": gate.get("verdict", "")}


def class_records(storage: Storage, labels_uri: str, classes: tuple[str, ...] | list[str],
                  separator: str | None) -> dict[str, int]:
    """Records per class of a labels.csv (every class of ``classes`` listed, 0 where it has none; multi-label,
    ``separator`` given: a record counts for each of its classes)."""
    cells: Counter[str] = Counter()
    with read_rows(storage, labels_uri) as rows:
        label = (rows.fieldnames or []).index("label")
        for values in rows.reader:
            if values:
                cells[values[label]] += 1
    counts: Counter[str] = Counter()
    for cell, n in cells.items():
        for name in (cell.split(separator) if separator is not None else [cell]):
            if name:
                counts[name] += n
    return {name: counts.get(name, 0) for name in [*classes, *sorted(set(counts) - set(classes))]}


def _previous(cfg: BuildConfig, storage: Storage, version: str | None) -> Facts | None:
    """The previous published version's facts (None: there is none, or it no longer reads: said in the log)."""
    if not version:
        return None
    folder = join(cfg.dataset_uri, version)
    try:
        manifest = layout.read_manifest(storage, folder)
        if manifest.build.get("class_records") is not None:
            return Facts.of(manifest)
        counts = class_records(storage, join(folder, layout.LABELS), manifest.classes,
                               manifest.separator if manifest.multi_label else None)
        return Facts.of(manifest, counts)
    except (FileNotFoundError, DamagedFile) as exc:
        log.warning("publish gate: version %s does not read (%s): nothing to compare with", version, exc)
        return None


def _card_says(cfg: BuildConfig, storage: Storage, gate: dict[str, Any]) -> None:
    """Put the verdict in the staged card's publish-gate section (card.md and card.html; the card is made
    before the gate: ``card.gate_verdict``). Same verdict, same bytes."""
    from ..card.gate_verdict import SECTION, verdict_blocks
    from ..card.render import replace_section

    for name, html_format in (("card.md", False), ("card.html", True)):
        uri = staged(cfg, CARD, name)
        try:
            document = storage.read_bytes(uri).decode()
        except FileNotFoundError:  # no card staged (a stage run alone): nothing to say it in
            continue
        updated = replace_section(document, SECTION, verdict_blocks(gate), html_format)
        if updated != document:
            storage.write_bytes(uri, updated.encode())


def _rewrite(storage: Storage, uri: str, manifest: Manifest, build: dict[str, Any]) -> None:
    """Stage ``manifest`` again with ``build`` merged into its ``build``."""
    raw = dict(manifest.raw) | {"build": dict(manifest.build) | build}
    write_json(storage, uri, Manifest.parse(raw, uri).to_json())

