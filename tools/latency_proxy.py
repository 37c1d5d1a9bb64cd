"""A TCP proxy on 127.0.0.1 that adds a fixed latency to every HTTP request to an S3 server, and counts.

For the benchmark's "a real region" case: SeaweedFS on loopback answers in about a millisecond, a real S3 region
in 20-50 ms. Each request waits ``delay_ms`` before it goes on: the first bytes a client sends on a new
connection, or after the server has answered on a kept-alive one (the bytes of one request's body are not
delayed again). A body sent after an interim ``100 Continue`` waits again (a round trip in a region too) but is
not counted as a request. Answers go back as they come. It counts requests and bytes each way, written to a JSON
file when it stops. It runs in a process of its own (``start``; stopped by its PID with ``stop``), so the client's
CPU-bound Python never holds it up.

    python -m tools.latency_proxy --upstream 127.0.0.1:8333 --delay-ms 20 --port-file P --stats-file S
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Proxy:
    endpoint: str  # http://127.0.0.1:PORT
    pid: int
    stats_file: str
    delay_ms: float


@dataclass
class _Counts:
    requests: int = 0
    connections: int = 0
    continues: int = 0  # interim 100 Continue answers (the PUTs of boto3 with Expect: 100-continue)
    bytes_to_server: int = 0
    bytes_to_client: int = 0
    started: float = field(default_factory=time.monotonic)


def start(upstream: str, delay_ms: float = 20.0, folder: str | None = None) -> Proxy:
    """A proxy to the server at ``upstream`` (``http://host:port``) in a process of its own; its port and stats
    files in ``folder`` (a new temporary folder if None)."""
    folder = folder or tempfile.mkdtemp(prefix="latency-proxy-")
    host_port = upstream.split("://", 1)[-1].rstrip("/")
    port_file, stats_file = os.path.join(folder, "proxy.port"), os.path.join(folder, "proxy-stats.json")
    for path in (port_file, stats_file):
        if os.path.exists(path):
            os.remove(path)
    process = subprocess.Popen([sys.executable, "-m", "tools.latency_proxy", "--upstream", host_port, "--delay-ms",
                                str(delay_ms), "--port-file", port_file, "--stats-file", stats_file], cwd=ROOT)
    deadline = time.monotonic() + 20
    while not os.path.exists(port_file) or not Path(port_file).read_text().strip():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"the latency proxy did not start (exit status {process.poll()})")
        time.sleep(0.05)
    port = int(Path(port_file).read_text())
    return Proxy(f"http://127.0.0.1:{port}", process.pid, stats_file, delay_ms)


def stop(proxy: Proxy, timeout: float = 10.0) -> dict[str, Any]:
    """Stop the proxy (SIGTERM, then SIGKILL) and return its counts."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(proxy.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if os.waitpid(proxy.pid, os.WNOHANG)[0]:
                break
        except ChildProcessError:
            break
        time.sleep(0.05)
    else:
        os.kill(proxy.pid, signal.SIGKILL)
    try:
        return json.loads(Path(proxy.stats_file).read_text())
    except (OSError, ValueError):
        return {}


async def _pump_requests(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: dict[str, bool],
                         counts: _Counts, delay: float) -> None:
    while data := await reader.read(1 << 16):
        if state["new_request"]:
            state["new_request"] = False
            if state["continued"]:
                state["continued"] = False
            else:
                counts.requests += 1
            await asyncio.sleep(delay)
        counts.bytes_to_server += len(data)
        writer.write(data)
        await writer.drain()
    writer.close()


async def _pump_answers(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, state: dict[str, bool],
                        counts: _Counts) -> None:
    while data := await reader.read(1 << 16):
        state["new_request"] = True
        if _interim(data):
            state["continued"] = True
            counts.continues += 1
        counts.bytes_to_client += len(data)
        writer.write(data)
        await writer.drain()
    writer.close()


def _interim(data: bytes) -> bool:
    """Whether an answer's chunk is only an interim ``1xx`` status (``HTTP/1.1 100 Continue``): the request goes on."""
    return data.startswith(b"HTTP/1.1 1") and data.endswith(b"\r\n\r\n") and data.count(b"\r\n\r\n") == 1


def _stats(counts: _Counts, delay_ms: float) -> str:
    return json.dumps({"delay_ms": delay_ms, "requests": counts.requests, "connections": counts.connections,
                       "continues": counts.continues, "bytes_to_server": counts.bytes_to_server,
                       "bytes_to_client": counts.bytes_to_client,
                       "seconds": round(time.monotonic() - counts.started, 3)})


async def _serve(upstream: str, delay_ms: float, port_file: str, stats_file: str) -> None:
    host, port = upstream.rsplit(":", 1)
    counts = _Counts()
    delay = delay_ms / 1000
    open_writers: set[asyncio.StreamWriter] = set()

    async def handle(client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        counts.connections += 1
        try:
            server_reader, server_writer = await asyncio.open_connection(host, int(port))
        except OSError:
            client_writer.close()
            return
        open_writers.update((client_writer, server_writer))
        state = {"new_request": True, "continued": False}
        try:
            await asyncio.gather(_pump_requests(client_reader, server_writer, state, counts, delay),
                                 _pump_answers(server_reader, client_writer, state, counts))
        except (ConnectionError, OSError, asyncio.CancelledError):  # cancelled: the proxy stops
            pass
        finally:
            for writer in (client_writer, server_writer):
                writer.close()
                open_writers.discard(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=512)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    Path(port_file).write_text(str(server.sockets[0].getsockname()[1]))
    await stopped.wait()
    Path(stats_file).write_text(_stats(counts, delay_ms))  # first: stopping may be cut short
    server.close()
    for writer in list(open_writers):  # kept-alive connections, else waiting for the server to close may hang
        writer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="host:port of the S3 server")
    parser.add_argument("--delay-ms", type=float, default=20.0)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--stats-file", required=True)
    args = parser.parse_args()
    asyncio.run(_serve(args.upstream, args.delay_ms, args.port_file, args.stats_file))


if __name__ == "__main__":
    main()
