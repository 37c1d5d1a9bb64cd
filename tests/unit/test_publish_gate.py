"""The publish gate's checks (include/image_tfrecords/rules/publish_gate.py): pure, no store."""

from __future__ import annotations

from typing import Any

import pytest

from image_tfrecords.rules.publish_gate import (
    CLASS_SHARE,
    NEAR_DUPLICATES,
    QUALITY_SHARE,
    REJECT_SHARE,
    Facts,
    Thresholds,
    evaluate,
)


def manifest(version: str, classes: dict[str, int], rejected: int = 0, flags: dict[str, int] | None = None,
             conflicts: int = 0, kept_across: int = 0) -> dict[str, Any]:
    """A manifest's JSON with what the gate reads."""
    build: dict[str, Any] = {"class_records": classes, "near_duplicates": {"kept_across_labels": kept_across}}
    if flags is not None:
        build["quality_flags"] = flags
    return {"version": version, "num_records": sum(classes.values()), "num_rejected": rejected,
            "rejects_by_reason": {"near_duplicate_label_conflict": conflicts} if conflicts else {}, "build": build}


BASE = manifest("v1", {"cats": 50, "dogs": 50}, rejected=0, flags={"blurry": 10})


def tripped(report: Any) -> list[tuple[str, str]]:
    return [(c.kind, c.subject) for c in report.tripped]


def test_a_first_version_passes_and_says_why() -> None:
    report = evaluate(BASE, None)
    assert report.passed and report.previous_version is None and report.checks == ()
    assert "first version" in report.notes[0]
    assert "no previous version" in report.render()


def test_the_same_shares_pass_every_check() -> None:
    report = evaluate(manifest("v2", {"cats": 100, "dogs": 100}, flags={"blurry": 20}), BASE)
    assert report.passed
    assert {c.kind for c in report.checks} == {REJECT_SHARE, CLASS_SHARE, QUALITY_SHARE, NEAR_DUPLICATES}
    assert [(c.kind, c.subject) for c in report.checks if c.kind == CLASS_SHARE] == [(CLASS_SHARE, "cats"),
                                                                                    (CLASS_SHARE, "dogs")]
    assert report.summary() == "publish gate: passed (5 checks against v1)"


def test_a_class_share_moving_more_than_its_threshold_trips_either_way() -> None:
    report = evaluate(manifest("v2", {"cats": 61, "dogs": 39}, flags={"blurry": 10}), BASE)
    assert tripped(report) == [(CLASS_SHARE, "cats"), (CLASS_SHARE, "dogs")]
    cats = report.tripped[0]
    assert (cats.before, round(cats.now, 2), cats.threshold) == (0.5, 0.61, 0.1)
    assert evaluate(manifest("v2", {"cats": 60, "dogs": 40}, flags={"blurry": 10}), BASE).passed  # exactly 10 points
    assert evaluate(manifest("v2", {"cats": 61, "dogs": 39}, flags={"blurry": 10}), BASE,
                    Thresholds(class_share=0.2)).passed


def test_new_and_vanished_classes_count_from_and_to_zero() -> None:
    report = evaluate(manifest("v2", {"cats": 50, "birds": 50}, flags={"blurry": 10}), BASE)
    assert tripped(report) == [(CLASS_SHARE, "birds"), (CLASS_SHARE, "dogs")]
    birds, dogs = report.tripped
    assert (birds.before, birds.now, dogs.before, dogs.now) == (0.0, 0.5, 0.5, 0.0)
    small = evaluate(manifest("v2", {"cats": 48, "dogs": 48, "birds": 4}, flags={"blurry": 10}), BASE)
    assert small.passed  # a new class with 4% of the records moves no share by more than 10 points


def test_the_reject_share_trips_only_when_it_rises_more_than_its_threshold() -> None:
    more = manifest("v2", {"cats": 45, "dogs": 45}, rejected=10, flags={"blurry": 9})  # 0% -> 10%
    assert tripped(evaluate(more, BASE)) == [(REJECT_SHARE, "")]
    fewer = evaluate(manifest("v2", {"cats": 50, "dogs": 50}, flags={"blurry": 10}),
                     manifest("v1", {"cats": 50, "dogs": 50}, rejected=50, flags={"blurry": 10}))
    assert fewer.passed  # 33% -> 0%: fewer rejects never trip
    assert evaluate(more, BASE, Thresholds(reject_share=0.1)).passed
    assert evaluate(more, BASE, Thresholds(reject_share=1)).passed  # 1: off


