"""Stage 6: check every staged shard against the plan and labels.csv; stage the manifest.

``validate_shard`` re-reads one staged shard from the store (CRCs, every record parses with the
schema and matches its planned row, the image bytes are the inspected ones, the ``.tfindex``
matches) and stages its result; write tasks call it right after writing. ``validate_stage``
then adds the per-shard results up: counts per split, the set of file names per split, and no
image content in two splits.
"""

from __future__ import annotations

import csv
import hashlib
import io
import struct
from array import array
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import Executor
from functools import partial
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError
from ..parallel import batched_map
from ..progress import summarized
from ..published import layout
from ..published.manifest import FORMAT_VERSION, Manifest
from ..records.example import decode_example
from ..records.schema import FILENAME_KEY, RecordSchema, example_features
from ..records.tfrecord import CorruptRecordError, read_records
from ..rules.base_version import INSPECTOR
from ..storage import HashingReader, Storage
from ..storage.documents import read_json, read_rows, write_json
from .staging import (
    CHECKED,
    DISCOVER_SUMMARY,
    INSPECT_SUMMARY,
    LABELS,
    MANIFEST,
    MEMBERS,
    PLAN,
    RECEIPTS,
    SHARDS,
    SPLIT_SUMMARY,
    Progress,
    no_progress,
    staged,
    staged_schema,
)

_RECORD_OVERHEAD = 16  # length, its CRC and the data's CRC around each record


def _name_hash(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:16], "big")


def _set_digest(names: Iterator[str]) -> str:
    """An order-independent digest of a multiset of names (sum of their hashes mod 2^128)."""
    return f"{sum(map(_name_hash, names)) % 2**128:032x}"


def member_rows(members: bytes) -> list[dict[str, str]]:
    """The rows of a staged ``members/{shard}.csv`` (bounded by the shard size)."""
    return list(csv.DictReader(io.StringIO(members.decode("utf-8-sig"), newline="")))


def members_digest(members: bytes) -> tuple[str, int]:
    """The name digest and the number of the rows of a staged ``members/{shard}.csv``."""
    rows = member_rows(members)
    return _set_digest(r["filename"] for r in rows), len(rows)


def validate_shard(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress = no_progress,
                   processes: Executor | None = None, workers: int = 1) -> dict[str, Any]:
    """Re-read a staged shard and check it; stage and return its result.

    The shard is read in one stream (CRCs, offsets, its SHA-256); each record's parse and checks run
    on the ``processes`` pool when given (a batch of records per call), and are matched with the
    planned members here, in order.
    """
    uri = staged(cfg, SHARDS, shard)
    tag = storage.change_tag(uri)  # taken first: a change while it is read makes validate_stage check it again
    members_data = storage.read_bytes(staged(cfg, MEMBERS, shard + ".csv"))  # bounded by the shard size
    members_sha = hashlib.sha256(members_data).hexdigest()
    members = member_rows(members_data)
    unseen = {m["filename"]: m for m in members}  # records are matched by name: a rewritten shard keeps its order
    count, index = 0, []

    def records(raw: HashingReader) -> Iterator[tuple[int, bytes]]:
        position = 0
        for number, record in enumerate(read_records(raw, cfg.compression)):  # type: ignore[arg-type]
            index.append(f"{position} {len(record) + _RECORD_OVERHEAD}\n")
            position += len(record) + _RECORD_OVERHEAD
            yield number, record

    schema = staged_schema(cfg, storage)
    check = partial(record_facts, schema, shard, headers=not cfg.image_options.is_default)
    try:
        with storage.open_read(uri) as stream:
            raw = HashingReader(stream)
            try:
                facts = batched_map(check, records(raw), processes, workers, batch=32) if processes is not None \
                    else map(check, records(raw))
                for fact in facts:
                    if count >= len(members):
                        raise BuildError(f"shard {shard} holds more records than the {len(members)} planned")
                    _match(schema, shard, fact, unseen)
                    count += 1
                    progress(1)
            except CorruptRecordError as exc:
                raise BuildError(f"shard {shard} is corrupt: {exc}") from exc
            raw.drain()
    except FileNotFoundError:
        raise BuildError(f"shard {shard} is missing from staging") from None
    sha, num_bytes = raw.sha256.hexdigest(), raw.num_bytes
    if count != len(members):
        raise BuildError(f"shard {shard} holds {count} records, the plan says {len(members)}")
    receipt = read_json(storage, staged(cfg, RECEIPTS, shard + ".json"))
    if receipt["sha256"] != sha:
        raise BuildError(f"shard {shard} changed after it was written (sha256 {sha} != {receipt['sha256']})")
    try:
        staged_index = storage.read_bytes(staged(cfg, SHARDS, layout.index_file(shard)))
    except FileNotFoundError:
        raise BuildError(f"shard {shard} has no {layout.INDEX_SUFFIX} file in staging") from None
    if staged_index != "".join(index).encode():
        raise BuildError(f"the {layout.INDEX_SUFFIX} file of shard {shard} does not match its records")
    result = {"file": shard, "num_records": count, "num_bytes": num_bytes, "sha256": sha, "change_tag": tag,
              "names": _set_digest(m["filename"] for m in members), "members_sha256": members_sha,
              "index_sha256": receipt.get("index_sha256"), "source_bytes": receipt.get("source_bytes", 0),
              "records_parsed": count, "bytes_written": num_bytes,
              **{key: receipt[key] for key in ("rewritten_from", "reused_from", "base_bytes_read", "fallback")
                 if key in receipt}}
    write_json(storage, staged(cfg, CHECKED, shard + ".json"), result)
    return result


