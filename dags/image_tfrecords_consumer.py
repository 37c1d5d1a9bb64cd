"""
### image_tfrecords_consumer: an example of data-aware scheduling on the published dataset

Runs whenever `image_tfrecords` publishes a version (the `image_tfrecords` Asset). It reads the new
version's `manifest.json` from the URI in the Asset event and logs a summary: the place to start
a training or evaluation job. Triggered by hand (no event), it summarises the version `latest.json`
names under IMAGE_TFRECORDS_DESTINATION / IMAGE_TFRECORDS_DATASET.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import Asset, dag, get_current_context, task

log = logging.getLogger(__name__)
PUBLISHED_DATASET = Asset.ref(name="image_tfrecords")  # defined by the image_tfrecords DAG


@dag(
    dag_id="image_tfrecords_consumer",
    schedule=[PUBLISHED_DATASET],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["tfrecords", "ml-datasets", "example"],
    doc_md=__doc__,
    default_args={"retries": 2, "retry_delay": timedelta(seconds=30), "execution_timeout": timedelta(minutes=10)},
)
def image_tfrecords_consumer() -> None:
    @task
    def summarize_new_version() -> dict[str, Any]:
        """Read the published manifest named by the triggering event and log what it holds."""
        from image_tfrecords.airflow_glue import airflow_storage  # the S3 client of the aws_default connection
        from image_tfrecords.options import BY_NAME
        from image_tfrecords.published import layout
        from image_tfrecords.storage import join

        context = get_current_context()
        events = [e for asset_events in context["triggering_asset_events"].values() for e in asset_events]
        storage = airflow_storage()
        if events:
            version_uri = events[-1].extra["uri"]
        else:  # a manual run: the newest complete version at the default destination
            root, dataset = BY_NAME["destination"].dag_default(), BY_NAME["dataset"].dag_default()
            version_uri = layout.resolve(storage, join(root, dataset))
        manifest = layout.read_manifest(storage, version_uri)
        summary = {"uri": version_uri, "version": manifest.version, "num_records": manifest.num_records,
                   "classes": len(manifest.classes),
                   "splits": {name: split.num_records for name, split in manifest.splits.items()}}
        log.info("new dataset version %s at %s: %d records, %d classes, splits %s", summary["version"],
                 version_uri, summary["num_records"], summary["classes"], summary["splits"])
        return summary

    summarize_new_version()


image_tfrecords_consumer()
