"""`make demo`: sample images -> local S3 server -> `airflow dags test` -> read back with TensorFlow.

Everything lives under .demo/ (sample images, the SeaweedFS data, AIRFLOW_HOME). The S3 server is
started for the run and stopped at the end; its data stays in .demo/s3, and
`.venv/bin/python tools/seaweedfs.py .demo/s3` serves it again. With IMAGE_TFRECORDS_S3_ENDPOINT
set (for example MinIO from `docker compose up`), that server is used instead.

It prints the steps, where the dataset is, what it holds and how to look at it; nothing else on
success: TensorFlow's C++ start-up lines (absl, oneDNN, CPU features: INFO and WARNING) are off in
this process and its children, and the Airflow commands' output is kept (the migration's) or logged
(the DAG run's) and shown when the step fails.
"""

from __future__ import annotations

import argparse
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
from image_tfrecords.published import layout  # noqa: E402
from image_tfrecords.storage import Storage, join  # noqa: E402
from tools import airflow_env, seaweedfs  # noqa: E402

BUCKET, DATASET = "datasets", "demo"


def _step(message: str) -> None:
    print(f"==> {message}", flush=True)


def _shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file."""
    return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="make demo: sample images -> the DAG -> a published dataset")
    parser.add_argument("--work", type=Path, default=ROOT / ".demo",
                        help="folder for the sample images, the S3 data and AIRFLOW_HOME (default: .demo)")
    work = parser.parse_args(argv).work.resolve()
    # Before anything here or in a child imports TensorFlow: its INFO and WARNING start-up lines off (errors
    # still show); a level the caller set is kept. Every child below inherits it.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    started = time.perf_counter()
    sample = work / "sample"
    _step(f"writing sample images to {_shown(sample)}")
    written = make_sample(str(sample), per_class=20)
    print(f"    {written} images in {len(os.listdir(sample))} class folders")

    server = seaweedfs.existing()
    if server is None:
        _step("starting SeaweedFS (S3) on 127.0.0.1")
        server = seaweedfs.start(str(work / "s3"))
    print(f"    S3 endpoint {server.endpoint}")
    try:
        server.create_bucket(BUCKET)
        home = work / "airflow"
        env = airflow_env.environment(home, server, drop=())  # the caller's AIRFLOW*/AWS_* settings kept
        _step(f"migrating the Airflow database in {_shown(home)}")
        try:
            airflow_env.migrate(env, timeout=None)  # its output kept, shown if it fails
        except subprocess.CalledProcessError as exc:
            for output in (exc.stdout, exc.stderr):
                sys.stderr.write((output or b"").decode(errors="replace"))
            print(f"the Airflow database migration failed (exit status {exc.returncode}; its output is above)",
                  file=sys.stderr)
            return 1
        logical_date = datetime.now(UTC).replace(microsecond=0)
        conf = {"source": str(sample), "destination": f"s3://{BUCKET}", "dataset": DATASET,
                "shard_size_mb": 0.1, "compression": "none"}
        log = work / "dags-test.log"
        _step(f"airflow dags test image_tfrecords {logical_date.isoformat()} (its log: {_shown(log)})")
        with open(log, "w") as out:
            result = subprocess.run([airflow_env.AIRFLOW, "dags", "test", "image_tfrecords", logical_date.isoformat(),
                                     "-c", json.dumps(conf)], env=env, stdout=out, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            sys.stderr.write(_tail(log))
            print(f"the DAG run failed (exit status {result.returncode}); above is the end of its log, {log}",
                  file=sys.stderr)
            return 1
        version = logical_date.strftime("%Y%m%dT%H%M%SZ")
        _step("reading the published dataset back with TensorFlow")
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
            heights = [r["decoded_shape"][0] for r in records]
            widths = [r["decoded_shape"][1] for r in records]
            print(f"  {split:<11} {len(records):>4} records read back with tf.data in "
                  f"{len(manifest['splits'][split]['shards'])} shard(s); per class {dict(sorted(per_class.items()))}; "
                  f"decoded widths {min(widths)}-{max(widths)} px, heights {min(heights)}-{max(heights)} px")
        names = [info.key for info in storage.iter_files(uri) if "/" not in info.key]
        shards = [name for name in names if layout.SHARD.fullmatch(name)]
        others = [name for name in names if name not in shards and not name.endswith(layout.INDEX_SUFFIX)]
        print(f"files: {len(shards)} shards with their .tfindex, {', '.join(others)}, card/ "
              "(docs/published-format.md says what each holds)")
        card = work / "card.html"
        storage.download(join(uri, "card.html"), str(card))  # self-contained: opens with no server
        print(f"\ndataset card: {_shown(card)} (a copy of {uri}/card.html; open it in a browser)")
        kept = "" if server.pid is None else (  # None: a server of the caller's (IMAGE_TFRECORDS_S3_ENDPOINT)
            f"; data kept in {_shown(work / 's3')}: `.venv/bin/python tools/seaweedfs.py {_shown(work / 's3')}` "
            "serves it again (on new ports)")
        print(f"S3 endpoint {server.endpoint} (key {server.access_key}){kept}.")
        print(f"demo finished in {time.perf_counter() - started:.1f} s")
        return 0
    finally:
        seaweedfs.stop(server)


if __name__ == "__main__":
    sys.exit(main())
