"""Build settings shared by the command line and the DAG, validated before any work starts."""

from __future__ import annotations

import functools
import json
import math
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from .errors import ConfigError
from .images.quality import FLAGS
from .images.transform import ImageOptions, Resize, check_options, parse_resize
from .options import DEFAULT_DATASET, DEFAULT_DESTINATION, DEFAULT_SPLITS, GATE_FIELDS, checked_by_spec, default
from .published.layout import STAGING, is_name
from .records.columns import TYPES, check_columns, check_separator
from .storage import is_s3, join

__all__ = ["DEFAULT_DATASET", "DEFAULT_DESTINATION", "DEFAULT_SPLITS", "BuildConfig", "ConfigError", "check_location",
           "check_splits", "parse_columns", "parse_splits"]
_OUTPUT_NEUTRAL = ("destination", "version", "as_of", "full", "chunk_files", "chunk_mb",
                   *GATE_FIELDS)  # the gate decides whether to publish, never what is built
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")  # used with match: "s3:", "gs:", "http:"




def _pairs(text: str, what: str, value: str) -> dict[str, str]:
    """``"a=x, b=y"`` -> ``{"a": "x", "b": "y"}`` (order kept); ConfigError for a part that is not
    ``NAME=VALUE`` or a name given twice."""
    pairs: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, item = part.partition("=")
        if not sep:
            raise ConfigError(f"{what} {part!r} is not NAME={value}")
        if name.strip() in pairs:
            raise ConfigError(f"{what} {name.strip()!r} is given more than once")
        pairs[name.strip()] = item
    return pairs


def parse_splits(text: str) -> dict[str, float]:
    """``"train=0.8,validation=0.1,test=0.1"`` -> ``{"train": 0.8, ...}`` (order kept)."""
    splits: dict[str, float] = {}
    for name, value in _pairs(text, "split", "FRACTION").items():
        try:
            splits[name] = float(value)
        except ValueError:
            raise ConfigError(f"split {name!r} has a fraction that is not a number: {value!r}") from None
    return splits


def parse_columns(text: str) -> dict[str, str]:
    """``"caption=string,weight=float"`` (or a JSON object) -> ``{"caption": "string", ...}``."""
    text = text.strip()
    if text.startswith("{"):
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"columns {text!r} is not a JSON object: {exc}") from None
        return check_columns(value)
    pairs = _pairs(text, "column", f"TYPE (types: {', '.join(TYPES)})")
    return check_columns({name: kind.strip() for name, kind in pairs.items()})


