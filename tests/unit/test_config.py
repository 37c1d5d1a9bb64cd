"""Build settings: split parsing and validation, BuildConfig checks, and the URIs it derives."""

from __future__ import annotations

from typing import Any

import pytest

from image_tfrecords.config import DEFAULT_SPLITS, BuildConfig, ConfigError, check_splits, parse_splits


def _config(**overrides: Any) -> BuildConfig:
    values: dict[str, Any] = {"source": "/data/flowers", "destination": "/data/out", "dataset": "flowers",
                              "version": "v1"}
    return BuildConfig(**{**values, **overrides})


# -- parse_splits ----------------------------------------------------------------------------------
@pytest.mark.parametrize("text,expected", [
    ("train=0.8,validation=0.1,test=0.1", {"train": 0.8, "validation": 0.1, "test": 0.1}),
    (" train = 0.5 , test=0.5 ", {"train": 0.5, "test": 0.5}),
    ("train=1", {"train": 1.0}),
    ("train=0.8,,test=0.2,", {"train": 0.8, "test": 0.2}),
    ("a=1e-1,b=9E-1", {"a": 0.1, "b": 0.9}),
    ("", {}),
])
def test_parse_splits(text: str, expected: dict[str, float]) -> None:
    parsed = parse_splits(text)
    assert parsed == expected
    assert list(parsed) == list(expected)  # order kept


def test_parse_splits_keeps_order() -> None:
    assert list(parse_splits("test=0.1,train=0.8,validation=0.1")) == ["test", "train", "validation"]


