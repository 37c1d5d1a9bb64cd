"""The publish gate: is this build too different from the previous published version to publish unseen?

Four kinds of check, each comparing one number of this build (``now``) with the previous version's
(``before``) against a threshold:

- ``reject_share``: rejected / (records + rejected); trips when it *rises* by more than the threshold
  (absolute: 0.05 is five points);
- ``class_share``, one per class: the share of records with the class (multi-label: a record counts
  for each of its classes); trips when it changes either way by more than the threshold. A new class
  counts from 0, a vanished one goes to 0;
- ``quality_share``, one per image-quality flag (the manifest's ``build.quality_flags``: records
  flagged); compared only when both versions record the flags; trips like a class share;
- ``near_duplicates_across_labels``: near-duplicate groups kept across labels plus records rejected as
  ``near_duplicate_label_conflict``; trips when it rises by more than the threshold (a count).

A share threshold of 1 can never trip (no share moves by more than 1): that check is off. A first
version has nothing to compare with, and passes. Pure: no store, no config; ``stages.gate`` feeds it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

REJECT_SHARE, CLASS_SHARE, QUALITY_SHARE, NEAR_DUPLICATES = (
    "reject_share", "class_share", "quality_share", "near_duplicates_across_labels")
KINDS = (REJECT_SHARE, CLASS_SHARE, QUALITY_SHARE, NEAR_DUPLICATES)  # the order checks are listed in
TITLES = {REJECT_SHARE: "reject share", CLASS_SHARE: "class share", QUALITY_SHARE: "quality flag share",
          NEAR_DUPLICATES: "near-duplicates across labels"}
RISE_ONLY = (REJECT_SHARE, NEAR_DUPLICATES)  # the others trip on a change either way
# the verdicts a manifest's build.gate records (see stages.gate): TRIPPED is never published
OFF, PASSED, ACCEPTED, TRIPPED, APPROVED = "off", "passed", "accepted", "tripped", "approved"
SHOWN = 20  # per kind, the most tripped checks a report lists (the largest changes first)
_CONFLICT = "near_duplicate_label_conflict"


@dataclass(frozen=True)
class Thresholds:
    """How far each number may move before the gate trips (see the module)."""

    reject_share: float = 0.05
    class_share: float = 0.10
    quality_share: float = 0.10
    near_duplicates_across_labels: int = 0


@dataclass(frozen=True)
class Facts:
    """What the gate compares of one version. ``class_records``, ``quality_flags``: None when unknown."""

    version: str
    num_records: int
    num_rejected: int = 0
    class_records: Mapping[str, int] | None = None
    quality_flags: Mapping[str, int] | None = None
    near_duplicates_across_labels: int = 0

    @classmethod
    def of(cls, manifest: Mapping[str, Any], class_records: Mapping[str, int] | None = None) -> Facts:
        """The facts of a manifest (its JSON, or a ``Manifest``); ``class_records`` where the caller counted
        them, else the manifest's ``build.class_records`` (None if it has none)."""
        build = manifest.get("build") or {}
        near = build.get("near_duplicates") or {}
        rejects = manifest.get("rejects_by_reason") or {}
        flags = build.get("quality_flags")
        records = class_records if class_records is not None else build.get("class_records")
        across = int(near.get("kept_across_labels", 0)) + int(rejects.get(_CONFLICT, 0))
        return cls(version=str(manifest.get("version", "")), num_records=int(manifest.get("num_records", 0)),
                   num_rejected=int(manifest.get("num_rejected", 0)),
                   class_records=None if records is None else {str(k): int(v) for k, v in records.items()},
                   quality_flags=None if flags is None else {str(k): int(v) for k, v in flags.items()},
                   near_duplicates_across_labels=across)

    @property
    def reject_share(self) -> float:
        total = self.num_records + self.num_rejected
        return self.num_rejected / total if total else 0.0

    def share(self, counts: Mapping[str, int], name: str) -> float:
        return counts.get(name, 0) / self.num_records if self.num_records else 0.0


@dataclass(frozen=True)
class Check:
    """One comparison: ``kind`` (of ``KINDS``), ``subject`` (the class or flag; "" for the others)."""

    kind: str
    subject: str
    before: float
    now: float
    threshold: float
    tripped: bool

    @property
    def change(self) -> float:
        return self.now - self.before

    @property
    def name(self) -> str:
        return f"{TITLES[self.kind]}: {self.subject}" if self.subject else TITLES[self.kind]

    def line(self) -> str:
        """``TRIPPED  class share: cats  33.3% -> 10.0% (-23.3 points; limit 10.0)``."""
        verdict = "TRIPPED" if self.tripped else "ok"
        sign = "+" if self.kind in RISE_ONLY else "\u00b1"
        if self.kind == NEAR_DUPLICATES:
            values = f"{self.before:g} -> {self.now:g} ({self.change:+g}; limit {sign}{self.threshold:g})"
        else:
            values = (f"{self.before:.1%} -> {self.now:.1%} ({100 * self.change:+.1f} points; "
                      f"limit {sign}{100 * self.threshold:.1f})")
        return f"  {verdict:<8}{self.name:<40} {values}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"check": self.kind}
        if self.subject:
            out["of"] = self.subject
        plain = int if self.kind == NEAR_DUPLICATES else (lambda share: round(share, 6))
        return out | {"before": plain(self.before), "now": plain(self.now), "threshold": self.threshold,
                      "tripped": self.tripped}


