"""Issue 14's labels.csv metadata columns and multi-label sources, written from the design: built
through the command line and the DAG, read back with TensorFlow using the manifest's feature spec."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from image_tfrecords.records.schema import RECORD_FIELDS
from tests.options_support import (
    build,
    dags_test,
    encode,
    image,
    pixels,
    read_back,
    read_csv,
    rejects,
    run_cli,
    shard_digests,
    write,
    write_labels_csv,
)

COLUMNS = "caption=string,weight=float,count=int64,tags=string_list"
# filename -> (label, caption, weight, count, tags): the good rows
GOOD = {
    "m0.png": ("cat", 'a, "quoted" caption \u00fc\u2603', "0.25", "7", "x|y"),
    "m1.png": ("dog", "", "1.5", "-3", ""),
    "m2.png": ("cat", "plain", "-2", "12345678901", "solo"),
    "m3.png": ("dog", "z", "0.001", "0", "p|q|r"),
    "m4.png": ("cat", "four", "3", "4", "a"),
    "m5.png": ("dog", "five", "5.5", "5", "b|c"),
    "m6.png": ("cat", "six", "6e2", "6", ""),
}
# filename -> (row values, column the reject must name)
BAD = {
    "bad_weight.png": (("cat", "w", "abc", "1", ""), "weight"),
    "bad_count.png": (("dog", "c", "1", "1.5", ""), "count"),
    "empty_count.png": (("cat", "e", "1", "", ""), "count"),
}


def _metadata_source(root: Path) -> Path:
    source = root / "meta"
    rows = []
    for i, (name, values) in enumerate([*GOOD.items(), *((n, v) for n, (v, _) in BAD.items())]):
        write(source / name, encode(image((70 + 9 * i, 50 + 7 * i), 200 + i), "PNG"))
        rows.append([name, *values])
    write_labels_csv(source, ["filename", "label", "caption", "weight", "count", "tags"], rows)
    return source


def test_metadata_columns_round_trip(tmp_path: Path) -> None:
    source = _metadata_source(tmp_path)
    version = build(source, tmp_path / "out", "--columns", COLUMNS, "--max-reject-fraction", "0.5")
    manifest, records, labels = read_back(version)  # parses every record with the manifest's spec
    assert manifest["columns"] == {"caption": "string", "weight": "float", "count": "int64", "tags": "string_list"}
    features = manifest["features"]
    assert features["caption"] == {"dtype": "string", "shape": []}
    assert features["weight"] == {"dtype": "float", "shape": []}
    assert features["count"] == {"dtype": "int64", "shape": []}
    assert features["tags"] == {"dtype": "string", "shape": [None]}
    assert manifest["multi_label"] is False

    assert set(records) == set(GOOD)
    for name, (label, caption, weight, count, tags) in GOOD.items():
        record = records[name]
        assert record["image/class/text"] == label.encode()
        assert record["caption"] == caption.encode(), name
        assert record["weight"] == np.float32(float(weight)), name
        assert record["count"] == int(count), name
        assert record["tags"] == ([t.encode() for t in tags.split("|")] if tags else []), name
        row = labels[name]
        assert row["caption"] == caption
        assert float(row["weight"]) == pytest.approx(float(weight)) and int(row["count"]) == int(count)

    header, _ = read_csv(version / "labels.csv")  # metadata after the record's fields, before shard
    assert header == [*RECORD_FIELDS, "caption", "weight", "count", "tags", "shard", "shard_position"]

    bad = rejects(version)
    assert set(bad) == set(BAD)
    for name, (_, column) in BAD.items():
        reason, detail = bad[name]
        assert reason == "bad_metadata", (name, reason, detail)
        assert detail.startswith(column) or f"{column}:" in detail, (name, detail)


def test_a_declared_column_missing_from_labels_csv_fails_in_one_line(tmp_path: Path) -> None:
    source = _metadata_source(tmp_path)
    result = run_cli("build", "--source", str(source), "--destination", str(tmp_path / "out"), "--dataset", "d",
                     "--version", "v", "--no-progress", "--max-reject-fraction", "0.5",
                     "--columns", json.dumps({"caption": "string", "rating": "float"}))  # the JSON form
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0, result.stderr
    assert "rating" in result.stderr and "labels.csv" in result.stderr, result.stderr
    assert not (tmp_path / "out" / "d" / "v" / "_SUCCESS").exists()

    folders = tmp_path / "folders"  # one folder per class: no labels.csv to read any column from
    write(folders / "cat" / "a.png", encode(image((40, 30), 1), "PNG"))
    result = run_cli("build", "--source", str(folders), "--destination", str(tmp_path / "out2"), "--dataset", "d",
                     "--version", "v", "--no-progress", "--columns", "caption=string")
    assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().count("\n") == 0 and "caption" in result.stderr, result.stderr


@pytest.mark.parametrize(("column", "value"), [("weight", "nan"), ("scores", "0.5|nan")])
def test_a_nan_float_does_not_fail_the_build(tmp_path: Path, column: str, value: str) -> None:
    """NaN parses as a float: the file is either stored with NaN or rejected as bad_metadata, but one
    such cell must not fail the whole build."""
    source = tmp_path / "src"
    rows = []
    for i in range(6):
        name = f"n{i}.png"
        write(source / name, encode(image((50 + 5 * i, 40 + 3 * i), 400 + i), "PNG"))
        cells = {"weight": "1.5", "scores": "0.25"}
        if i == 0:
            cells[column] = value
        rows.append([name, "cat" if i % 2 else "dog", cells["weight"], cells["scores"]])
    write_labels_csv(source, ["filename", "label", "weight", "scores"], rows)
    result = run_cli("build", "--source", str(source), "--destination", str(tmp_path / "out"), "--dataset", "d",
                     "--version", "v", "--no-progress", "--splits", "train=1", "--max-reject-fraction", "0.5",
                     "--columns", "weight=float,scores=float_list")
    assert result.returncode == 0, result.stderr
    _, records, _ = read_back(tmp_path / "out" / "d" / "v")
    bad = rejects(tmp_path / "out" / "d" / "v")
    if "n0.png" in bad:
        assert bad["n0.png"][0] == "bad_metadata" and column in bad["n0.png"][1]
    else:
        stored = records["n0.png"][column]
        assert np.isnan(stored if column == "weight" else stored[1])
    assert len(records) + len(bad) == 6


# -- multi-label ----------------------------------------------------------------------------------------
def _multi_label_source(root: Path, sep: str = "|") -> tuple[Path, dict[str, list[str]]]:
    """labels.csv with a `labels` column; returns the source and the expected label names of kept files."""
    source = root / "multi"
    same_conflict = encode(image((80, 60), 300), "PNG")
    same_dup = encode(image((90, 70), 301), "PNG")
    files = {
        "a.png": (encode(image((100, 80), 302), "PNG"), f"cat{sep}dog"),
        "b.png": (encode(image((64, 90), 303), "PNG"), "dog"),
        "c.png": (encode(image((120, 66), 304), "PNG"), f" cat {sep} cat "),
        "d.png": (encode(image((77, 77), 305), "PNG"), ""),  # no_label
        "e.png": (same_conflict, "cat"),  # label_conflict with f
        "f.png": (same_conflict, "dog"),
        "g.png": (same_dup, f"cat{sep}dog"),  # kept
        "h.png": (same_dup, f"dog {sep} cat"),  # duplicate of g: the same set
        "i.png": (encode(image((70, 95), 306), "PNG"), "dog"),
        "j.png": (encode(image((95, 70), 307), "PNG"), f"dog{sep}cat"),
        "k.png": (encode(image((88, 60), 308), "PNG"), "cat"),
        "l.png": (encode(image((60, 88), 309), "PNG"), "dog"),
    }
    for name, (data, _) in files.items():
        write(source / name, data)
    write_labels_csv(source, ["filename", "labels"], [[n, cell] for n, (_, cell) in files.items()])
    expected = {"a.png": ["cat", "dog"], "b.png": ["dog"], "c.png": ["cat"], "g.png": ["cat", "dog"],
                "i.png": ["dog"], "j.png": ["cat", "dog"], "k.png": ["cat"], "l.png": ["dog"]}
    return source, expected


def _check_multi_label(version: Path, expected: dict[str, list[str]], sep: str) -> dict:
    manifest, records, labels = read_back(version)
    assert manifest["multi_label"] is True and manifest["label_separator"] == sep
    assert manifest["classes"] == ["cat", "dog"]
    assert manifest["features"]["image/class/label"] == {"dtype": "int64", "shape": [None]}
    assert manifest["features"]["image/class/text"] == {"dtype": "string", "shape": [None]}
    assert set(records) == set(expected)
    for name, names in expected.items():
        record = records[name]
        assert record["image/class/text"] == [n.encode() for n in names], name
        assert [manifest["classes"][i] for i in record["image/class/label"]] == names, name
        assert labels[name]["label"] == sep.join(names), labels[name]
        assert labels[name]["label_id"] == sep.join(str(manifest["classes"].index(n)) for n in names)
    bad = rejects(version)
    assert {k: v[0] for k, v in bad.items()} == {"d.png": "no_label", "e.png": "label_conflict",
                                                 "f.png": "label_conflict", "h.png": "duplicate"}
    assert "g.png" in bad["h.png"][1]
    return manifest


def test_multi_label_records(tmp_path: Path) -> None:
    source, expected = _multi_label_source(tmp_path)
    version = build(source, tmp_path / "out", "--max-reject-fraction", "0.5")
    _check_multi_label(version, expected, "|")


# -- the DAG: raw + metadata columns + multi-label, with its own separator ---------------------------------
def test_dag_builds_raw_multi_label_with_columns_like_the_cli(airflow_env: dict[str, str], tmp_path: Path) -> None:
    sep = ";"
    source, expected = _multi_label_source(tmp_path, sep)
    header, rows = read_csv(source / "labels.csv")
    extra = {name: (f"caption {name}", "0.5;1.25" if name < "f" else "", "1;-2;3" if name < "h" else "")
             for name in (r["filename"] for r in rows)}
    write_labels_csv(source, [*header, "caption", "scores", "ids"],
                     [[r["filename"], r["labels"], *extra[r["filename"]]] for r in rows])
    columns = {"caption": "string", "scores": "float_list", "ids": "int64_list"}
    options = {"resize": "48x48", "fit": "pad", "encoding": "raw", "channels": 1, "columns": columns,
               "label_separator": sep}
    conf = {"source": str(source), "destination": str(tmp_path / "dag"), "dataset": "multi", "version": "dag2",
            "salt": "options", "shard_size_mb": 0.005, "max_reject_fraction": 0.5, **options}
    run = dags_test(airflow_env, "2027-01-06T02:00:00+00:00", conf)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    version = tmp_path / "dag" / "multi" / "dag2"
    assert (version / "_SUCCESS").exists()
    manifest = _check_multi_label(version, expected, sep)
    assert manifest["columns"] == columns
    assert manifest["features"]["scores"] == {"dtype": "float", "shape": [None]}
    assert manifest["features"]["ids"] == {"dtype": "int64", "shape": [None]}
    assert {k: manifest["image"][k] for k in ("resize", "fit", "encoding", "channels")} == \
        {k: options[k] for k in ("resize", "fit", "encoding", "channels")}
    _, records, _ = read_back(version)
    for name, record in records.items():
        caption, scores, ids = extra[name]
        assert record["image/format"] == b"raw" and pixels(record).shape == (48, 48, 1), name
        assert record["caption"] == caption.encode()
        assert record["scores"] == ([np.float32(float(x)) for x in scores.split(sep)] if scores else []), name
        assert record["ids"] == ([int(x) for x in ids.split(sep)] if ids else []), name

    cli = build(source, tmp_path / "cli", "--resize", "48x48", "--fit", "pad", "--encoding", "raw", "--channels", "1",
                "--columns", "caption=string,scores=float_list,ids=int64_list", "--label-separator", sep,
                "--shard-size-mb", "0.005", "--max-reject-fraction", "0.5", dataset="multi", version="dag2")
    cli_manifest, _, _ = read_back(cli)
    assert shard_digests(cli_manifest) == shard_digests(manifest), "the DAG and the CLI must write the same bytes"


def test_changing_columns_rebuilds_with_the_new_features(tmp_path: Path) -> None:
    source = _metadata_source(tmp_path)
    for name in BAD:  # only good rows, so both builds keep the same files
        (source / name).unlink()
    header, rows = read_csv(source / "labels.csv")
    write_labels_csv(source, header, [[r[h] for h in header] for r in rows if r["filename"] in GOOD])
    first = build(source, tmp_path / "out", "--columns", "caption=string", version="v1")
    manifest1, records1, _ = read_back(first)
    assert "weight" not in manifest1["features"] and all("weight" not in r for r in records1.values())
    second = build(source, tmp_path / "out", "--columns", COLUMNS, version="v2")
    manifest2, records2, _ = read_back(second)
    assert manifest2["build"]["shards_reused"] == 0, manifest2["build"]
    assert manifest2["columns"] == {"caption": "string", "weight": "float", "count": "int64", "tags": "string_list"}
    for name, (_, _, weight, count, _) in GOOD.items():
        assert records2[name]["weight"] == np.float32(float(weight)) and records2[name]["count"] == int(count)