@pytest.mark.parametrize("text,message", [
    ("train", "'train' is not NAME=FRACTION"),
    ("train=0.8,test", "'test' is not NAME=FRACTION"),
    ("train=abc", "split 'train' has a fraction that is not a number: 'abc'"),
    ("train=", "not a number"),
    ("train=0.8;test=0.2", "not a number"),
])
def test_parse_splits_errors(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_splits(text)
    assert message in str(info.value)


def test_parse_splits_rejects_repeated_names() -> None:
    with pytest.raises(ConfigError):
        check_splits(parse_splits("train=0.8,test=0.2,test=0.2"))


# -- check_splits ----------------------------------------------------------------------------------
@pytest.mark.parametrize("splits", [
    {"train": 0.8, "validation": 0.1, "test": 0.1},
    {"all": 1},
    {"a": 0.3333333, "b": 0.3333333, "c": 0.3333334},
    {"train.v2": 0.5, "hold_out-1": 0.5},
    {"0": 0.5, "B": 0.5},
])
def test_check_splits_accepts(splits: dict[str, float]) -> None:
    checked = check_splits(splits)
    assert checked == splits
    assert all(type(v) is float for v in checked.values())
    assert list(checked) == list(splits)


@pytest.mark.parametrize("splits,message", [
    ({"train": 0.8, "test": 0.1}, "must sum to 1, not 0.9"),
    ({"train": 0.8, "test": 0.3}, "must sum to 1, not 1.1"),
    ({"train": 1.2, "test": -0.2}, "fraction must be a number in (0, 1]"),
    ({"train": 1.0, "test": 0}, "'test' fraction must be a number in (0, 1], not 0"),
    ({"train": 0.5, "test": -0.5}, "not -0.5"),
    ({"train": "0.5", "test": 0.5}, "not '0.5'"),
    ({"train": True}, "not True"),
    ({"train": None}, "not None"),
    ({"train": float("nan")}, "not nan"),
    ({"": 1.0}, "split name '' must be"),
    ({"train set": 1.0}, "split name 'train set'"),
    ({"../x": 1.0}, "split name '../x'"),
    ({"a/b": 1.0}, "split name 'a/b'"),
    ({"_train": 1.0}, "split name '_train'"),
    ({1: 1.0}, "split name 1"),
    ({}, "non-empty"),
    (None, "non-empty"),
    ([("train", 1.0)], "non-empty"),
    ("train=1", "non-empty"),
])
def test_check_splits_errors(splits: Any, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_splits(splits)
    assert message in str(info.value)


def test_config_error_is_a_value_error() -> None:
    assert issubclass(ConfigError, ValueError)


# -- BuildConfig -----------------------------------------------------------------------------------
def test_defaults() -> None:
    cfg = _config()
    assert cfg.splits == DEFAULT_SPLITS
    assert cfg.splits is not DEFAULT_SPLITS
    assert (cfg.salt, cfg.shard_size_mb, cfg.compression) == ("", 100.0, "none")


def test_splits_are_validated_and_normalised() -> None:
    cfg = _config(splits={"train": 1})
    assert cfg.splits == {"train": 1.0} and type(cfg.splits["train"]) is float
    with pytest.raises(ConfigError, match="sum to 1"):
        _config(splits={"train": 0.5})


def test_to_dict_round_trips() -> None:
    cfg = _config(splits={"a": 0.25, "b": 0.75}, salt="pepper", shard_size_mb=0.5, compression="gzip",
                  max_reject_fraction=0.5)
    assert cfg.to_dict() == {"source": "/data/flowers", "destination": "/data/out", "dataset": "flowers",
                             "version": "v1", "splits": {"a": 0.25, "b": 0.75}, "salt": "pepper",
                             "shard_size_mb": 0.5, "compression": "gzip", "max_reject_fraction": 0.5,
                             "as_of": None, "max_file_mb": 256.0, "max_pixels": 89_478_485, "full": False,
                             "chunk_files": 2000, "chunk_mb": 1000.0, "resize": "none", "fit": "crop",
                             "upscale": False, "encoding": "original", "jpeg_quality": 95, "channels": 0,
                             "columns": {}, "label_separator": "|", "modern_formats": True,
                             "near_duplicate_bits": 8, "near_duplicate_labels": "reject", "group_column": "",
                             "quality_reject": "",
                             "gate": False, "gate_reject_share": 0.05, "gate_class_share": 0.1,
                             "gate_quality_share": 0.1, "gate_near_duplicates_across_labels": 0,
                             "accept_gate": False}
    assert BuildConfig(**cfg.to_dict()) == cfg


def test_an_unset_group_column_leaves_the_fingerprint_as_before_the_option() -> None:
    """Versions published before ``group_column`` existed are still ``unchanged`` when nothing changed."""
    assert "group_column" not in _config().fingerprint_params
    assert _config(group_column="patient").fingerprint_params["group_column"] == "patient"


def test_the_publish_gate_options_are_not_part_of_the_fingerprint() -> None:
    """The gate decides whether a build is published, never what it holds: changing it must not rebuild."""
    gated = _config(gate=True, gate_class_share=0.5, gate_near_duplicates_across_labels=3, accept_gate=True)
    assert gated.fingerprint_params == _config().fingerprint_params
    with pytest.raises(ConfigError, match=r"gate_reject_share must be a number in \[0, 1\], not -0.1"):
        _config(gate_reject_share=-0.1)


def test_full_is_a_bool_and_not_part_of_the_fingerprint() -> None:
    """A full rebuild makes the same content: --full must not make an unchanged source look changed."""
    assert _config(full=True).fingerprint_params == _config().fingerprint_params
    with pytest.raises(ConfigError, match="full must be true or false"):
        _config(full="yes")


@pytest.mark.parametrize("field,value", [
    ("dataset", ""), ("dataset", "my dataset"), ("dataset", "../up"), ("dataset", "a/b"), ("dataset", ".hidden"),
    ("dataset", "-x"), ("dataset", "_staging"), ("dataset", "naïve"), ("dataset", None), ("dataset", 5),
    ("version", ""), ("version", "v1/x"), ("version", ".."), ("version", "_staging"), ("version", "v 1"),
    ("version", "v1:2"), ("version", None),
])
def test_bad_names(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"{field} .* must start with a letter or digit"):
        _config(**{field: value})


@pytest.mark.parametrize("field,value", [("dataset", "flowers-102_v2.1"), ("version", "2024.11.22"),
                                         ("version", "V1"), ("dataset", "0")])
def test_good_names(field: str, value: str) -> None:
    assert getattr(_config(**{field: value}), field) == value


@pytest.mark.parametrize("overrides", [{"version": "v1\n"}, {"dataset": "flowers\n"},
                                       {"splits": {"train\n": 1.0}}])
def test_names_with_trailing_newline_are_rejected(overrides: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        _config(**overrides)


@pytest.mark.parametrize("value", ["zip", "GZIP", "", "gz", None])
def test_bad_compression(value: Any) -> None:
    with pytest.raises(ConfigError, match="compression must be one of none, gzip"):
        _config(compression=value)


@pytest.mark.parametrize("value", ["none", "gzip"])
def test_good_compression(value: str) -> None:
    assert _config(compression=value).compression == value


@pytest.mark.parametrize("value", [0, -1, 4096.01, 10**6, "100", None, True, float("nan"), float("inf")])
def test_bad_shard_size(value: Any) -> None:
    with pytest.raises(ConfigError, match=r"shard_size_mb must be a number in \(0, 4096\]"):
        _config(shard_size_mb=value)


@pytest.mark.parametrize("value", [0.001, 1, 100, 4096])
def test_good_shard_size(value: float) -> None:
    assert _config(shard_size_mb=value).shard_size_mb == value


@pytest.mark.parametrize("field", ["source", "destination"])
@pytest.mark.parametrize("value", ["", "   ", None, 7])
def test_missing_source_or_destination(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=f"{field} is required"):
        _config(**{field: value})


@pytest.mark.parametrize("field", ["source", "destination"])
@pytest.mark.parametrize("value", ["s3://", "s3:///", "s3:///prefix"])
def test_s3_without_bucket(field: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"{field} '{value}' has no bucket name"):
        _config(**{field: value})


# -- URIs ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("destination,dataset_uri", [
    ("/data/out", "/data/out/flowers"),
    ("/data/out/", "/data/out/flowers"),
    ("relative/out", "relative/out/flowers"),
    ("s3://bucket", "s3://bucket/flowers"),
    ("s3://bucket/", "s3://bucket/flowers"),
    ("s3://bucket/some/prefix", "s3://bucket/some/prefix/flowers"),
    ("s3://bucket/some/prefix/", "s3://bucket/some/prefix/flowers"),
])
def test_uris(destination: str, dataset_uri: str) -> None:
    cfg = _config(destination=destination, version="2024-11-22")
    assert cfg.dataset_uri == dataset_uri
    assert cfg.version_uri == f"{dataset_uri}/2024-11-22"
    assert cfg.staging_uri == f"{dataset_uri}/_staging/2024-11-22"


def test_staging_never_collides_with_a_version() -> None:
    cfg = _config()
    assert cfg.staging_uri != cfg.version_uri
    assert not cfg.version_uri.startswith(cfg.staging_uri)
    with pytest.raises(ConfigError):
        _config(version="_staging")  # a version can never be named like the staging folder


def test_s3_source_with_bucket_only_is_fine() -> None:
    cfg = _config(source="s3://images", destination="s3://datasets/tfrecords")
    assert cfg.version_uri == "s3://datasets/tfrecords/flowers/v1"


def test_config_is_frozen() -> None:
    cfg = _config()
    with pytest.raises(AttributeError):
        cfg.version = "v2"  # type: ignore[misc]


@pytest.mark.parametrize(("value", "hint"), [("s3:/bucket/x", "s3://bucket/x"), ("s3:bucket/x", "s3://bucket/x"),
                                             ("S3://bucket/x", "s3://bucket/x"), ("s3a://bucket/x", "s3://bucket/x"),
                                             ("gs://bucket/x", ""), ("https://host/x", "")])
def test_url_typos_are_errors_not_local_folders(value: str, hint: str) -> None:
    with pytest.raises(ConfigError, match="neither a local folder nor s3://bucket/prefix") as err:
        _config(destination=value)
    assert hint in str(err.value)
    with pytest.raises(ConfigError):
        _config(source=value)


@pytest.mark.parametrize("value", ["s3://bucket//x", "s3://bucket/a/../b", "s3://bucket/./a"])
def test_s3_prefixes_with_empty_or_dot_segments_are_errors(value: str) -> None:
    with pytest.raises(ConfigError, match="path segment"):
        _config(destination=value)


def test_local_names_with_a_colon_are_written_with_a_dot_slash() -> None:
    assert _config(destination="./s3:odd").destination == "./s3:odd"
    assert _config(source="s3://bucket").source == "s3://bucket"


@pytest.mark.parametrize(("field", "value"), [("max_file_mb", 0), ("max_file_mb", -1), ("max_file_mb", True),
                                              ("max_pixels", 0), ("max_pixels", 1.5), ("max_pixels", 2 * 10**9)])
def test_limits_are_checked(field: str, value: Any) -> None:
    with pytest.raises(ConfigError, match=field):
        _config(**{field: value})
