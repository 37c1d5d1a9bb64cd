"""Every param of the real DAG submits with its default from the Airflow UI's trigger form.

The form's rules, as Airflow 3.3's UI implements them (airflow-core/src/airflow/ui/src/components/FlexibleForm/):
a param is required when its schema has a type that is not a list holding "null" (``isParamRequired.tsx``); a
required param whose value is null, missing or "" marks its section red and disables the Trigger button
(``FlexibleForm.tsx``); a text field left empty sends null (``FieldString.tsx``). The value the form starts
from is the api-server's ``SerializedParam.dump()``: the default if it validates against the param's JSON
schema, else null. So a default of "" or None needs "null" in the type, and then a null coming back must build
the option's "not set".
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import jsonschema
import pytest

from image_tfrecords import options
from image_tfrecords.airflow_glue import build_config

ROOT = Path(__file__).resolve().parents[2]

# What the api-server answers the UI for the DAG's params (its details' ``params``): the DAG as the
# dag-processor serializes it, read back, each param dumped.
DUMP = r"""
import json, sys
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization
dag = DagBag(dag_folder=sys.argv[1]).dags["image_tfrecords"]
served = DagSerialization.from_dict(DagSerialization.to_dict(dag))
out = {k: {**served.params.get_param(k).dump(), "default": dag.params.get_param(k).value} for k in served.params}
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def served_params(airflow_env: dict[str, str]) -> dict[str, dict[str, Any]]:
    result = subprocess.run([sys.executable, "-c", DUMP, str(ROOT / "dags")], env=airflow_env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.split("RESULT", 1)[1])


def is_required(schema: dict[str, Any]) -> bool:
    """isParamRequired.tsx: a type is set, and it is not a list that holds "null"."""
    kind = schema.get("type")
    return bool(kind) and not (isinstance(kind, list) and "null" in kind)


def test_every_param_submits_with_its_default(served_params: dict[str, dict[str, Any]]) -> None:
    assert list(served_params) == [o.param_name for o in options.OPTIONS if o.param_name is not None]
    blocked = []
    for name, param in served_params.items():
        schema = param["schema"]
        jsonschema.validate(param["default"], schema, format_checker=jsonschema.FormatChecker())
        assert param["value"] == param["default"], f"{name}: the form starts from {param['value']!r}"
        if is_required(schema) and param["value"] in (None, ""):
            blocked.append(f"{name} (section {schema.get('section')}, type {schema.get('type')!r}, "
                           f"default {param['default']!r})")
    assert not blocked, "the trigger form marks these required and cannot be submitted: " + ", ".join(blocked)


def test_a_field_left_empty_builds_the_options_not_set_value(served_params: dict[str, dict[str, Any]]) -> None:
    """An optional field the person empties comes back as null: valid for its schema, and the build gets the
    option's default (its "not set")."""
    optional = [name for name, param in served_params.items() if not is_required(param["schema"])]
    assert {"salt", "group_column", "quality_reject", "version"} <= set(optional)
    params = {name: param["default"] for name, param in served_params.items()}
    for name in optional:
        jsonschema.validate(None, served_params[name]["schema"])
        params[name] = None
    context = {"params": params, "logical_date": None, "run_id": "manual__2026-11-20T02:00:00+00:00",
               "dag_run": SimpleNamespace(run_type="manual")}
    cfg = build_config(context)
    by_param = {o.param_name: o for o in options.OPTIONS if o.config}
    for name in optional:
        if name in by_param:
            assert getattr(cfg, by_param[name].name) == options.default(by_param[name].name), name
    assert cfg.version == "manual__2026-11-20T02-00-00-00-00"  # version empty: named after the run


def test_the_installed_ui_judges_required_params_this_way() -> None:
    """The rules above are the ones of the UI this venv serves (a new Airflow that changes them fails here)."""
    import airflow

    bundle = "".join(p.read_text(errors="replace")
                     for p in (Path(airflow.__file__).parent / "ui" / "dist" / "assets").glob("*.js"))
    required = re.compile(r"!!(\w+)\.schema\.type&&\(!Array\.isArray\(\1\.schema\.type\)\|\|"
                          r"!\1\.schema\.type\.includes\(`null`\)\)")
    empty = re.compile(r"\((\w+)\.value===null\|\|\1\.value===void 0\|\|\1\.value===``\)")
    assert required.search(bundle) and empty.search(bundle)
