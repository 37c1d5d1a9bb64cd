"""DAG integrity: it imports cleanly, is light to parse, and is configured as documented."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

INSPECT = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=sys.argv[1])
out = {"errors": {k: str(v) for k, v in bag.import_errors.items()}, "dag_ids": sorted(bag.dag_ids)}
dag = bag.dags.get("image_tfrecords")
if dag is not None:
    out["tasks"] = {t.task_id: {
        "upstream": sorted(t.upstream_task_ids), "retries": t.retries,
        "trigger_rule": getattr(t.trigger_rule, "value", t.trigger_rule),
        "retry_delay": t.retry_delay.total_seconds(), "timeout": t.execution_timeout.total_seconds(),
        "backoff": t.retry_exponential_backoff, "mapped": any(c.__name__ == "MappedOperator" for c in type(t).__mro__),
        "map_index_template": getattr(t, "map_index_template", None),
        "max_active_tis_per_dagrun": t.max_active_tis_per_dagrun,
        "on_failure_callback": bool(t.on_failure_callback),
        "is_teardown": bool(getattr(t, "is_teardown", False))} for t in dag.tasks}
    out["schedule"] = dag.timetable.expression
    out["catchup"] = dag.catchup
    out["tags"] = sorted(dag.tags)
    out["start_date"] = dag.start_date.isoformat()
    out["doc_md"] = bool(dag.doc_md and "latest.json" in dag.doc_md)
    out["outlets"] = {t.task_id: [o.name for o in t.outlets] for t in dag.tasks if t.outlets}
    out["consumer_schedule"] = [o.name for o in bag.dags["image_tfrecords_consumer"].timetable.asset_condition.objects]
    out["params"] = {k: {"value": dag.params[k], "schema": dag.params.get_param(k).schema,
                         "description": dag.params.get_param(k).description} for k in dag.params.keys()}
    dag.params.validate()
print("RESULT" + json.dumps(out, default=str))
"""


@pytest.fixture(scope="module")
def dag_info(airflow_env: dict[str, str]) -> dict:
    result = subprocess.run([sys.executable, "-c", INSPECT, str(ROOT / "dags")], env=airflow_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.split("RESULT", 1)[1])


def test_dag_imports_without_errors(dag_info: dict) -> None:
    assert dag_info["errors"] == {}
    assert dag_info["dag_ids"] == ["image_tfrecords", "image_tfrecords_consumer"]


def test_publish_updates_the_asset_the_consumer_is_scheduled_on(dag_info: dict) -> None:
    assert dag_info["outlets"] == {"publish": ["image_tfrecords"]}
    assert dag_info["consumer_schedule"] == ["image_tfrecords"]
    assert all(task["on_failure_callback"] for task in dag_info["tasks"].values())


def test_task_graph(dag_info: dict) -> None:
    tasks = dag_info["tasks"]
    assert {k: v["upstream"] for k, v in tasks.items()} == {
        "discover": [], "inspect_images": ["discover"], "plan": ["discover", "inspect_images"],
        "write_shards": ["plan"], "gate": ["plan", "write_shards"], "approval": ["gate"],
        "publish": ["approval", "gate"], "discard_rejected": ["approval"], "clean_stale_staging": []}
    # plan runs when discover inspected a night's few files itself (inspect_images then maps over nothing, skipped).
    assert tasks["plan"]["trigger_rule"] == "none_failed_min_one_success"
    # gate (validate, card, gate) runs when there is no shard to write or copy (write_shards then maps over nothing).
    assert tasks["gate"]["trigger_rule"] == "none_failed_min_one_success"
    # publish runs after the gate passed (the approval is skipped) or after a person approved.
    assert tasks["publish"]["trigger_rule"] == "none_failed_min_one_success"
    # The cleanup of other versions' staging runs beside the build from its start, whether the run fails or not, and
    # does not decide the run's state.
    assert [k for k, v in tasks.items() if v["is_teardown"]] == ["clean_stale_staging"]
    writer = tasks["write_shards"]
    assert writer["mapped"] is True
    assert writer["map_index_template"] == "{{ shard_label }}"
    assert writer["max_active_tis_per_dagrun"] >= 2
    inspector = tasks["inspect_images"]  # one mapped task per chunk of the listing, named after it
    assert inspector["mapped"] is True
    assert inspector["map_index_template"] == "{{ chunk_label }}"
    assert inspector["max_active_tis_per_dagrun"] >= 2