def check_location(what: str, value: Any) -> str:
    """A local path or ``s3://bucket/prefix``; URL-like typos (``s3:/b/x``, ``S3://``, ``gs://``) are errors,
    never a local folder named ``s3:``."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{what} is required (a local folder or s3://bucket/prefix)")
    if is_s3(value):
        bucket, _, prefix = value[len("s3://"):].partition("/")
        if not bucket:
            raise ConfigError(f"{what} {value!r} has no bucket name")
        if any(part in ("", ".", "..") for part in prefix.rstrip("/").split("/")) and prefix.strip("/"):
            raise ConfigError(f"{what} {value!r} has an empty, '.' or '..' path segment")
        return value
    if _SCHEME.match(value):
        rest = value.split(":", 1)[1].lstrip("/")
        hint = f" (did you mean s3://{rest}?)" if value[:3].lower() == "s3:" or value[:4].lower() == "s3a:" else ""
        raise ConfigError(f"{what} {value!r} is neither a local folder nor s3://bucket/prefix{hint}; "
                          "write ./NAME for a local folder whose name has a ':'")
    return value


def check_splits(splits: Any) -> dict[str, float]:
    """Validate split fractions: names are simple words, fractions in (0, 1], summing to 1."""
    if not isinstance(splits, dict) or not splits:
        raise ConfigError("splits must be a non-empty object like {\"train\": 0.8, \"test\": 0.2}")
    out: dict[str, float] = {}
    for name, fraction in splits.items():
        if not isinstance(name, str) or not is_name(name):
            raise ConfigError(f"split name {name!r} must be letters, digits, '.', '_' or '-'")
        if isinstance(fraction, bool) or not isinstance(fraction, int | float) or not 0 < fraction <= 1:
            raise ConfigError(f"split {name!r} fraction must be a number in (0, 1], not {fraction!r}")
        out[name] = float(fraction)
    if not math.isclose(sum(out.values()), 1.0, abs_tol=1e-6):
        raise ConfigError(f"split fractions must sum to 1, not {sum(out.values()):g}")
    return out


def measures_png(near_duplicate_bits: int, quality_reject: str) -> bool:
    """Whether inspection decodes a PNG's pixels for its perceptual hash and quality signals: only when a build
    decides on them (the near-duplicate search, a quality reject policy); a PNG is otherwise checked without
    its pixels, several times faster. One rule for a build's options and a published version's params."""
    return near_duplicate_bits > 0 or bool(quality_reject)


def _quality_flags(value: Any) -> str:
    """``quality_reject`` in normal form: known flags, comma-separated, in ``FLAGS`` order."""
    if not isinstance(value, str):
        raise ConfigError(f"quality_reject must be a string of comma-separated flags, not {value!r}")
    wanted = {flag.strip() for flag in value.split(",") if flag.strip()}
    if unknown := sorted(wanted - set(FLAGS)):
        raise ConfigError(f"quality_reject: unknown flag {', '.join(unknown)} (known: {', '.join(FLAGS)})")
    return ",".join(flag for flag in FLAGS if flag in wanted)


@dataclass(frozen=True)
class BuildConfig:
    """Everything that decides what one build produces, and where."""

    source: str
    destination: str
    dataset: str
    version: str
    splits: dict[str, float] = field(default_factory=lambda: default("splits"))
    salt: str = default("salt")
    group_column: str = default("group_column")  # labels.csv column that keys the split ("": the content hash)
    near_duplicate_bits: int = default("near_duplicate_bits")  # 0: no near-duplicate search
    near_duplicate_labels: str = default("near_duplicate_labels")  # reject | keep
    shard_size_mb: float = default("shard_size_mb")
    compression: str = default("compression")
    max_reject_fraction: float = default("max_reject_fraction")
    as_of: str | None = default("as_of")  # ISO 8601 time: only files modified at or before it (None: all)
    max_file_mb: float = default("max_file_mb")  # larger files are rejected (too_large) before they are read
    max_pixels: int = default("max_pixels")  # larger images are rejected (too_many_pixels) before they are decoded
    full: bool = default("full")  # a full rebuild: reuse nothing of the previous version (inspections, shards)
    # how inspection is cut into chunks (one mapped task each in the DAG); never changes the output
    chunk_files: int = default("chunk_files")
    chunk_mb: float = default("chunk_mb")
    # image options (see ``transform``): what each record stores
    resize: str = default("resize")  # none | longest:N | shortest:N | WxH
    fit: str = default("fit")  # with WxH: crop | pad | stretch
    upscale: bool = default("upscale")
    encoding: str = default("encoding")  # original | jpeg | png | raw
    jpeg_quality: int = default("jpeg_quality")
    channels: int = default("channels")  # 0: as decoded (raw: 3) | 1 | 3 | 4
    # labels.csv columns stored as features (name -> type, see ``columns``), and the separator of a
    # multi-label ``labels`` column and of list columns
    columns: dict[str, str] = field(default_factory=lambda: default("columns"))
    label_separator: str = default("label_separator")
    modern_formats: bool = default("modern_formats")  # HEIC/HEIF, AVIF, JPEG XL: decoded, or skipped and rejected
    quality_reject: str = default("quality_reject")  # comma-separated quality flags that reject an image
    # the publish gate (``rules.publish_gate``): on, its thresholds, and publishing despite a tripped gate
    gate: bool = default("gate")
    gate_reject_share: float = default("gate_reject_share")
    gate_class_share: float = default("gate_class_share")
    gate_quality_share: float = default("gate_quality_share")
    gate_near_duplicates_across_labels: int = default("gate_near_duplicates_across_labels")
    accept_gate: bool = default("accept_gate")

    def __post_init__(self) -> None:
        object.__setattr__(self, "resize", str(parse_resize(self.resize)))
        check_options(self.image_options)
        object.__setattr__(self, "columns", check_columns(self.columns))
        check_separator(self.label_separator)
        object.__setattr__(self, "quality_reject", _quality_flags(self.quality_reject))
        for what in ("salt", "group_column"):  # a None here would hash as "None" or pass for "not set"
            if not isinstance(getattr(self, what), str):
                raise ConfigError(f"{what} must be a string, not {getattr(self, what)!r}")
        if self.group_column in ("filename", "label", "labels"):
            raise ConfigError(f"group_column must name another labels.csv column than {self.group_column}: a "
                              "patient, camera or source document whose images go to one split")
        object.__setattr__(self, "splits", check_splits(self.splits))
        for what in ("source", "destination"):
            check_location(what, getattr(self, what))
        for what in ("dataset", "version"):
            value = getattr(self, what)
            if not isinstance(value, str) or not is_name(value):
                raise ConfigError(f"{what} {value!r} must start with a letter or digit and use only "
                                  "(at most 200) "
                                  "letters, digits, '.', '_' or '-'")
        for option in checked_by_spec():  # types, bounds and choices, one shape for all
            option.check(getattr(self, option.name))
        if self.as_of is not None:
            try:
                if datetime.fromisoformat(self.as_of).tzinfo is None:
                    raise ValueError
            except (TypeError, ValueError):
                raise ConfigError(f"as_of must be an ISO 8601 time with a time zone, not {self.as_of!r}") from None
        resize = self.image_options.resize  # a record bigger than max_pixels would be made for every image
        largest = resize.width * (resize.height if resize.kind == "exact" else resize.width)
        if resize.kind in ("exact", "longest") and largest > self.max_pixels and \
                (self.upscale or (resize.kind == "exact" and self.fit == "pad")):
            raise ConfigError(f"resize {resize} makes images of up to {largest} pixels, more than max_pixels "
                              f"{self.max_pixels}")

    @functools.cached_property
    def image_options(self) -> ImageOptions:
        """The image options, parsed once (the writer asks for them per record)."""
        resize = parse_resize(self.resize) if isinstance(self.resize, str) else Resize()
        return ImageOptions(resize, self.fit, self.upscale, self.encoding, self.jpeg_quality, self.channels)

    @property
    def cutoff(self) -> datetime | None:
        return datetime.fromisoformat(self.as_of) if self.as_of else None

    @property
    def fingerprint_params(self) -> dict[str, Any]:
        """The settings that decide a build's content (not where it goes or what it is called)."""
        params = {k: v for k, v in asdict(self).items() if k not in _OUTPUT_NEUTRAL}
        for name in ("group_column", "quality_reject"):  # unset: the fingerprint of a version from before them
            if not params[name]:
                del params[name]
        return params

    @property
    def png_pixels(self) -> bool:
        """Whether this build's inspection decodes PNG pixels (``measures_png``)."""
        return measures_png(self.near_duplicate_bits, self.quality_reject)

    @property
    def max_file_bytes(self) -> int:
        return int(self.max_file_mb * 1_000_000)

    @property
    def dataset_uri(self) -> str:
        """``DEST/DATASET``: where versions and ``latest.json`` live."""
        return join(self.destination, self.dataset)

    @property
    def version_uri(self) -> str:
        """``DEST/DATASET/VERSION``: the published version."""
        return join(self.dataset_uri, self.version)

    @property
    def staging_uri(self) -> str:
        """Where a build's intermediate files live until publish (never a published version)."""
        return join(self.dataset_uri, STAGING, self.version)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