ImageFacts = tuple[str, int, str, tuple[int, int] | None]  # sha256, length, format found, header size


def _image_facts(image: bytes, raw: bool, headers: bool) -> ImageFacts:
    """What the checks need of a record's image: its SHA-256 and length, and with ``headers`` (a build whose
    options make images) the format and size its header gives (Pillow reads the header only)."""
    sha = hashlib.sha256(image).hexdigest()
    if raw or not headers:
        return sha, len(image), "raw" if raw else "", None
    from PIL import Image

    try:
        with Image.open(io.BytesIO(image), formats=["JPEG", "PNG"]) as opened:
            return sha, len(image), str(opened.format).lower(), opened.size
    except Exception:  # not JPEG or PNG, or a broken header
        return sha, len(image), "", None


def record_facts(schema: RecordSchema, shard: str, item: tuple[int, bytes], headers: bool = False
                 ) -> tuple[int, str, dict[str, Any], ImageFacts]:
    """Parse record ``item = (index, bytes)`` of ``shard`` and check it has ``schema``'s features: ``(index,
    file name, its feature values but the image, the image's facts)``. Needs nothing but the record, so it
    runs anywhere."""
    number, record = item
    where = f"shard {shard} record {number}"
    try:
        example = decode_example(record)
    except (ValueError, KeyError, IndexError) as exc:
        raise BuildError(f"{where} does not parse as a tf.train.Example: {exc}") from exc
    spec = schema.features()
    if set(example) != set(spec):
        raise BuildError(f"{where} has keys {sorted(example)}, expected {sorted(spec)}")
    kinds = {"string": bytes, "int64": int, "float": float}
    for key, feature in spec.items():
        values, shape = example[key], feature["shape"]
        if (shape == [] and len(values) != 1) or (shape and shape[0] is not None and len(values) != shape[0]) \
                or not all(isinstance(v, kinds[feature["dtype"]]) for v in values):
            raise BuildError(f"{where}: {key} is not {feature['dtype']} of shape {shape}")
    name = example[FILENAME_KEY][0].decode("utf-8", "surrogateescape")  # type: ignore[union-attr]
    image = example[schema.image_key][0]
    values = {key: example[key][0] if spec[key]["shape"] == [] else example[key] for key in spec
              if key != schema.image_key}
    return number, name, values, _image_facts(image, schema.raw, headers)  # type: ignore[arg-type]


def _float32(value: Any) -> Any:
    """``value`` (a float or a list of them) as a float32 round-trip gives it back."""
    if isinstance(value, float):
        return struct.unpack("<f", struct.pack("<f", value))[0]
    if isinstance(value, list | array) and value and isinstance(value[0], float):
        return [_float32(v) for v in value]
    return list(value) if isinstance(value, array) else value


def _same(value: Any, expected: Any) -> bool:
    """Equal, with NaN equal to NaN (a metadata float may be NaN)."""
    if isinstance(value, list) and isinstance(expected, list):
        return len(value) == len(expected) and all(map(_same, value, expected))
    if isinstance(value, float) and isinstance(expected, float) and value != value and expected != expected:
        return True
    return bool(value == expected)


