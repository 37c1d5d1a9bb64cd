"""Stage 4a, beside inspection, split and plan: prove the base version's shards ahead (``shards.proofs``).

The command line runs the prover on a thread of its own process (``run_pipeline``); the DAG runs this stage as
a task of its own, started once discovery has found changes, which hashes the base shards until the plan is
staged (the stages that use them come after it) or all are proven, and stages the proofs. The reuse and write
tasks do not wait for it: a shard it proved is not hashed again there, any other is hashed where it is used.
"""

from __future__ import annotations

from typing import Any

from ..config import BuildConfig
from ..progress import summarized
from ..shards.proofs import Prover
from ..staging import DISCOVER_SUMMARY, PLAN, staged
from ..storage import Storage
from ..storage.documents import read_json


@summarized
def prove_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Prove the base shards until the plan is staged; returns ``{"proven": N, "of": M}`` (0 of 0: no base
    shards to prove, as for a first version, a full rebuild or an S3 destination)."""
    found = read_json(storage, staged(cfg, DISCOVER_SUMMARY))
    prover = Prover(cfg, storage, found["previous_version"], bool(found.get("multi_label")))
    plan = staged(cfg, PLAN)
    prover.run(until=lambda: storage.exists(plan))
    return prover.stop()
