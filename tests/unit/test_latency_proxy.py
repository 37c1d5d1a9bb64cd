"""The bench's latency proxy (``tools/latency_proxy.py``) in front of a real S3 server: bytes arrive intact, each
request waits the delay once, and it counts what went through."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tools import latency_proxy
from tools.seaweedfs import S3Server


def test_requests_wait_once_and_are_counted(s3_server: S3Server, bucket: str, tmp_path: Path) -> None:
    import boto3
    from botocore.config import Config

    proxy = latency_proxy.start(s3_server.endpoint, 50, str(tmp_path))
    try:
        client = boto3.client("s3", endpoint_url=proxy.endpoint, aws_access_key_id=s3_server.access_key,
                              aws_secret_access_key=s3_server.secret_key, region_name=s3_server.region,
                              config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}))
        bodies = {f"k{i}": os.urandom(100_000 + i) for i in range(5)}
        for key, body in bodies.items():
            client.put_object(Bucket=bucket, Key=key, Body=body)
        started = time.monotonic()
        for key, body in bodies.items():
            assert client.get_object(Bucket=bucket, Key=key)["Body"].read() == body
        assert time.monotonic() - started >= 5 * 0.05  # five sequential requests, 50 ms each at least
    finally:
        stats = latency_proxy.stop(proxy)
    assert stats["requests"] == 2 * len(bodies), stats  # a PUT's body after its 100 Continue is no request of its own
    assert stats["connections"] >= 1 and stats["continues"] <= len(bodies)
    assert stats["bytes_to_server"] >= sum(map(len, bodies.values()))
    assert stats["bytes_to_client"] >= sum(map(len, bodies.values()))