def _match(schema: RecordSchema, shard: str, facts: tuple[int, str, dict[str, Any], ImageFacts],
           unseen: dict[str, dict[str, str]], first: int = 0) -> None:
    """Check one record's facts against the member of its name (removed from ``unseen``: a name counts once),
    at the place labels.csv gives it (``first`` plus the record's number).

    An image stored as inspected must have the inspected bytes; one the writer made (no planned
    ``encoded_sha256``) must be of the planned format and size (raw: exactly height x width x channels
    bytes)."""
    number, name, values, (image_sha, image_len, image_format, size) = facts
    where = f"shard {shard} record {number}"
    member = unseen.pop(name, None)
    if member is None:
        raise BuildError(f"{where}: {name!r} is not planned for this shard, or is in it twice")
    if member.get("shard_position") and int(member["shard_position"]) != first + number:
        raise BuildError(f"{where}: {name!r} is planned as record {member['shard_position']}")
    expected = example_features(member, b"", schema)
    for key, value in values.items():
        if not _same(value, _float32(expected[key])):
            raise BuildError(f"{where}: {key} is {value!r}, the plan says {expected[key]!r}")
    if member["encoded_sha256"]:
        if image_sha != member["encoded_sha256"]:
            raise BuildError(f"{where}: image bytes do not match what inspection recorded")
        return
    width, height, channels = int(member["width"]), int(member["height"]), int(member["channels"])
    if schema.raw:
        if image_len != width * height * channels:
            raise BuildError(f"{where}: {image_len} bytes of pixels, {height}x{width}x{channels} planned")
    elif (image_format, size) != (member["format"], (width, height)):
        raise BuildError(f"{where}: the image is {image_format or 'not JPEG or PNG'} "
                         f"{size[0] if size else '?'}x{size[1] if size else '?'}, "
                         f"{member['format']} {width}x{height} was planned")


def _check_no_content_in_two_splits(cfg: BuildConfig, storage: Storage, contents: dict[str, array[int]]) -> None:
    """Raise BuildError if any image content is in two splits (8 bytes of memory per record)."""
    import numpy as np

    seen = {split: np.unique(np.frombuffer(prefixes, dtype=np.uint64)) for split, prefixes in contents.items()}
    names = sorted(seen)
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            shared = np.intersect1d(seen[first], seen[second], assume_unique=True)
            if not len(shared):
                continue
            shared_set = {int(p) for p in shared[:100]}
            with read_rows(storage, staged(cfg, LABELS)) as rows:
                where = {r["split"]: r["filename"] for r in rows if int(r["sha256"][:16], 16) in shared_set}
            if len(where) > 1:  # not only a collision of 64-bit prefixes
                raise BuildError(f"identical image content in splits {first} and {second} "
                                 f"({where.get(first)}, {where.get(second)})")


def _checked(cfg: BuildConfig, storage: Storage, shard: str, progress: Progress) -> dict[str, Any]:
    """The staged result of ``validate_shard`` if it checked the shard as it is now against the members
    planned now; else a fresh check."""
    try:
        result = read_json(storage, staged(cfg, CHECKED, shard + ".json"))
        receipt = read_json(storage, staged(cfg, RECEIPTS, shard + ".json"))
        members = hashlib.sha256(storage.read_bytes(staged(cfg, MEMBERS, shard + ".csv"))).hexdigest()
    except FileNotFoundError:
        return validate_shard(cfg, storage, shard, progress)
    current = storage.change_tag(staged(cfg, SHARDS, shard))  # None if it is missing
    if not (current is not None and result.get("change_tag") == current  # not rewritten or damaged since
            and result.get("sha256") == receipt.get("sha256")
            and result.get("members_sha256") == receipt.get("members_sha256") == members):  # nor replanned
        return validate_shard(cfg, storage, shard, progress)
    progress(result["num_records"])
    return result


def _manifest_entry(shard: dict[str, Any]) -> dict[str, Any]:
    """A shard's entry in the manifest: its file, counts and checksums, and where a reused or rewritten
    one came from."""
    entry = {key: shard[key] for key in ("file", "num_records", "num_bytes", "sha256", "index_sha256")}
    for key in ("reused_from", "rewritten_from"):
        if key in shard:
            entry[key] = shard[key]
    return entry


