"""Stage 4a, beside inspection, split and plan: prove the base version's shards ahead (``shards.proofs``).

The command line runs the prover on a thread of its own process (``run_pipeline``); the DAG runs this stage as
a task of its own, started once discovery has found changes, which hashes the base shards until the plan is
staged (the stages that use them come after it) or all are proven, and stages the proofs. The reuse and write
tasks do not wait for it: a shard it proved is not hashed again there, any other is hashed where it is used.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

from ..config import BuildConfig
from ..progress import log, summarized
from ..shards.proofs import Prover
from ..staging import DISCOVER_SUMMARY, PLAN, staged
from ..storage import Storage
from ..storage.documents import read_json

PROVE_SECONDS = 45 * 60  # the most a DAG's prover hashes (its task's execution_timeout is an hour)


@summarized
def prove_stage(cfg: BuildConfig, storage: Storage) -> dict[str, Any]:
    """Prove the base shards until this attempt's plan is staged; returns ``{"proven": N, "of": M}`` (0 of 0: no
    base shards to prove, as for a first version, ``full_rebuild`` or an S3 destination).

    Never fails: it is only a head start, and as a task of its own with nothing downstream it would fail the
    run. Nothing to do when the build's staging is gone (published or discarded before this task ran); a
    ``plan.json`` older than this attempt's discovery (a rerun's) does not stop it."""
    try:
        summary = staged(cfg, DISCOVER_SUMMARY)
        try:
            found = read_json(storage, summary)
        except FileNotFoundError:
            return {"proven": 0, "of": 0}
        prover = Prover(cfg, storage, found["previous_version"], bool(found.get("multi_label")))
        if not prover.shards:  # (never local paths to stat below: an S3 destination has none)
            return prover.stop()
        discovered, plan, deadline = os.stat(summary).st_mtime_ns, staged(cfg, PLAN), time.monotonic() + PROVE_SECONDS

        def planned() -> bool:
            with contextlib.suppress(OSError):
                return os.stat(plan).st_mtime_ns >= discovered
            return False

        prover.run(until=lambda: planned() or time.monotonic() > deadline)
        if not storage.exists(summary):  # the staging went meanwhile: stage nothing into it
            return {"proven": 0, "of": len(prover.shards)}
        return prover.stop()
    except Exception as exc:  # see above: the reuse and write tasks hash what was not proven
        log.warning("proving the base shards ahead failed (%s: %s): they are hashed where they are used",
                    type(exc).__name__, exc)
        return {"proven": 0, "of": 0}
