"""What a build keeps in its staging prefix (``DEST/DATASET/_staging/VERSION/``) between stages.

Every stage reads its inputs from, and writes its outputs to, this prefix in the store, and
returns a small dict (counts, URIs): nothing of unbounded size passes between stages except
through the store, so each stage can run on any worker.
"""

from __future__ import annotations

from collections.abc import Callable

from .config import BuildConfig
from .published.layout import INSPECTED, LABELS, MANIFEST, NEAR_DUPLICATES, REJECTS  # noqa: F401 - staged under their published names
from .records.schema import RecordSchema, schema_of
from .rules.base_version import INSPECTION_FIELDS
from .storage import Storage, join
from .storage.documents import read_json

Progress = Callable[[int], None]
TMP_PREFIX = ".tmp-"  # temporary files and folders inside a local staging prefix
MAX_MAP_LENGTH = 1024  # Airflow's default [core] max_map_length: the most write tasks a plan makes
COPY_THREADS = 8  # copies into and out of staging that reuse and publish run at a time

DISCOVERED, DISCOVER_REJECTS, DISCOVER_SUMMARY = "discovered.csv", "rejects-discover.csv", "discover.json"
GROUPS = "groups.csv"  # the group column's value of each discovered file (with group_column), in discovered.csv's order
METADATA = "metadata.csv"  # labels.csv's declared columns of each discovered file, in discovered.csv's order
# inspection: the rejects and a summary, and INSPECTED (every file discovered.csv lists, in its order, inspected or
# taken over from the previous version: published as inspected.csv; split takes the labels from discovered.csv)
INSPECT_REJECTS, INSPECT_SUMMARY = "rejects-inspect.csv", "inspect.json"
RECORDS = "records.csv"  # labels.csv's rows before plan gives each its shard
SPLIT_SUMMARY, PLAN = "split.json", "plan.json"
MEMBERS, SHARDS, RECEIPTS, CHECKED = "members", "shards", "receipts", "validated"  # one file per shard in each
CARD, CARD_INDEX = "card-files", "card-files.json"  # staged card files (published as card.md, card.html, card/)
GATE_REPORT = "gate.json"  # the publish gate's verdict and every check (rules.publish_gate); not published
IMAGE_FIELDS = ("label", *INSPECTION_FIELDS)  # split's images: an inspected.csv row of an image, with its label


def staged(cfg: BuildConfig, *parts: str) -> str:
    """The URI of a staged file of this build."""
    return join(cfg.staging_uri, *parts)


def staged_schema(cfg: BuildConfig, storage: Storage) -> RecordSchema:
    """The record schema of this build (known once ``split`` has run: whether the source is multi-label)."""
    return schema_of(cfg, bool(read_json(storage, staged(cfg, SPLIT_SUMMARY)).get("multi_label")))


def no_progress(_: int) -> None:
    pass
