"""
### image_tfrecords: labelled image folders -> validated TFRecord datasets in S3

Every night (02:00 UTC), on a manual trigger, or in a backfill, this DAG builds one dataset
version from a source of images (a local folder or an `s3://` prefix; one folder per class, or a
`labels.csv` in the source root) and publishes it atomically:

1. **discover** lists the source (image files by extension; others are skipped and counted) and
   fingerprints the listing and params; when they match the previous published version's, it ends
   as skipped and so does everything after it, unless the `force` param is set;
2. **discover** then cuts the files to read into chunks (at most `chunk_files` files or `chunk_mb`
   MB each), and **inspect_images** (one mapped task per chunk, named after it, using its worker's
   cores) hashes, identifies and fully decodes every image of its chunk (bad ones become rejects);
   a night's few changed files (at most 256, 64 MB) are inspected by **discover** itself;
3. **plan** merges the chunks' rows back into listing order, resolves duplicates and assigns each
   image to a split from a salted hash of its content, then writes `labels.csv` and `rejects.csv`;
4. **plan** then decides the shards of each split (from `shard_size_mb`) and their members. Once a
   version is published, builds are **incremental**: the previous version's shards whose records
   are all unchanged are reused, those that lost or changed records are spliced from byte ranges of
   the previous shard (its kept records are copied, not parsed), and added or changed images go into
   new shards (a full rebuild when the `full_rebuild`
   param is set, when an option that rebuilds shards changed (image options, columns, splits, salt,
   group column, shard size, compression: each option's `effect`), or to compact once there
   would be more than 1.5x the shards of a full build). Unchanged files are not read again:
   **discover** takes over the previous version's `inspected.csv` rows for them;
5. **write_shards** copies the reused shards into staging in one more mapped task (server-side
   `CopyObject` on S3, checked against the previous manifest's SHA-256), and writes the new and rewritten
   shards (and their `.tfindex` offsets), one mapped task each (named after its shard; each
   shard's records are made on all of its worker's cores), and re-reads each new one from the store
   to check it (CRCs, schema, each record against its planned row, checksums); a spliced shard is
   checked while it is made (each kept record's framing and CRCs, its new records in full). The form's *Images and
   features* params change what a record stores: `resize` (with `fit`, `upscale`), `encoding`
   (`original`, `jpeg` at `jpeg_quality`, `png`, `raw` pixels), `channels`, labels.csv `columns` as
   typed features, and the `label_separator` of a multi-label `labels` column; each changed image is
   made once, here, by the task that writes its shard;
6. **gate** adds those checks up (counts per split, the records are the ones `labels.csv`
   lists, no image in two splits) and stages `manifest.json`;
7. **gate** then renders the dataset card (`card.md`, a self-contained `card.html`, and PNGs under
   `card/`): records per split and class, sample thumbnails, rejects, shard sizes, changes since
   the previous version, params;
8. **gate** last, with the `gate` param (off by default), compares the build with the previous published
   version (reject share, class shares, quality-flag shares, near-duplicates across labels; the
   `gate_*` params are the thresholds) and records its verdict in the manifest. When one trips, the
   task fails with the report in its log, unless `accept_gate` is set (publish anyway) or `approval`
   is: then **approval** waits for a person in the UI's *Required Actions*: *Approve* publishes,
   *Reject* runs **discard_rejected**, which drops the build's staging (nothing is published;
   unanswered after `IMAGE_TFRECORDS_APPROVAL_HOURS`, default 20, counts as *Reject*);
9. **publish** copies the build to `DEST/DATASET/VERSION/` (with TFDS's `dataset_info.json` and
   `features.json`, so `tfds.builder_from_directory` reads it), then writes `_SUCCESS`, then moves
   `latest.json` forward;
10. **clean_stale_staging** (a teardown with no upstream: it runs beside the build from its start,
   whether the run succeeds, fails or has nothing to build, and does not decide the run's state)
   removes the staging of *other* versions that never published and were untouched for
   `IMAGE_TFRECORDS_STAGING_GRACE_HOURS` (default 24), unless a build holds their lock.

Short stages share a task (discover with its check, the inspection plan and a night's few files;
split with plan; every reused shard's copy; validate, card and gate): each task in the chain costs a
second or two of start and scheduling, more than those stages' work. Each stage logs its own summary
line in its task's log.

Two runs building the same version exclude each other: the first task takes a lock with a lease in
the version's staging prefix; a second run's tasks fail at once with one line naming the holder.

All intermediate files live under `DEST/DATASET/_staging/VERSION/` in the store, never on a
worker's disk. Scheduled runs and backfills see the source as of their logical date (files modified at
or before it); manual runs see everything. The **version** is the run's logical date as `YYYYMMDDTHHMMSSZ` (UTC), or the
run id when a run has no logical date, unless the `version` param names one. Reruns of a run
write the same bytes, however the work was spread. S3 access uses the Airflow connection `aws_default`.

Every long task logs progress lines (done/total, rate, ETA; at most every 15 s) and a summary line.
Per-image work in a mapped task runs on a process pool of `IMAGE_TFRECORDS_TASK_PROCESSES` processes
(default: the worker's cores, at most 8; threads for small chunks). Under `airflow dags test`, the
mapped tasks run one after another in the test's process, each still using such a pool.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Asset, dag, get_current_context, task, teardown

from image_tfrecords.airflow_glue import dag_params, gate_approval, notify_failure  # light: no stage, TF or Pillow

log = logging.getLogger(__name__)

# Updated by every publish. Named only, so it does not change with the environment's defaults (an
# Asset whose URI changed under the same name would be deactivated); each event's extra says what
# was published: URI, version and counts.
PUBLISHED_DATASET = Asset(name="image_tfrecords", group="ml-datasets")
# Shard writing runs in this pool; the project's setup creates "image_tfrecords" (docker compose's
# airflow-init: `airflow pools set image_tfrecords 4 ...`) and points IMAGE_TFRECORDS_POOL at it.
POOL = os.environ.get("IMAGE_TFRECORDS_POOL", "default_pool")
RETRY_DELAY = timedelta(seconds=float(os.environ.get("IMAGE_TFRECORDS_RETRY_DELAY_SECONDS", "30")))
STAGING_GRACE_HOURS = float(os.environ.get("IMAGE_TFRECORDS_STAGING_GRACE_HOURS", "24"))
# How long a tripped gate waits for a person (then it counts as Reject); below the staging grace period, so
# that no other run's cleanup removes a build while it waits.
APPROVAL_TIMEOUT = timedelta(hours=float(os.environ.get("IMAGE_TFRECORDS_APPROVAL_HOURS", "20")))


PARAMS = dag_params()  # from image_tfrecords.options; source, destination, dataset defaults from IMAGE_TFRECORDS_*


def _run(stage: Callable[..., Any], **kwargs: Any) -> Any:
    """A stage with this run's config and storage; errors mapped to task outcomes (``airflow_glue``)."""
    from image_tfrecords.airflow_glue import run_stage

    return run_stage(stage, staging_grace_hours=STAGING_GRACE_HOURS, **kwargs)


