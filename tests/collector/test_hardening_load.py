"""Large bodies must not stall the collector: inflating, parsing and validating run in worker
threads, at most ``max_concurrent_decodes`` at once, while the event loop keeps answering."""

from __future__ import annotations

import gzip
import http.client
import inspect
import socket
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.api.routes.ingest import ingest_context
from jobsight.commands.agent import DAEMON_BATCH_AGE_S
from jobsight.protocol.wire import encode_batch, now_us
from tests.collector.helpers import gz, next_seq, post
from tests.conftest import LiveCollector

MiB = 1024 * 1024
HOLD_S = 20.0
"""How long a held decode waits to be released; only reached when the test is failing."""


def gzip_bomb(compressed_bytes: int) -> bytes:
    """A gzip stream of about ``compressed_bytes`` that inflates to about a thousand times as
    much (zeros), built in milliseconds: after a full flush every MiB of zeros compresses to
    the same bytes. It has no end: the collector must stop at its limit long before."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MiB)
    head = deflater.compress(zeros) + deflater.flush(zlib.Z_FULL_FLUSH)
    block = deflater.compress(zeros) + deflater.flush(zlib.Z_FULL_FLUSH)
    return head + block * max(1, (compressed_bytes - len(head)) // len(block))


def slow_batch(job: str, records: int = 2000, values: int = 1000) -> bytes:
    """A valid batch of a few MB inflated (``records`` log lines with ``values`` numbers each in
    their attrs) that takes about a second to validate."""
    ts = now_us()
    lines = [{"kind": "log", "job": job, "ts": ts + i, "level": "INFO", "message": f"line {i}",
              "attrs": {"values": [i] * values}} for i in range(records)]
    return encode_batch("load", next_seq(), lines)


class HeldDecodes:
    """``ingest.prepare`` (the last step of decoding a body) made to wait for :meth:`release`,
    counting how many decodes are inside it at once."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from jobsight.collector.ingest import write as ingest

        self._prepare = ingest.prepare
        self._lock = threading.Lock()
        self._released = threading.Event()
        self.inside = 0
        self.most_inside = 0
        self.entered = threading.Semaphore(0)
        self.timed_out = False
        monkeypatch.setattr(ingest, "prepare", self._held_prepare)

    def _held_prepare(self, batch: Any) -> Any:
        with self._lock:
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        self.entered.release()
        if not self._released.wait(HOLD_S):
            self.timed_out = True
        with self._lock:
            self.inside -= 1
        return self._prepare(batch)

    def wait_entered(self, count: int) -> bool:
        deadline = time.monotonic() + HOLD_S
        return all(self.entered.acquire(timeout=max(0.0, deadline - time.monotonic())) for _ in range(count))

    def release(self) -> None:
        self._released.set()


