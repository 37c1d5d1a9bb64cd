"""Check one staged shard against the members planned for it.

``validate_shard`` re-reads a staged shard from the store (CRCs, every record parses with the
schema and matches its planned row, the image bytes are the inspected ones, the ``.tfindex``
matches) and stages its result. Its parts are used on their own too: ``record_facts`` parses one
record, ``match_member`` checks it against its member's row, ``member_rows`` and ``members_digest``
read a staged member list, ``set_digest`` is the order-independent digest of a set of file names.
"""

from __future__ import annotations

import hashlib
import io
import struct
from array import array
from collections.abc import Iterable, Iterator
from concurrent.futures import Executor
from functools import partial
from typing import Any

from ..config import BuildConfig
from ..errors import BuildError
from ..parallel import batched_map
from ..published import layout
from ..records.example import decode_example
from ..records.schema import FILENAME_KEY, RecordSchema, example_features
from ..records.tfrecord import CorruptRecordError, read_records
from ..staging import CHECKED, MEMBERS, RECEIPTS, SHARDS, Progress, no_progress, staged, staged_schema
from ..storage import HashingReader, Storage
from ..storage.documents import dict_rows, first_column, read_json, write_json

_RECORD_OVERHEAD = 16  # length, its CRC and the data's CRC around each record


def name_hash(name: str) -> int:
    """A name's 128-bit hash: what ``set_digest`` adds up."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:16], "big")


def set_digest(names: Iterable[str]) -> str:
    """An order-independent digest of a multiset of names (sum of their hashes mod 2^128)."""
    return f"{sum(map(name_hash, names)) % 2**128:032x}"


def member_rows(members: bytes, start: int = 0) -> list[dict[str, str]]:
    """The rows of a staged ``members/{shard}.csv`` (bounded by the shard size), from row ``start`` on."""
    return dict_rows(members, "a members table", start)


def member_names(members: bytes) -> list[str]:
    """The file names of a staged ``members/{shard}.csv``, in its order (a kept or reused record needs no more)."""
    return first_column(members, "a members table", "filename")


def members_digest(members: bytes) -> tuple[str, int]:
    """The name digest and the number of the rows of a staged ``members/{shard}.csv``."""
    names = member_names(members)
    return set_digest(names), len(names)


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
                    match_member(schema, shard, fact, unseen)
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
              "names": set_digest(m["filename"] for m in members), "members_sha256": members_sha,
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


def match_member(schema: RecordSchema, shard: str, facts: tuple[int, str, dict[str, Any], ImageFacts],
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