@dag(
    dag_id="image_tfrecords",
    schedule="0 2 * * *",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=4,
    params=PARAMS,
    tags=["tfrecords", "images", "ml-datasets"],
    doc_md=__doc__,
    default_args={
        "retries": 3,
        "retry_delay": RETRY_DELAY,
        "retry_exponential_backoff": True,
        "max_retry_delay": timedelta(minutes=10),
        "execution_timeout": timedelta(hours=2),
        "on_failure_callback": notify_failure,
    },
)
def image_tfrecords() -> None:
    @task
    def discover() -> list[int]:
        """List the source into the staging area. When nothing changed since the previous published version (and
        neither force nor full_rebuild is set), drop the staging and skip: the rest of the run is skipped with it.
        Otherwise take over the previous version's inspections of unchanged files and cut the rest into chunks.
        Returns one index per chunk for inspect_images (small: at most max_map_length), or none when the few
        files left to read were inspected here (a night's changes: a task of their own costs more than reading
        them)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from image_tfrecords import stages

        found = _run(stages.discover_stage)
        params = get_current_context()["params"]
        if found["unchanged_since"] and not (params["force"] or params.get("full_rebuild")):
            _run(stages.discard_stage)
            raise AirflowSkipException(f"source listing and params unchanged since version "
                                       f"{found['unchanged_since']}: nothing new to build, the rest is skipped")
        planned = _run(stages.plan_inspection)
        if stages.inspect_in_place(planned):
            _run(stages.inspect_small, chunks=planned["chunks"])
            return []  # (inspect_images is mapped over nothing: skipped)
        return list(range(planned["chunks"]))

    @task(map_index_template="{{ chunk_label }}", max_active_tis_per_dagrun=8, pool=POOL)
    def inspect_images(chunk: int) -> dict[str, Any]:
        """Hash and fully decode the images of one chunk of the listing."""
        from image_tfrecords import stages

        result = _run(stages.inspect_chunk, chunk=chunk)
        get_current_context()["chunk_label"] = result["label"]
        return result

    # Runs after discover alone when inspect_images was mapped over nothing (discover inspected the files itself).
    @task(trigger_rule="none_failed_min_one_success")
    def plan() -> list[int]:
        """Merge the chunks' rows; resolve duplicates, assign class ids and splits; stage labels.csv and rejects.csv
        (the split stage); then plan the shards. Returns one index per write_shards task (small: at most
        max_map_length): one per shard to write, and one more that copies every reused shard when there are any."""
        from image_tfrecords import stages

        _run(stages.gather_inspection)
        _run(stages.split_stage)
        return list(range(_run(stages.plan_stage)["shard_tasks"]))

    @task(map_index_template="{{ shard_label }}", max_active_tis_per_dagrun=8, pool=POOL)
    def write_shards(task_index: int) -> dict[str, Any]:
        """Write this task's shard(s) of the plan to staging, then re-read and check each; or, for the last index
        when the plan reuses shards, copy the previous version's shards kept whole (server-side, checked)."""
        from image_tfrecords import stages

        result = _run(stages.shard_task, task_index=task_index)
        get_current_context()["shard_label"] = result["label"]
        return {key: result[key] for key in ("shards", "num_records", "num_bytes")}

    # none_failed: skipped with everything else when discover skips (nothing changed).
    @task.branch(trigger_rule="none_failed_min_one_success")
    def gate() -> str:
        """Add up the write tasks' shard checks (re-reading any shard not checked) and stage manifest.json
        (validate); render the dataset card into staging (card); compare the build with the previous published
        version: publish, ask a person, or fail with the report (gate). One task for the three stages, each with
        its summary in the log."""
        from image_tfrecords import stages
        from image_tfrecords.airflow_glue import gate_branch

        _run(stages.validate_stage)
        _run(stages.card_stage)
        return gate_branch(get_current_context(), _run(stages.gate_stage), publish="publish", ask="approval")

    @task
    def discard_rejected() -> dict[str, Any]:
        """A person rejected the build at the gate: drop its staging; nothing is published."""
        from image_tfrecords import stages

        log.info("the build was rejected at the publish gate: discarding its staging, nothing is published")
        return _run(stages.discard_stage)

    # Runs after the gate passed (the approval task is skipped), or after a person approved (the approval
    # task recorded it in the staged manifest: publish refuses a build whose gate tripped otherwise).
    @task(execution_timeout=timedelta(hours=1), outlets=[PUBLISHED_DATASET], trigger_rule="none_failed_min_one_success")
    def publish() -> dict[str, Any]:
        """Publish atomically: files, then _SUCCESS, then latest.json; then announce it as an Asset event."""
        from image_tfrecords import stages

        result = _run(stages.publish_stage)
        get_current_context()["outlet_events"][PUBLISHED_DATASET].extra = {
            key: result[key] for key in ("uri", "version", "num_records", "num_rejected", "splits", "latest")}
        return result

    @teardown
    def clean_stale_staging() -> dict[str, Any]:
        """Remove the staging of other versions that never published (older than the grace period)."""
        from image_tfrecords.published.cleanup import clean_staging

        return _run(clean_staging)

    chunks, planned, gated = discover(), plan(), gate()
    chunks >> planned  # (as well as through inspect_images, which a night may map over nothing)
    inspect_images.expand(chunk=chunks) >> planned
    write_shards.expand(task_index=planned) >> gated
    planned >> gated  # (gate runs when there are no shards to write)
    published, discarded = publish(), discard_rejected()
    approval = gate_approval("approval", "gate", on_approve="publish", on_reject="discard_rejected",
                             timeout=APPROVAL_TIMEOUT)
    gated >> [published, approval]
    approval >> [published, discarded]
    clean_stale_staging()  # no upstream: it runs beside the build from its start, and when discover skips the rest

image_tfrecords()