@dataclass(frozen=True)
class GateReport:
    """Every check of this build against ``previous_version`` (None: a first version), and notes on what
    was not compared."""

    version: str
    previous_version: str | None
    checks: tuple[Check, ...] = ()
    notes: tuple[str, ...] = field(default=())

    @property
    def tripped(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if c.tripped)

    @property
    def passed(self) -> bool:
        return not self.tripped

    def shown(self, limit: int | None = SHOWN) -> list[Check]:
        """The checks worth listing, kind by kind: every tripped one (at most ``limit`` a kind, the largest
        changes first); for a kind with none tripped, its largest change."""
        out: list[Check] = []
        for kind in KINDS:
            mine = sorted((c for c in self.checks if c.kind == kind), key=_largest_first)
            tripped = [c for c in mine if c.tripped]
            out += tripped[:limit] if tripped else mine[:1]
        return out

    def summary(self) -> str:
        """One line: the verdict and the tripped checks' names."""
        if self.previous_version is None:
            return f"publish gate: passed ({self.version} has no previous version to compare with)"
        if self.passed:
            return f"publish gate: passed ({len(self.checks)} checks against {self.previous_version})"
        names = [c.name for c in self.shown(3) if c.tripped]
        more = len(self.tripped) - len(names)
        return (f"publish gate: tripped {len(self.tripped)} of {len(self.checks)} checks against "
                f"{self.previous_version} ({', '.join(names)}{f' and {more} more' if more > 0 else ''})")

    def render(self, limit: int | None = SHOWN) -> str:
        """The report as text: the summary, then a line per check worth listing, then the notes."""
        lines = [self.summary()]
        for check in self.shown(limit):
            lines.append(check.line())
        hidden = len(self.tripped) - sum(c.tripped for c in self.shown(limit))
        if hidden > 0:
            lines.append(f"  ... and {hidden} more tripped (gate.json lists every check)")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)

    def to_json(self, limit: int | None = SHOWN) -> dict[str, Any]:
        """The report as JSON (``limit``: as ``shown``; None lists every check of a tripped kind)."""
        checks = list(self.checks) if limit is None else self.shown(limit)
        return {"previous_version": self.previous_version, "passed": self.passed, "checks_run": len(self.checks),
                "tripped": [c.name for c in self.shown(limit) if c.tripped],
                "checks": [c.to_json() for c in checks], "notes": list(self.notes)}


def evaluate(current: Facts | Mapping[str, Any], previous: Facts | Mapping[str, Any] | None,
             thresholds: Thresholds | None = None) -> GateReport:
    """Compare ``current`` with ``previous`` (None: a first version, which passes); facts or manifests."""
    now = current if isinstance(current, Facts) else Facts.of(current)
    if previous is None:
        return GateReport(now.version, None, notes=("first version: nothing to compare, the gate passes",))
    before = previous if isinstance(previous, Facts) else Facts.of(previous)
    limits = thresholds or Thresholds()
    checks = [_check(REJECT_SHARE, "", before.reject_share, now.reject_share, limits.reject_share)]
    notes: list[str] = []
    if now.class_records is None or before.class_records is None:
        notes.append(f"records per class unknown for {now.version if now.class_records is None else before.version}:"
                     " class shares not compared")
    else:
        checks += _shares(CLASS_SHARE, before, now, before.class_records, now.class_records, limits.class_share)
    if now.quality_flags is None or before.quality_flags is None:
        notes.append(f"{now.version if now.quality_flags is None else before.version} records no quality flags: "
                     "their shares not compared")
    else:
        checks += _shares(QUALITY_SHARE, before, now, before.quality_flags, now.quality_flags, limits.quality_share)
    checks.append(_check(NEAR_DUPLICATES, "", before.near_duplicates_across_labels,
                         now.near_duplicates_across_labels, limits.near_duplicates_across_labels))
    return GateReport(now.version, before.version, tuple(checks), tuple(notes))


def _shares(kind: str, before: Facts, now: Facts, old: Mapping[str, int], new: Mapping[str, int],
            threshold: float) -> Iterable[Check]:
    for name in sorted(set(old) | set(new)):
        yield _check(kind, name, before.share(old, name), now.share(new, name), threshold)


def _check(kind: str, subject: str, before: float, now: float, threshold: float) -> Check:
    change = now - before if kind in RISE_ONLY else abs(now - before)
    return Check(kind, subject, before, now, threshold, round(change, 9) > threshold)


def _largest_first(check: Check) -> tuple[float, str]:
    return -round(abs(check.change), 9), check.subject
