"""One option spec (include/image_tfrecords/options.py): the command line's flags, the DAG's Params and
BuildConfig's defaults and checks all come from it, and agree."""

from __future__ import annotations

import dataclasses

import pytest

from image_tfrecords import cli, options
from image_tfrecords.config import BuildConfig
from image_tfrecords.errors import ConfigError

POSITIONAL = ("source", "destination", "dataset", "version")  # BuildConfig fields without a default


def test_every_config_field_is_an_option_with_the_same_default() -> None:
    fields = {f.name: f for f in dataclasses.fields(BuildConfig)}
    declared = {o.name for o in options.OPTIONS if o.config}
    assert set(fields) - set(POSITIONAL) == declared - set(POSITIONAL)
    cfg = BuildConfig(source="s", destination="d", dataset="n", version="v")
    for name in declared - set(POSITIONAL):
        assert getattr(cfg, name) == options.default(name), name


def test_the_command_lines_defaults_make_the_default_config() -> None:
    args = cli._parser().parse_args(["build", "--source", "s", "--destination", "d", "--dataset", "n"])
    args.version = "v"
    assert cli.config_of(args) == BuildConfig(source="s", destination="d", dataset="n", version="v")
    assert args.force is False and args.modern_formats is True


@pytest.mark.parametrize("flag, name, value", [("--no-modern-formats", "modern_formats", False),
                                               ("--full", "full", True), ("--upscale", "upscale", True),
                                               ("--force", "force", True)])
def test_boolean_flags_turn_their_option_from_its_default(flag: str, name: str, value: bool) -> None:
    args = cli._parser().parse_args(["build", "--source", "s", "--destination", "d", "--dataset", "n", flag])
    assert getattr(args, name) is value


def test_the_dags_params_are_the_options_with_a_param(monkeypatch: pytest.MonkeyPatch) -> None:
    from image_tfrecords.airflow_glue import dag_params

    monkeypatch.setenv("IMAGE_TFRECORDS_DATASET", "flowers")
    params = dag_params()
    assert list(params) == [o.param_name for o in options.OPTIONS if o.param_name is not None]
    assert "full_rebuild" in params and "full" not in params and "as_of" not in params
    assert params["dataset"].value == "flowers"  # a deployment's default, from the environment
    assert params["shard_size_mb"].value == 100 and params["jpeg_quality"].value == 95
    schema = params["shard_size_mb"].schema
    assert schema["exclusiveMinimum"] == 0 and schema["maximum"] == 4096 and schema["type"] == "number"
    assert params["encoding"].schema["enum"] == list(options.ENCODINGS)
    assert params["version"].schema["type"] == ["string", "null"] and params["version"].value is None


@pytest.mark.parametrize("name, value, message", [
    ("shard_size_mb", 0, "shard_size_mb must be a number in (0, 4096], not 0"),
    ("shard_size_mb", True, "shard_size_mb must be a number in (0, 4096], not True"),
    ("max_pixels", 1.5, "max_pixels must be a whole number in [1, 1000000000], not 1.5"),
    ("max_reject_fraction", 1.1, "max_reject_fraction must be a number in [0, 1], not 1.1"),
    ("compression", "zip", "compression must be one of none, gzip, not 'zip'"),
    ("full", "yes", "full must be true or false, not 'yes'"),
    ("jpeg_quality", 101, "jpeg_quality must be a whole number in [1, 100], not 101"),
])
def test_a_bad_value_is_one_line_naming_the_option(name: str, value: object, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        BuildConfig(source="s", destination="d", dataset="n", version="v", **{name: value})
    assert str(error.value) == message


def test_the_params_table_lists_every_param_once() -> None:
    table = options.params_table().splitlines()
    names = [line.split("`")[1] for line in table[2:]]
    assert names == [o.param_name for o in options.OPTIONS if o.param_name is not None]
    assert all(line.count(" | ") == 2 for line in table[2:])  # three cells: no unescaped "|" inside


def test_every_option_says_what_it_changes_in_a_build() -> None:
    """``effect`` has no default (an option must say) and takes one of ``EFFECTS``; shard reuse reads it."""
    with pytest.raises(TypeError, match="effect"):
        options.Option("x", "string", "", "X", "An option.", options.BUILD)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="option x: effect 'bytes' is not one of records, split, shards"):
        options.Option("x", "string", "", "X", "An option.", options.BUILD, effect="bytes")  # type: ignore[arg-type]
    assert {o.effect for o in options.OPTIONS} == set(options.EFFECTS)
    assert [o.name for o in options.OPTIONS if o.rebuilds] == [
        "splits", "salt", "group_column", "shard_size_mb", "compression", "resize", "fit", "upscale", "encoding",
        "jpeg_quality", "channels", "columns", "label_separator"]


def test_a_manifest_from_before_an_option_recorded_its_default() -> None:
    from image_tfrecords.published.manifest import Manifest
    from image_tfrecords.rules.base_version import recorded

    plain = {"version": "v1", "num_records": 0, "classes": [], "splits": {}}
    old = Manifest.parse({**plain, "params": {"splits": {"train": 1.0}, "salt": "s", "shard_size_mb": 5}})
    assert [recorded(old, name) for name in ("salt", "group_column", "compression", "resize", "columns")] == \
        ["s", "", "none", "none", {}]
    assert recorded(Manifest.parse(plain), "salt") is None  # no params at all: nothing to compare with
