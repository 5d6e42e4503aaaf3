"""How the collector answers ``/healthz`` while it is fed gzip bombs and a large batch.

Starts its own stack (embedded PostgreSQL and a collector with the default limits), then
polls ``GET /healthz`` twice over one keep-alive connection: idle, and while eight 1 MiB
gzip bombs (each inflating to about 1 GiB, refused at the decompressed limit) and one valid
batch of a few MB are sent at once, round after round. Prints p50 and max latency of both
and their ratio (under load / idle).
Usage: python bench/abuse.py [rounds]
"""

from __future__ import annotations

import http.client
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.stack import Stack, running_stack  # noqa: E402
from jobsight.protocol.wire import encode_batch, now_us  # noqa: E402

MiB = 1024 * 1024
BOMBS = 8


def gzip_bomb(compressed_bytes: int) -> bytes:
    """About ``compressed_bytes`` of gzip inflating to about a thousand times as much; after a
    full flush every MiB of zeros compresses to the same bytes, so it is built in milliseconds."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    head = deflater.compress(zeros) + deflater.flush(zlib.Z_FULL_FLUSH)
    block = deflater.compress(zeros) + deflater.flush(zlib.Z_FULL_FLUSH)
    return head + block * max(1, (compressed_bytes - len(head)) // len(block))


def large_batch(seq: int) -> bytes:
    """A valid batch of about 4 MB inflated that takes about a second to validate."""
    ts = now_us()
    lines = [{"kind": "log", "job": "bench-abuse", "ts": ts + i, "level": "INFO", "message": f"line {i}",
              "attrs": {"values": [i] * 1000}} for i in range(2000)]
    return encode_batch("bench-abuse", seq, lines)


def send(stack: Stack, body: bytes) -> int:
    request = urllib.request.Request(f"{stack.url}/v1/ingest", data=body, method="POST", headers={
        "Authorization": f"Bearer {stack.token}", "Content-Encoding": "gzip", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def poll(stack: Stack, stop: threading.Event, minimum: int) -> list[float]:
    """``/healthz`` latencies, one request after another, until ``stop`` (and ``minimum`` polls)."""
    target = urlparse(stack.url)
    conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
    took: list[float] = []
    while not stop.is_set() or len(took) < minimum:
        began = time.perf_counter()
        conn.request("GET", "/healthz")
        response = conn.getresponse()
        response.read()
        if response.status != 200:
            raise SystemExit(f"/healthz answered {response.status}")
        took.append(time.perf_counter() - began)
        time.sleep(0.01)
    conn.close()
    return took


def describe(took: list[float]) -> str:
    return f"{len(took)} polls, p50 {statistics.median(took) * 1000:.1f} ms, max {max(took) * 1000:.1f} ms"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    bomb = gzip_bomb(MiB)
    with running_stack() as stack:
        idle_stop = threading.Event()
        idle_stop.set()
        idle = poll(stack, idle_stop, 200)
        stop = threading.Event()
        with ThreadPoolExecutor(BOMBS + 2) as pool:
            loaded = pool.submit(poll, stack, stop, 20)
            statuses: list[int] = []
            began = time.perf_counter()
            for round_ in range(rounds):
                sent = [pool.submit(send, stack, bomb) for _ in range(BOMBS)]
                sent.insert(BOMBS // 2, pool.submit(send, stack, large_batch(round_)))
                statuses += [f.result() for f in sent]
            load_s = time.perf_counter() - began
            stop.set()
            busy = loaded.result()
        expected = ([413] * (BOMBS // 2) + [200] + [413] * (BOMBS - BOMBS // 2)) * rounds
        if statuses != expected:
            raise SystemExit(f"unexpected answers: {statuses}")
        print(f"load: {rounds} rounds of {BOMBS} x {len(bomb) / MiB:.1f} MiB gzip bombs (refused, 413) "
              f"+ 1 valid 2,000-record batch (stored), {load_s:.1f} s")
        print(f"healthz idle:       {describe(idle)}")
        print(f"healthz under load: {describe(busy)}")
        print(f"ratio under load / idle: p50 {statistics.median(busy) / statistics.median(idle):.1f}x, "
              f"max {max(busy) / max(idle):.1f}x")


if __name__ == "__main__":
    main()
