"""Every build option, declared once: name, type, default, bounds, help and where it shows.

The command line's flags (``cli``), the DAG's trigger-form Params (``airflow_glue.dag_params``),
``BuildConfig``'s defaults and range checks (``config``) and the params table of docs/dag.md are all
made from ``OPTIONS``; an option is added here and nowhere else (plus what it does). Its ``effect``
says what it changes in a build's output; shard reuse (``rules.base_version``) and the split stage's
columnar path (``stages.split``) read it, and tests/pipeline/test_options_walk.py checks it option by
option. The values an option may take (``FITS``, ``ENCODINGS``, ...) live here too, so that the modules
implementing them and the checks share one list. Nothing here imports anything heavy.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass
from typing import Any, Literal

from .errors import ConfigError

FITS = ("crop", "pad", "stretch")
ENCODINGS = ("original", "jpeg", "png", "raw")
CHANNELS = (0, 1, 3, 4)
COMPRESSIONS = ("none", "gzip")
MAX_PIXELS = 89_478_485  # Pillow's default decompression-bomb limit
DEFAULT_SEPARATOR = "|"
DEFAULT_SPLITS = {"train": 0.8, "validation": 0.1, "test": 0.1}
DEFAULT_DESTINATION = "s3://datasets/image-tfrecords"  # the DAG's and the datasets page's default
DEFAULT_DATASET = "images"
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}"  # dataset, version and split names (layout.is_name)
RESIZE_PATTERN = r"^(none|(longest|shortest):[0-9]+|[0-9]+x[0-9]+)$"

INPUT, OUTPUT, SPLITS, BUILD, BAD_INPUT, IMAGES = ("Input", "Output", "Splits", "Build", "Bad input",
                                                   "Images and features")
GATE = "Publish gate"

# What an option changes in a build's output (``Option.effect``), one of:
# "records": what each record holds (the stored image, its features' values);
# "split": which split each image goes to, published records included;
# "shards": how the records are cut into shard files and written (size, compression);
# "selection": which files become records (rejects, skips) and where new ones go, decided file by file: an
#   incremental build adds and drops records and keeps the rest as published;
# "none": nothing a build stores: where it goes, how it runs, whether it publishes.
Effect = Literal["records", "split", "shards", "selection", "none"]
EFFECTS: tuple[Effect, ...] = ("records", "split", "shards", "selection", "none")
REBUILDS: tuple[Effect, ...] = ("records", "split", "shards")  # a change forbids reusing the base's shards


@dataclass(frozen=True)
class Option:
    """One option. ``kind``: its JSON-schema type (``string``, ``number``, ``integer``, ``boolean``,
    ``object``). ``flag``: the command line's (None: not a flag; ``--no-X`` for a boolean that is on by
    default); ``param``: the DAG's Param name (None: no Param); ``config``: False for an option that is
    not a ``BuildConfig`` field (``force``, the form's ``version``). ``nullable``: an empty value means "not
    set": the Param's type admits null, which is what the trigger form sends for an empty field (and a field
    whose type does not admit null is one the form requires filled in), and a None from the form stands for
    ``default`` (``airflow_glue.build_config``). ``effect``: what it changes in the output (``EFFECTS``); given
    for every option, with no default, so that a new option must say."""

    name: str
    kind: str
    default: Any
    title: str
    help: str
    section: str
    _: KW_ONLY
    effect: Effect
    flag: str | None = ""  # "": --name-with-dashes
    param: str | None = ""  # "": the option's name
    config: bool = True
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    choices: tuple[Any, ...] | None = None
    pattern: str | None = None
    min_length: int | None = None
    max_length: int | None = None
    nullable: bool = False
    required_flag: bool = False  # the command line has no default for it
    env: str | None = None  # the environment variable that sets the DAG's default (Docker Compose sets them)

    def __post_init__(self) -> None:
        if self.effect not in EFFECTS:
            raise ValueError(f"option {self.name}: effect {self.effect!r} is not one of {', '.join(EFFECTS)}")

    @property
    def rebuilds(self) -> bool:
        """Whether a change of this option forbids reusing the previous version's shards (``REBUILDS``)."""
        return self.effect in REBUILDS

    def dag_default(self) -> Any:
        """The DAG's default: ``env``'s value where it is set, else ``default``."""
        value = os.environ.get(self.env) if self.env else None
        return value if value else default(self.name)

    @property
    def cli_flag(self) -> str | None:
        if self.flag is None:
            return None
        if self.flag:
            return self.flag
        return "--" + self.name.replace("_", "-")

    @property
    def param_name(self) -> str | None:
        return None if self.param is None else (self.param or self.name)

    def bounds(self) -> str:
        """``(0, 4096]``-style interval of a number option ("" if unbounded)."""
        if self.minimum is None and self.maximum is None:
            return ""
        low = "(" if self.exclusive_minimum else "["
        return f"{low}{_num(self.minimum)}, {_num(self.maximum)}]"

    def check(self, value: Any) -> Any:
        """``value`` if it has this option's type and lies in its bounds and choices; else ConfigError
        in one line (``shard_size_mb must be a number in (0, 4096], not 0``)."""
        if value is None and self.nullable:
            return value
        kind_ok = {
            "boolean": isinstance(value, bool),
            "integer": isinstance(value, int) and not isinstance(value, bool),
            "number": isinstance(value, int | float) and not isinstance(value, bool),
            "string": isinstance(value, str),
            "object": isinstance(value, dict),
        }[self.kind]
        if self.choices is not None and (not kind_ok or value not in self.choices):
            raise ConfigError(f"{self.name} must be one of {', '.join(map(str, self.choices))}, not {value!r}")
        if self.kind == "boolean" and not kind_ok:
            raise ConfigError(f"{self.name} must be true or false, not {value!r}")
        if self.kind in ("integer", "number") and not (kind_ok and self._within(value)):
            what = "a whole number" if self.kind == "integer" else "a number"
            where = f" in {self.bounds()}" if self.bounds() else ""
            raise ConfigError(f"{self.name} must be {what}{where}, not {value!r}")
        return value

    def _within(self, value: float) -> bool:
        if self.minimum is not None and (value <= self.minimum if self.exclusive_minimum else value < self.minimum):
            return False
        return self.maximum is None or value <= self.maximum

    def schema(self) -> dict[str, Any]:
        """The JSON-schema keywords of the DAG's Param (type, bounds, enum, pattern)."""
        out: dict[str, Any] = {"type": [self.kind, "null"] if self.nullable else self.kind}
        if self.minimum is not None:
            out["exclusiveMinimum" if self.exclusive_minimum else "minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.choices is not None:
            out["enum"] = list(self.choices)
        if self.pattern is not None:
            out["pattern"] = self.pattern
        if self.min_length is not None:
            out["minLength"] = self.min_length
        if self.max_length is not None:
            out["maxLength"] = self.max_length
        return out


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


OPTIONS: tuple[Option, ...] = (
    Option("source", "string", "/opt/airflow/data/sample", "Source",
           "Local folder or s3://bucket/prefix holding one folder per class (or a labels.csv with columns "
           "filename,label).", INPUT,
           effect="selection", min_length=1, required_flag=True, env="IMAGE_TFRECORDS_SOURCE"),
    Option("destination", "string", DEFAULT_DESTINATION, "Destination",
           "Local folder or s3://bucket/prefix; the dataset is published under DESTINATION/DATASET/VERSION/.",
           OUTPUT, effect="none", min_length=1, required_flag=True, env="IMAGE_TFRECORDS_DESTINATION"),
    Option("dataset", "string", DEFAULT_DATASET, "Dataset name",
           "Folder name of the dataset under the destination.", OUTPUT, effect="none", pattern=f"^{NAME_PATTERN}$",
           required_flag=True, env="IMAGE_TFRECORDS_DATASET"),
    Option("splits", "object", DEFAULT_SPLITS, "Splits",
           "Split name -> fraction of images; fractions must sum to 1. Changing them reassigns images.", SPLITS,
           effect="split"),
    Option("salt", "string", "", "Split salt",
           "Seeds the split assignment; keep it fixed so images never move.", SPLITS, effect="split", nullable=True),
    Option("group_column", "string", "", "Group column",
           "A labels.csv column whose value keys the split instead of the image's content hash, so that all of a "
           "patient's, camera's or source document's images land in one split (an empty cell: the content hash). "
           "Changing it reassigns images.", SPLITS, effect="split", max_length=200, nullable=True),
    Option("near_duplicate_bits", "integer", 8, "Near-duplicate distance (bits)",
           "Images whose perceptual hashes differ in at most this many of 63 bits are near-duplicates (re-encodes, "
           "resizes, small crops): a group of them goes to one split, and published records never move. Images "
           "under 128 pixels on their shorter side or nearly flat (contrast under 5) take no part: their hash "
           "is unreliable. 0: off.", SPLITS, effect="selection", minimum=0, maximum=24),
    Option("near_duplicate_labels", "string", "reject", "Near-duplicates under two labels",
           "reject: like identical files under two labels, none is stored (near_duplicate_label_conflict); keep: "
           "store them (in one split) and count them.", SPLITS, effect="selection", choices=("reject", "keep")),
    Option("shard_size_mb", "number", 100.0, "Shard size (MB)",
           "Target size of each TFRecord shard, in MB (10^6 bytes).", BUILD, effect="shards",
           minimum=0, exclusive_minimum=True, maximum=4096),
    Option("compression", "string", "none", "Compression",
           "none writes .tfrecord files; gzip writes .tfrecord.gz.", BUILD, effect="shards", choices=COMPRESSIONS),
    Option("max_reject_fraction", "number", 0.2, "Max reject share",
           "Fail before publishing if more than this share of the files is rejected (corrupt, duplicate, "
           "unsupported...).", BUILD, effect="none", minimum=0, maximum=1),
    Option("quality_reject", "string", "", "Reject images flagged",
           "Image-quality flags that reject an image (reason low_quality), comma-separated, from dark, bright, flat, "
           "blurry, grey_as_colour, tiny, odd_aspect; empty (default): flags are only reported (labels.csv "
           "quality column, the card).", BAD_INPUT, effect="selection", max_length=200, nullable=True),
    Option("max_file_mb", "number", 256.0, "Max file size (MB)",
           "Files larger than this are rejected (too_large) without being read.", BAD_INPUT, effect="selection",
           minimum=0, exclusive_minimum=True, maximum=1_000_000),
    Option("max_pixels", "integer", MAX_PIXELS, "Max pixels per image",
           "Images with more pixels are rejected (too_many_pixels) before decoding; lower it to bound a "
           "worker's memory (about 8 bytes per pixel at worst).", BAD_INPUT,
           effect="selection", minimum=1, maximum=1_000_000_000),
    Option("force", "boolean", False, "Rebuild even if unchanged",
           "Build and publish even when the source listing and params are the same as the previous published "
           "version's (otherwise the run skips the work).", BUILD, effect="none", config=False),
    Option("full", "boolean", False, "Full rebuild",
           "Reuse nothing of the previous version: re-read every image and rewrite every shard (also compacts "
           "the shards); builds even when unchanged.", BUILD, effect="none", param="full_rebuild"),
    Option("chunk_files", "integer", 2000, "Files per inspection task",
           "Inspection runs as one mapped task per chunk of at most this many files (raised when there would be "
           "more than 1024 chunks). Never changes the output.", BUILD, effect="none", minimum=1, maximum=10_000_000),
    Option("chunk_mb", "number", 1000.0, "MB per inspection task",
           "... or at most this many MB of source files.", BUILD, effect="none",
           minimum=0, exclusive_minimum=True, maximum=1_000_000),
    Option("resize", "string", "none", "Resize",
           "none (default), longest:N, shortest:N or WxH (e.g. 224x224). Lanczos filter; images are never "
           "enlarged unless Upscale is on.", IMAGES, effect="records", pattern=RESIZE_PATTERN),
    Option("fit", "string", "crop", "Fit (for WxH)",
           "crop: cover WxH and cut the centre; pad: fit inside and pad with black; stretch: ignore the aspect "
           "ratio.", IMAGES, effect="records", choices=FITS),
    Option("upscale", "boolean", False, "Upscale", "Let Resize enlarge images smaller than the target.", IMAGES,
           effect="records"),
    Option("encoding", "string", "original", "Encoding",
           "original: the file byte for byte unless resized or converted; jpeg: every image re-encoded at the "
           "JPEG quality; png: lossless; raw: decoded uint8 pixels (image/raw with image/shape), so training "
           "skips decoding.", IMAGES, effect="records", choices=ENCODINGS),
    Option("jpeg_quality", "integer", 95, "JPEG quality", "Quality of re-encoded JPEGs (1-100).", IMAGES,
           effect="records",
           minimum=1, maximum=100),
    Option("channels", "integer", 0, "Channels",
           "0: as decoded (raw: 3); 1: grey; 3: RGB; 4: RGBA (not with jpeg).", IMAGES,
           effect="records", choices=CHANNELS),
    Option("columns", "object", {}, "Metadata columns",
           'labels.csv columns stored as features, name -> type, e.g. {"caption": "string", "weight": "float", '
           '"tags": "string_list"}; types: string, int64, float, string_list, int64_list, float_list. A bad value '
           "rejects its image.", IMAGES, effect="records"),
    Option("label_separator", "string", DEFAULT_SEPARATOR, "Label separator",
           "Separates the classes of a labels.csv 'labels' column (several classes per image) and the items of "
           "list columns.", IMAGES, effect="records", min_length=1, max_length=1),
    Option("modern_formats", "boolean", True, "HEIC, AVIF and JPEG XL",
           "Decode HEIC/HEIF, AVIF and JPEG XL photos (stored as lossless PNG or the chosen encoding); off: their "
           "files are skipped and counted.", INPUT, effect="selection", flag="--no-modern-formats"),
    Option("gate", "boolean", False, "Publish gate",
           "Before publishing, compare the build with the previous published version (reject share, class shares, "
           "quality-flag shares, near-duplicates across labels) and stop if one moved more than its threshold "
           "(default: off, publish without comparing).", GATE, effect="none"),
    Option("gate_reject_share", "number", 0.05, "Gate: reject share rise",
           "The gate trips when the share of files rejected rises by more than this (absolute: 0.05 is 5 points); "
           "1: never.", GATE, effect="none", minimum=0, maximum=1),
    Option("gate_class_share", "number", 0.1, "Gate: class share change",
           "... when a class's share of the records changes by more than this either way (a new class counts "
           "from 0, a vanished one to 0); 1: never.", GATE, effect="none", minimum=0, maximum=1),
    Option("gate_quality_share", "number", 0.1, "Gate: quality-flag share change",
           "... when the share of records with an image-quality flag changes by more than this (compared only "
           "when both versions record the flags); 1: never.", GATE, effect="none", minimum=0, maximum=1),
    Option("gate_near_duplicates_across_labels", "integer", 0, "Gate: near-duplicates across labels",
           "... when near-duplicate groups kept across labels plus near_duplicate_label_conflict rejects rise by "
           "more than this many (0: any rise).", GATE, effect="none", minimum=0, maximum=1_000_000_000),
    Option("accept_gate", "boolean", False, "Accept a tripped gate",
           "Publish even if the gate trips; the manifest's build.gate records it (verdict accepted).", GATE,
           effect="none"),
    Option("approval", "boolean", False, "Ask a person when the gate trips",
           "When the gate trips, wait for a person to approve (publish) or reject (discard the build) in the "
           "Airflow UI's Required Actions, instead of failing the run.", GATE, effect="none", flag=None, config=False),
    Option("as_of", "string", None, "As of",
           "Only files modified at or before this ISO 8601 time (default: all).", INPUT,
           effect="selection", param=None, nullable=True),
    Option("version", "string", None, "Version (optional)",
           "Override the version name; empty means the run's logical date.", OUTPUT, effect="none", nullable=True,
           flag=None, config=False),
)

BY_NAME = {option.name: option for option in OPTIONS}
GATE_FIELDS = tuple(o.name for o in OPTIONS if o.section == GATE and o.config)  # not in the build's fingerprint


def default(name: str) -> Any:
    """The default of option ``name`` (a fresh copy of a dict default)."""
    value = BY_NAME[name].default
    return dict(value) if isinstance(value, dict) else value


def checked_by_spec() -> Iterator[Option]:
    """The ``BuildConfig`` fields whose type, bounds and choices ``Option.check`` decides alone: numbers,
    booleans and choices outside the image options (``transform.check_options`` checks those, with their
    combinations); locations, names, splits, resize, columns and the separator have checks of their own."""
    return (o for o in OPTIONS if o.config and o.section != IMAGES
            and (o.kind in ("number", "integer", "boolean") or o.choices is not None))


def params_table() -> str:
    """docs/dag.md's table of the DAG's params (name, default, meaning), from ``OPTIONS``."""
    rows = ["| Param | Default | Meaning |", "|---|---|---|"]
    for o in OPTIONS:
        if o.param_name is None:
            continue
        value = o.default
        shown = ("none" if value is None else str(value).lower() if isinstance(value, bool)
                 else _num(value) if isinstance(value, int | float) else
                 json.dumps(value) if isinstance(value, dict) else value or '""')
        shown = f"`{shown}`" + (f" (or `${o.env}`)" if o.env else "") + (", may be left empty" if o.nullable else "")
        rows.append(f"| `{o.param_name}` | {shown} | {o.help} |".replace("`|`", "`\\|`"))
    return "\n".join(rows)
