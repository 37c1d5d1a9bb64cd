"""``manifest.json``, typed: what a published version holds, read through one parser.

``Manifest.parse`` reads every manifest this project has published: the current format
(``format_version`` 1), and the versions before it, which have no ``format_version`` and lack the
fields added since (``build``, ``image``, ``columns``, ``labels_sha256``, ...). Each absent field
gets its meaning here, once: "no previous version", "images stored as read", "not recorded". A
manifest that is not an object with the fields every version has (``version``, ``classes``,
``splits`` with their shards) is ``DamagedFile``.

The project's code uses the attributes. A ``Manifest`` is also a read-only mapping of the JSON as it
was read, so users' code written against the JSON (``loader.info(uri)["splits"]``) keeps working.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import DamagedFile
from ..options import DEFAULT_SEPARATOR, default
from ..records.schema import RAW_KEY

FORMAT_VERSION = 1  # 1: the first versioned format (0.5.0); absent: an older manifest


@dataclass(frozen=True)
class ShardEntry:
    """One shard: its file (relative to the version), counts and checksums; ``index_sha256`` is None for
    versions made before ``.tfindex`` digests; ``origin`` is ``reused_from`` or ``rewritten_from``."""

    file: str
    num_records: int
    num_bytes: int
    sha256: str
    index_sha256: str | None = None
    reused_from: Mapping[str, str] | None = None
    rewritten_from: Mapping[str, str] | None = None


@dataclass(frozen=True)
class SplitEntry:
    num_records: int
    shards: tuple[ShardEntry, ...]

    @property
    def num_bytes(self) -> int:
        return sum(s.num_bytes for s in self.shards)


@dataclass(frozen=True)
class Manifest(Mapping[str, Any]):
    """A published version's manifest (see the module)."""

    format_version: int | None
    dataset: str
    version: str
    num_records: int
    classes: tuple[str, ...]
    splits: Mapping[str, SplitEntry]
    compression: str = "none"
    num_rejected: int = 0
    num_skipped: int = 0
    skipped_by_kind: Mapping[str, int] = field(default_factory=dict)
    rejects_by_reason: Mapping[str, int] = field(default_factory=dict)
    previous_version: str | None = None
    source: str = ""
    source_fingerprint: str = ""
    as_of: str | None = None
    features: Mapping[str, Any] | None = None  # None: made before the manifest listed them
    image: Mapping[str, Any] | None = None  # None: made before the image options (stored as read: ``image_options``)
    multi_label: bool = False
    label_separator: str | None = None  # None: not recorded (made before multi-label: ``separator``)
    columns: Mapping[str, str] = field(default_factory=dict)
    labels_sha256: str | None = None  # None: not recorded (made before 0.5.0)
    inspected_sha256: str | None = None  # None: not recorded (0.7.4 and before)
    build: Mapping[str, Any] = field(default_factory=dict)  # empty: made before 0.3.0
    params: Mapping[str, Any] = field(default_factory=dict)
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def parse(cls, raw: Any, where: str = "manifest.json") -> Manifest:
        """The manifest of the JSON value ``raw`` (read from ``where``); DamagedFile unless it has the
        fields every version has, with the right types."""
        if not isinstance(raw, dict):
            raise DamagedFile(f"{where} is not a JSON object: the version's manifest is damaged")
        try:
            splits = {name: SplitEntry(int(info["num_records"]), tuple(_shard(s) for s in info["shards"]))
                      for name, info in raw["splits"].items()}
            given = {key: raw[key] for key in _OPTIONAL if raw.get(key) is not None}
            return cls(format_version=raw.get("format_version"), dataset=str(raw.get("dataset", "")),
                       version=str(raw["version"]), num_records=int(raw["num_records"]),
                       classes=tuple(str(c) for c in raw["classes"]), splits=splits, **given, raw=raw)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DamagedFile(f"{where} lacks or mistypes {exc}: the version's manifest is damaged") from None

    def to_json(self) -> dict[str, Any]:
        """The JSON object ``manifest.json`` holds (the format of ``FORMAT_VERSION``)."""
        out: dict[str, Any] = {"format_version": FORMAT_VERSION, "dataset": self.dataset, "version": self.version,
                               "num_records": self.num_records, "classes": list(self.classes)}
        for key in _OPTIONAL:
            out[key] = _plain(getattr(self, key))
        out["splits"] = {name: {"num_records": s.num_records, "shards": [_shard_json(x) for x in s.shards]}
                         for name, s in self.splits.items()}
        return out

    @property
    def image_options(self) -> Mapping[str, Any]:
        """The build's image options; a version from before them stored every image as read."""
        return self.image if self.image is not None else _images_as_read()

    @property
    def separator(self) -> str:
        """The multi-label separator (the default where the manifest does not record one)."""
        return self.label_separator if self.label_separator is not None else DEFAULT_SEPARATOR

    @property
    def shard_files(self) -> list[str]:
        """Every shard's file, split by split."""
        return [s.file for split in self.splits.values() for s in split.shards]

    @property
    def num_bytes(self) -> int:
        return sum(split.num_bytes for split in self.splits.values())

    # -- the JSON as read, as a read-only mapping (for code that reads keys) ----------------------
    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)