def _build_facts(plan: dict[str, Any], inspected: dict[str, Any], shards: list[dict[str, Any]],
                 damaged: list[str]) -> dict[str, Any]:
    """The manifest's ``build``: how this version was made from the source and the previous version
    (``damaged``: the newer published versions passed over as damaged)."""
    return {
        **plan["build"], "inspector": INSPECTOR, "record_positions": True,
        "files_inspected": inspected["files_read"], "inspections_reused": inspected["files_reused"],
        "shards_reused": sum("reused_from" in s for s in shards),
        "shards_rewritten": sum("rewritten_from" in s for s in shards),
        "shards_written": sum("reused_from" not in s and "rewritten_from" not in s for s in shards),
        "source_bytes_read": inspected["bytes_read"] + sum(s.get("source_bytes", 0) for s in shards),
        "shards_spliced": sum("bytes_copied" in s and "rewritten_from" in s for s in shards),
        "records_parsed": sum(s.get("records_parsed", 0) for s in shards),
        "base_bytes_read": sum(s.get("base_bytes_read", 0) for s in shards),  # base shards read (hashed) by workers
        "bytes_copied": sum(s.get("bytes_copied", 0) for s in shards),  # by the kernel or the store, not a worker
        "bytes_written": sum(s.get("bytes_written", 0) for s in shards),  # shard bytes a worker wrote
        "shards_from_source_after_damage": [s["file"] for s in shards if s.get("fallback")],
        "inspections_not_reused_because": inspected.get("not_reused_because", ""),
        "damaged_versions": damaged,
    }


@summarized
def validate_stage(cfg: BuildConfig, storage: Storage, progress: Progress = no_progress) -> dict[str, Any]:
    """Add up the per-shard checks (checking any shard not checked yet) and stage ``manifest.json``."""
    plan = read_json(storage, staged(cfg, PLAN))
    summary = read_json(storage, staged(cfg, SPLIT_SUMMARY))
    counts: Counter[str] = Counter()
    digests: Counter[str] = Counter()  # per split: sum of name hashes, as _set_digest
    contents: dict[str, array[int]] = defaultdict(lambda: array("Q"))  # per split: 64-bit sha256 prefixes
    with read_rows(storage, staged(cfg, LABELS)) as rows:  # plain lists: this runs over every record
        column = {name: i for i, name in enumerate(rows.fieldnames or ())}
        name, split_at, sha = column["filename"], column["split"], column["sha256"]
        for values in rows.reader:
            split = values[split_at]
            counts[split] += 1
            digests[split] += _name_hash(values[name])
            contents[split].append(int(values[sha][:16], 16))
    _check_no_content_in_two_splits(cfg, storage, contents)
    splits: dict[str, Any] = {}
    checked: list[dict[str, Any]] = []
    for split, shard_files in plan["splits"].items():
        shards = [_checked(cfg, storage, f, progress) for f in shard_files]
        total = sum(s["num_records"] for s in shards)
        expected = summary["splits"][split]["num_records"]
        if total != expected or total != counts[split]:
            raise BuildError(f"split {split} holds {total} records, labels.csv says {expected}")
        if sum(int(s["names"], 16) for s in shards) % 2**128 != digests[split] % 2**128:
            raise BuildError(f"split {split}: the records in its shards are not the ones labels.csv lists")
        splits[split] = {"num_records": total, "shards": [_manifest_entry(s) for s in shards]}
        checked += shards
    manifest = {
        "format_version": FORMAT_VERSION,
        "dataset": cfg.dataset, "version": cfg.version, "num_records": summary["num_records"],
        "num_rejected": summary["num_rejected"], "num_skipped": summary["num_skipped"],
        "skipped_by_kind": summary.get("skipped_by_kind", {}), "rejects_by_reason": summary["rejects_by_reason"],
        "classes": summary["classes"],
        "previous_version": summary["previous_version"], "source_fingerprint": summary["source_fingerprint"],
        "as_of": cfg.as_of,
        "compression": cfg.compression, "features": staged_schema(cfg, storage).features(), "splits": splits,
        "image": cfg.image_options.describe(), "multi_label": bool(summary.get("multi_label")),
        "label_separator": cfg.label_separator, "columns": dict(cfg.columns),
        "labels_sha256": storage.sha256_of(staged(cfg, LABELS)),  # the next night trusts its places only so
        "build": _build_facts(plan, read_json(storage, staged(cfg, INSPECT_SUMMARY)), checked,
                              read_json(storage, staged(cfg, DISCOVER_SUMMARY)).get("damaged_versions", [])),
        "source": cfg.source, "params": {"splits": cfg.splits, "salt": cfg.salt,
                                         "shard_size_mb": cfg.shard_size_mb, "max_file_mb": cfg.max_file_mb,
                                         "max_pixels": cfg.max_pixels, **cfg.image_options.describe(),
                                         "columns": dict(cfg.columns), "label_separator": cfg.label_separator,
                                         "modern_formats": cfg.modern_formats},
    }
    written = Manifest.parse(manifest, staged(cfg, MANIFEST))  # what every reader will parse, checked here
    write_json(storage, staged(cfg, MANIFEST), written.to_json())
    return {"num_records": written.num_records, "num_shards": len(written.shard_files)}
