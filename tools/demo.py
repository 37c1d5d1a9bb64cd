"""`make demo`: sample images -> local S3 server -> `airflow dags test` -> read back with TensorFlow.

Everything lives under .demo/ (sample images, the SeaweedFS data, AIRFLOW_HOME). The S3 server is
started for the run and stopped at the end; its data stays in .demo/s3, and
`.venv/bin/python tools/seaweedfs.py .demo/s3` serves it again. With IMAGE_TFRECORDS_S3_ENDPOINT
set (for example MinIO from `docker compose up`), that server is used instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from image_tfrecords.images.sample import make_sample  # noqa: E402
from image_tfrecords.storage import Storage, join  # noqa: E402
from tools import airflow_env, seaweedfs  # noqa: E402

BUCKET, DATASET = "datasets", "demo"


def _step(message: str) -> None:
    print(f"==> {message}", flush=True)


def main() -> int:
    started = time.perf_counter()
    work = ROOT / ".demo"
    sample = work / "sample"
    _step(f"writing sample images to {sample}")
    make_sample(str(sample), per_class=20)

    server = seaweedfs.existing()
    if server is None:
        _step("starting SeaweedFS (S3) on 127.0.0.1")
        server = seaweedfs.start(str(work / "s3"))
    print(f"    S3 endpoint {server.endpoint}")
    try:
        server.create_bucket(BUCKET)
        home = work / "airflow"
        env = airflow_env.environment(home, server, drop=())  # the caller's AIRFLOW*/AWS_* settings kept
        _step(f"migrating the Airflow database in {home}")
        airflow_env.migrate(env, timeout=None, quiet=False)
        logical_date = datetime.now(UTC).replace(microsecond=0)
        conf = {"source": str(sample), "destination": f"s3://{BUCKET}", "dataset": DATASET,
                "shard_size_mb": 0.1, "compression": "none"}
        _step(f"airflow dags test image_tfrecords {logical_date.isoformat()}")
        log = work / "dags-test.log"
        with open(log, "w") as out:
            result = subprocess.run([airflow_env.AIRFLOW, "dags", "test", "image_tfrecords", logical_date.isoformat(),
                                     "-c", json.dumps(conf)], env=env, stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            print(f"the DAG run failed; its log is {log}", file=sys.stderr)
            return 1
        version = logical_date.strftime("%Y%m%dT%H%M%SZ")
        _step("reading the published dataset back with TensorFlow")
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        for key, value in server.env().items():
            os.environ[key] = value
        sys.path.insert(0, str(ROOT / "tests"))
        from tf_reader import read_version

        storage = Storage()
        uri = join(f"s3://{BUCKET}", DATASET, version)
        manifest, splits = read_version(storage, uri)
        latest = json.loads(storage.read_bytes(join(f"s3://{BUCKET}", DATASET, "latest.json")))
        print(f"\nPublished {uri}  (latest.json -> {latest['version']})")
        print(f"classes: {', '.join(manifest['classes'])}; rejected: {manifest['num_rejected']}")
        for split, records in splits.items():
            per_class = Counter(r["image/class/text"].decode() for r in records)
            sizes = sorted(r["decoded_shape"][:2] for r in records)
            print(f"  {split:<11} {len(records):>4} records read back with tf.data in "
                  f"{len(manifest['splits'][split]['shards'])} shard(s); per class {dict(sorted(per_class.items()))}; "
                  f"decoded sizes {sizes[0][1]}x{sizes[0][0]} .. {sizes[-1][1]}x{sizes[-1][0]}")
        card = work / "card.html"
        storage.download(join(uri, "card.html"), str(card))  # self-contained: opens with no server
        print(f"dataset card: {card.relative_to(ROOT)} (a copy of {uri}/card.html; open it in a browser)")
        print(f"\nS3 endpoint {server.endpoint} (key {server.access_key}); data kept in {work / 's3'}: "
              f"`.venv/bin/python tools/seaweedfs.py .demo/s3` serves it again (on new ports).")
        print(f"demo finished in {time.perf_counter() - started:.1f} s")
        return 0
    finally:
        seaweedfs.stop(server)


if __name__ == "__main__":
    sys.exit(main())