_OPTIONAL = ("compression", "num_rejected", "num_skipped", "skipped_by_kind", "rejects_by_reason", "previous_version",
             "source", "source_fingerprint", "as_of", "features", "image", "multi_label", "label_separator",
             "columns", "labels_sha256", "inspected_sha256", "build", "params")


def _images_as_read() -> dict[str, Any]:
    """The image options of a version from before they existed: every image stored as read."""
    from ..images.transform import ImageOptions  # not at import: the loader needs none of images/

    return ImageOptions().describe()


def _shard(raw: Any) -> ShardEntry:
    return ShardEntry(str(raw["file"]), int(raw["num_records"]), int(raw["num_bytes"]), str(raw["sha256"]),
                      raw.get("index_sha256"), raw.get("reused_from"), raw.get("rewritten_from"))


def _shard_json(shard: ShardEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"file": shard.file, "num_records": shard.num_records, "num_bytes": shard.num_bytes,
                           "sha256": shard.sha256, "index_sha256": shard.index_sha256}
    for key in ("reused_from", "rewritten_from"):
        if (value := getattr(shard, key)) is not None:
            out[key] = dict(value)
    return out


def _plain(value: Any) -> Any:
    return dict(value) if isinstance(value, Mapping) else value


def as_manifest(value: Manifest | Mapping[str, Any], where: str = "manifest.json") -> Manifest:
    """``value`` parsed, unless it is a ``Manifest`` already (a JSON object from a staged file, a test)."""
    return value if isinstance(value, Manifest) else Manifest.parse(dict(value), where)


def image_shape(manifest: Manifest | Mapping[str, Any]) -> tuple[int | None, int | None, int | None]:
    """``(height, width, channels)`` every stored image of the version has, from the build's image
    options (the manifest's ``image``); None where they differ from image to image (and all three
    None for versions built before those options). ``manifest``: a ``Manifest``, or a mapping with
    the manifest's ``image`` and ``features``.

    ``resize WxH`` gives exactly H x W with ``fit pad``, or with ``upscale`` (without it, ``crop`` and
    ``stretch`` never enlarge a smaller image); ``channels`` 1, 3 or 4 converts every image, and raw
    pixels without it are RGB.
    """
    if isinstance(manifest, Manifest):
        options, features = manifest.image or {}, manifest.features or {}
    else:
        options, features = manifest.get("image") or {}, manifest.get("features") or {}
    height = width = channels = None
    match = re.fullmatch(r"(\d+)x(\d+)", str(options.get("resize", "none")))
    if match and (options.get("fit", default("fit")) == "pad" or options.get("upscale") is True):
        width, height = int(match.group(1)), int(match.group(2))
    if options.get("channels") in (1, 3, 4):
        channels = int(options["channels"])
    elif options and not options.get("channels") and RAW_KEY in features:
        channels = 3
    return height, width, channels