def test_a_body_being_decoded_does_not_stop_the_event_loop(
    client: Any, db: psycopg.Connection[Any], job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldDecodes(monkeypatch)
    log = {"kind": "log", "job": job_id, "ts": now_us(), "level": "INFO", "message": "held"}
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(post, client, gz([log]))
        try:
            assert held.wait_entered(1), "the batch never reached validation"
            health = client.get("/healthz")  # with decoding on the event loop, this waits for HOLD_S
            answered_while_held = not held.timed_out and held.inside == 1
        finally:
            held.release()
        assert sent.result(timeout=60).status_code == 200
    assert health.status_code == 200
    assert answered_while_held, "/healthz waited for the decode to finish"
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 1


@pytest.fixture
def two_slot_client(database_url: str, data_dir: Path, admin_token: str) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from jobsight.collector.app import create_app
    from jobsight.collector.config.settings import load_collector_settings

    settings = load_collector_settings(database_url=database_url, data_dir=data_dir, max_concurrent_decodes=2)
    with TestClient(create_app(settings)) as test_client:
        test_client.headers["Authorization"] = f"Bearer {admin_token}"
        yield test_client


def test_at_most_max_concurrent_decodes_run_at_once(
    two_slot_client: Any, db: psycopg.Connection[Any], job_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    held = HeldDecodes(monkeypatch)
    bodies = [gz([{"kind": "log", "job": job_id, "ts": now_us(), "level": "INFO", "message": str(i)}])
              for i in range(6)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        sent = [pool.submit(post, two_slot_client, body) for body in bodies]
        try:
            assert held.wait_entered(2), "two decodes should run at once"
            # The other four wait for a slot while the two are held (the health check shows
            # the loop is free, and gives them time to get in if nothing stopped them).
            assert two_slot_client.get("/healthz").status_code == 200
            time.sleep(0.5)
            inside = held.inside
        finally:
            held.release()
        assert [f.result(timeout=60).status_code for f in sent] == [200] * len(bodies)
    assert inside == 2 and held.most_inside == 2
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 6


def test_max_concurrent_decodes_is_validated() -> None:
    from jobsight.collector.config.settings import SettingsError, load_collector_settings

    assert load_collector_settings(max_concurrent_decodes=8).max_concurrent_decodes == 8
    with pytest.raises(SettingsError, match="JOBSIGHT_MAX_CONCURRENT_DECODES"):
        load_collector_settings(max_concurrent_decodes=0)


@pytest.fixture
def small_live_collector(
    database_url: str, data_dir: Path, admin_token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LiveCollector]:
    """A real collector whose bodies may inflate to 32 MiB (room for a 20 MB batch), so that
    bombs stop quickly."""
    monkeypatch.setenv("JOBSIGHT_MAX_DECOMPRESSED_BYTES", str(32 * MiB))
    collector = LiveCollector(database_url, data_dir, admin_token, tmp_path / "collector.log")
    collector.start()
    yield collector
    collector.kill()


def _send(url: str, token: str, body: bytes) -> int:
    request = urllib.request.Request(f"{url}/v1/ingest", data=body, method="POST", headers={
        "Authorization": f"Bearer {token}", "Content-Encoding": "gzip", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_healthz_answers_while_bombs_and_a_large_batch_are_decoded(
    small_live_collector: LiveCollector, db: psycopg.Connection[Any], job_id: str
) -> None:
    collector = small_live_collector
    bomb = gzip_bomb(MiB)
    assert len(bomb) <= MiB
    batch = slow_batch(job_id, records=4000)
    assert 18e6 < len(gzip.decompress(batch)) < 32 * MiB  # the "one valid 20 MB batch"
    polls: list[tuple[int, float]] = []
    with ThreadPoolExecutor(9) as pool:
        sent = [pool.submit(_send, collector.url, collector.token, bomb) for _ in range(8)]
        sent.append(pool.submit(_send, collector.url, collector.token, batch))
        while not all(f.done() for f in sent) or len(polls) < 3:
            began = time.perf_counter()
            with urllib.request.urlopen(f"{collector.url}/healthz", timeout=10) as response:
                polls.append((response.status, time.perf_counter() - began))
            time.sleep(0.02)
        statuses = [f.result() for f in sent]
    assert statuses == [413] * 8 + [200]
    assert {status for status, _ in polls} == {200}
    assert db.execute("SELECT count(*) FROM log_events WHERE job_id = %s", (job_id,)).fetchone()[0] == 4000
    latencies = sorted(took for _, took in polls)
    print(f"healthz under load: {len(polls)} polls, p50 {latencies[len(latencies) // 2] * 1000:.1f} ms, "
          f"max {latencies[-1] * 1000:.1f} ms")


def test_a_client_that_goes_away_mid_body_is_counted_not_logged_as_a_crash(
    small_live_collector: LiveCollector, job_id: str
) -> None:
    """Shippers time out and hang up when the collector is overloaded: each one used to log a
    full traceback, which cost the CPU the collector was short of."""
    collector = small_live_collector
    host, port = collector.url.removeprefix("http://").split(":")
    for _ in range(3):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(f"POST /v1/ingest HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {collector.token}\r\n"
                         "Content-Encoding: gzip\r\nContent-Length: 100000\r\n\r\n".encode() + b"x" * 100)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{collector.url}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        if 'jobsight_ingest_rejects_total{reason="client_gone"} 3.0' in metrics:
            break
        time.sleep(0.2)
    assert 'jobsight_ingest_rejects_total{reason="client_gone"} 3.0' in metrics
    assert "Traceback" not in collector.log_path.read_text()


def test_an_idle_connection_outlives_the_node_daemons_batch_age(small_live_collector: LiveCollector) -> None:
    """A node daemon posts every DAEMON_BATCH_AGE_S: the collector keeps its connection open
    that long and more (uvicorn's own default, 5 s, made every batch a new TCP connection)."""
    collector = small_live_collector
    host, port = collector.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request("GET", "/healthz")
    assert conn.getresponse().read() and conn.sock is not None
    sock = conn.sock
    time.sleep(DAEMON_BATCH_AGE_S + 1)
    conn.request("GET", "/healthz")  # on a connection the server had closed this raises or reconnects
    response = conn.getresponse()
    assert response.status == 200 and conn.sock is sock
    conn.close()


def test_no_dependency_of_the_ingest_route_runs_in_a_thread(client: Any) -> None:
    """FastAPI runs a plain ``def`` dependency in its thread pool: a hop between threads per
    request, which a loaded collector pays for every batch."""
    app_wide = [d.dependency for d in client.app.router.dependencies]
    assert app_wide and all(inspect.iscoroutinefunction(call) for call in [*app_wide, ingest_context])