def test_quality_flag_shares_are_compared_only_when_both_versions_record_them() -> None:
    now = manifest("v2", {"cats": 50, "dogs": 50}, flags={"blurry": 30, "dark": 15})
    assert tripped(evaluate(now, BASE)) == [(QUALITY_SHARE, "blurry"), (QUALITY_SHARE, "dark")]
    older = manifest("v1", {"cats": 50, "dogs": 50})  # made before quality flags
    report = evaluate(now, older)
    assert report.passed and not [c for c in report.checks if c.kind == QUALITY_SHARE]
    assert any("no quality flags" in note for note in report.notes)
    assert evaluate(manifest("v2", {"cats": 50, "dogs": 50}, flags={}), manifest("v1", {"cats": 50, "dogs": 50},
                                                                                  flags={})).passed


def test_near_duplicates_across_labels_trip_when_they_rise() -> None:
    now = manifest("v2", {"cats": 50, "dogs": 50}, flags={"blurry": 10}, conflicts=4, kept_across=1)
    report = evaluate(now, BASE)
    assert tripped(report) == [(NEAR_DUPLICATES, "")]
    assert (report.tripped[0].before, report.tripped[0].now) == (0, 5)
    assert evaluate(now, BASE, Thresholds(near_duplicates_across_labels=5)).passed
    same = manifest("v1", {"cats": 50, "dogs": 50}, flags={"blurry": 10}, conflicts=5)
    assert evaluate(now, same).passed  # as many as before


def test_class_records_unknown_skip_the_class_checks_with_a_note() -> None:
    old = {"version": "v0", "num_records": 100, "classes": ["cats", "dogs"], "build": {}}
    report = evaluate(manifest("v2", {"cats": 90, "dogs": 10}), old)
    assert report.passed and any("records per class unknown for v0" in note for note in report.notes)
    counted = evaluate(Facts.of(manifest("v2", {"cats": 90, "dogs": 10})), Facts.of(old, {"cats": 50, "dogs": 50}))
    assert tripped(counted) == [(CLASS_SHARE, "cats"), (CLASS_SHARE, "dogs")]


def test_the_report_renders_each_check_with_before_now_and_threshold() -> None:
    report = evaluate(manifest("v2", {"cats": 70, "dogs": 30}, rejected=20, flags={"blurry": 10}), BASE)
    text = report.render()
    lines = text.splitlines()
    assert lines[0] == ("publish gate: tripped 3 of 5 checks against v1 (reject share, class share: cats, "
                        "class share: dogs)")
    assert any(line.split()[:4] == ["TRIPPED", "class", "share:", "cats"] and "50.0% -> 70.0%" in line
               and "+20.0 points" in line and "limit \u00b110.0" in line for line in lines)
    assert any(line.split()[0] == "ok" and "quality flag share: blurry" in line for line in lines)
    data = report.to_json()
    assert data["tripped"] == ["reject share", "class share: cats", "class share: dogs"]
    assert {"check": "class_share", "of": "cats", "before": 0.5, "now": 0.7, "threshold": 0.1,
            "tripped": True} in data["checks"]


@pytest.mark.parametrize("limit", [2, 20])
def test_a_report_lists_at_most_limit_tripped_checks_of_a_kind(limit: int) -> None:
    before = manifest("v1", {f"c{i:02d}": 10 for i in range(30)})
    now = manifest("v2", {f"c{i:02d}": 10 for i in range(30, 60)})  # every class new, every old one gone
    report = evaluate(now, before, Thresholds(class_share=0.01))
    assert len(report.tripped) == 60
    shown = [c for c in report.shown(limit) if c.kind == CLASS_SHARE]
    assert len(shown) == limit
    assert f"... and {60 - limit} more tripped" in report.render(limit)
    assert "and 57 more" in report.summary()
    assert len(report.to_json(limit=None)["checks"]) == 62
