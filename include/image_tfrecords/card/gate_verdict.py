"""The card's publish-gate section: the verdict and the checks of ``build.gate`` (``stages.gate``).

The card is made before the gate runs (the gate may wait for a person, who reads the card), so the card
stage renders ``pending_blocks`` inside a ``Section`` and the gate stage, and a person's approval after it,
put ``verdict_blocks`` in its place (``render.replace_section``): a published card states the verdict the
version was published with.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..rules.publish_gate import ACCEPTED, APPROVED, NEAR_DUPLICATES, OFF, PASSED, RISE_ONLY, TITLES, TRIPPED
from .render import Block, Heading, Para, Section, Table

SECTION = "publish-gate"


def pending_blocks() -> list[Block]:
    """The section as the card stage leaves it."""
    return [Section(SECTION, [Heading("Publish gate"), Para("Not evaluated yet: the gate runs after the card.")])]


def _number(value: Any) -> float | None:
    """``value`` as a number (None when it is none: a manifest edited by hand, or from elsewhere)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _value(kind: str, value: Any) -> str:
    number = _number(value)
    if number is None:
        return str(value)
    return f"{number:g}" if kind == NEAR_DUPLICATES else f"{number:.1%}"


def _limit(kind: str, threshold: Any) -> str:
    number, sign = _number(threshold), "+" if kind in RISE_ONLY else "\u00b1"
    if number is None:
        return str(threshold)
    return f"{sign}{number:g}" if kind == NEAR_DUPLICATES else f"{sign}{100 * number:.1f} points"


def verdict_blocks(gate: Mapping[str, Any]) -> list[Block]:
    """The section's blocks for a manifest's ``build.gate`` (what ``replace_section`` puts in it)."""
    verdict, previous = gate.get("verdict", ""), gate.get("previous_version")
    against = f"{gate.get('checks_run', 0)} checks against version {previous}"
    tripped = ", ".join(gate.get("tripped") or [])
    said = {
        OFF: "Off (the gate option): this build was published without being compared with the previous version.",
        PASSED: (f"Passed: {against}, none beyond its threshold." if previous else
                 "Passed: there is no previous version to compare with."),
        ACCEPTED: f"Tripped ({tripped}; {against}) and published anyway: accept_gate was set.",
        APPROVED: (f"Tripped ({tripped}; {against}) and published because "
                   f"{gate.get('approved_by') or 'a person'} approved it in the Airflow UI."),
        TRIPPED: (f"Tripped ({tripped}; {against}): not published unless a person approves it in the Airflow UI "
                  "or the build is rerun with accept_gate."),
    }.get(verdict, f"Verdict: {verdict or 'not recorded'}.")
    blocks: list[Block] = [Heading("Publish gate"), Para(said)]
    checks = gate.get("checks") or []
    if checks:
        rows = []
        for check in checks:
            kind = str(check.get("check", ""))
            rows.append((TITLES.get(kind, kind), check.get("of", ""), _value(kind, check.get("before", 0)),
                         _value(kind, check.get("now", 0)), _limit(kind, check.get("threshold", 0)),
                         "TRIPPED" if check.get("tripped") else "ok"))
        blocks.append(Table(("check", "of", "previous", "now", "limit", "result"), rows, legend={
            "check": "what is compared (docs/publish-gate.md)", "of": "the class or quality flag it is about",
            "previous": f"its value in version {previous}", "now": "its value in this build (shares: of all records, "
            "as the card and the datasets page give them)", "limit": "how far it may move", "result": "ok, or TRIPPED "
            "when it moved further"}))
    return [*blocks, *(Para(f"Note: {note}") for note in gate.get("notes") or [])]