def test_retries_timeouts_and_schedule(dag_info: dict) -> None:
    for task in dag_info["tasks"].values():
        assert task["retries"] >= 2 and task["retry_delay"] > 0 and task["backoff"]
        assert 0 < task["timeout"] <= 3 * 3600
    assert dag_info["schedule"] == "0 2 * * *"
    assert dag_info["catchup"] is False
    assert dag_info["start_date"].endswith("+00:00")
    assert "tfrecords" in dag_info["tags"]
    assert dag_info["doc_md"] is True


def test_params_defaults_make_a_valid_build_config(dag_info: dict) -> None:
    from image_tfrecords.config import BuildConfig

    params = {k: v["value"] for k, v in dag_info["params"].items()}
    assert set(params) >= {"source", "destination", "dataset", "splits", "salt", "shard_size_mb", "compression"}
    assert params["splits"] == {"train": 0.8, "validation": 0.1, "test": 0.1}
    assert dag_info["params"]["compression"]["schema"]["enum"] == ["none", "gzip"]
    for name, param in dag_info["params"].items():
        assert param["schema"].get("title") and param["description"], name
        assert param["schema"].get("section") in ("Input", "Output", "Splits", "Build", "Bad input",
                                                  "Images and features", "Publish gate"), name
    images = {"resize", "fit", "upscale", "encoding", "jpeg_quality", "channels", "columns", "label_separator"}
    assert {n for n, p in dag_info["params"].items() if p["schema"].get("section") == "Images and features"} == images
    assert (params["resize"], params["encoding"], params["channels"], params["columns"]) == ("none", "original", 0, {})
    assert (params["max_file_mb"], params["max_pixels"]) == (256, 89_478_485)
    assert (params["chunk_files"], params["chunk_mb"]) == (2000, 1000.0)
    cfg = BuildConfig(**{k: v for k, v in params.items() if k not in ("version", "force", "full_rebuild", "approval")},
                      version="20261101T020000Z", full=params["full_rebuild"])
    assert cfg.full is False  # incremental by default
    assert (params["gate"], params["accept_gate"], params["approval"]) == (False, False, False)  # the gate: opt-in


@pytest.mark.parametrize("dag_file", ["image_tfrecords_dag.py", "image_tfrecords_consumer.py"])
def test_parsing_the_dag_imports_no_heavy_modules(airflow_env: dict[str, str], dag_file: str) -> None:
    # botocore is not checked: the amazon provider imports it to normalise the s3:// Asset URI.
    heavy = ("tensorflow", "PIL", "numpy", "pandas", "boto3", "image_tfrecords.stages")
    probe = ("import runpy, sys; runpy.run_path(sys.argv[1]); "
             f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe, str(ROOT / "dags" / dag_file)],
                            env=airflow_env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"


def dag_module() -> Any:
    """The DAG file imported as a module (for its pure helper functions)."""
    sys.path.insert(0, str(ROOT / "dags"))
    try:
        import image_tfrecords_dag
    finally:
        sys.path.remove(str(ROOT / "dags"))
    return image_tfrecords_dag


def test_run_version_rule() -> None:
    import pendulum

    from image_tfrecords.airflow_glue import run_version

    date = pendulum.datetime(2026, 11, 1, 2, 0, tz="Europe/Paris")
    assert run_version({"params": {}, "logical_date": date, "run_id": "x"}) == "20261101T010000Z"
    assert run_version({"params": {"version": "v7"}, "logical_date": date, "run_id": "x"}) == "v7"
    assert run_version({"params": {}, "logical_date": None,
                        "run_id": "manual__2026-11-01T02:00:00+00:00"}) == "manual__2026-11-01T02-00-00-00-00"


def test_snapshot_rule_by_run_type() -> None:
    import types

    import pendulum

    from image_tfrecords.airflow_glue import snapshot_as_of

    date = pendulum.datetime(2026, 11, 1, 2, 0, tz="UTC")
    for run_type, expected in (("scheduled", "2026-11-01T02:00:00+00:00"), ("backfill", "2026-11-01T02:00:00+00:00"),
                               ("manual", None), ("asset_triggered", None)):
        context = {"dag_run": types.SimpleNamespace(run_type=run_type), "logical_date": date}
        assert snapshot_as_of(context) == expected, run_type
    assert snapshot_as_of({"dag_run": types.SimpleNamespace(run_type="scheduled"), "logical_date": None}) is None
