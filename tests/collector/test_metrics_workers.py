"""``jobsight collector --workers 2`` as a real process: ``/metrics`` gives the collector's
totals whichever worker answers the scrape, and a killed worker's counts stay counted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from jobsight.collector.store.embedded_db import free_port
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz

REPO = Path(__file__).resolve().parents[2]
BATCHES = 24
RECORDS_PER_BATCH = 3
SCRAPES = 12


class WorkersCollector:
    """``jobsight collector --workers N`` on a free port (tests/conftest.py's LiveCollector, with workers)."""

    def __init__(self, database_url: str, data_dir: Path, token: str, log_path: Path, workers: int = 2) -> None:
        self.token = token
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, "JOBSIGHT_DATA_DIR": str(data_dir),
               "JOBSIGHT_PORT": str(self.port)}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)  # the command makes its own
        with open(log_path, "ab") as log:
            self.process = subprocess.Popen([sys.executable, "-m", "jobsight", "collector", "--workers", str(workers)],
                                            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)

    def wait_ready(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"collector exited: {self.log_path.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError(f"collector not ready: {self.log_path.read_text()[-2000:]}")

    def workers(self) -> list[int]:
        """Pids of the uvicorn workers (the parent's spawned children, not its resource tracker)."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == self.process.pid and b"spawn_main" in cmdline:
                found.append(int(entry.name))
        return sorted(found)

    def post(self, body: bytes) -> int:
        request = urllib.request.Request(
            f"{self.url}/v1/ingest", data=body, method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Encoding": "gzip",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:  # a new connection each time
            return int(response.status)

    def scrape(self) -> dict[str, float]:
        """``/metrics`` over a new connection, as {sample name{labels}: value}."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=10) as response:
            text = response.read().decode()
        values: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                values[f"{sample.name}{{{labels}}}"] = sample.value
        return values

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)


@pytest.fixture
def collector(database_url: str, data_dir: Path, admin_token: str, tmp_path: Path) -> Iterator[WorkersCollector]:
    live = WorkersCollector(database_url, data_dir, admin_token, tmp_path / "collector.log")
    try:
        live.wait_ready()
        # Both workers must have made their apps before the batches go, or one may serve them all.
        deadline = time.monotonic() + 90
        while live.scrape().get("jobsight_collector_workers{}") != 2:
            if time.monotonic() > deadline:
                pytest.fail(f"/metrics never counted 2 workers: {live.log_path.read_text()[-2000:]}")
            time.sleep(0.2)
        yield live
    finally:
        live.stop()


def _post_batches(collector: WorkersCollector, job: str) -> None:
    source = f"workers-{uuid.uuid4().hex[:8]}"
    ts = now_us()
    bodies = [
        gz([{"kind": "metric", "job": job, "ts": ts + seq * 10 + i, "node": "n1", "name": "loss", "value": 0.5}
            for i in range(RECORDS_PER_BATCH)], source=source, seq=seq)
        for seq in range(BATCHES)
    ]
    # From several threads, each request on its own connection: the kernel hands them to both workers.
    with ThreadPoolExecutor(4) as pool:
        assert set(pool.map(collector.post, bodies)) == {200}


def _multiproc_dir(pid: int) -> str:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next(item.split(b"=", 1)[1].decode() for item in environ if item.startswith(b"PROMETHEUS_MULTIPROC_DIR="))


def test_metrics_add_up_every_workers_batches(collector: WorkersCollector, job_id: str) -> None:
    workers = collector.workers()
    assert len(workers) == 2, collector.log_path.read_text()[-2000:]
    metrics_dir = _multiproc_dir(workers[0])
    assert metrics_dir == _multiproc_dir(workers[1]) and os.path.isdir(metrics_dir)

    _post_batches(collector, job_id)
    for _ in range(SCRAPES):
        values = collector.scrape()
        assert values["jobsight_batches_total{outcome=stored}"] == BATCHES
        assert values["jobsight_records_ingested_total{kind=metric}"] == BATCHES * RECORDS_PER_BATCH
        assert values["jobsight_ingest_batch_seconds_count{}"] == BATCHES
        assert values["jobsight_collector_workers{}"] == 2

    collector.stop()
    assert not os.path.exists(metrics_dir), "the temporary metrics directory outlived the collector"


def test_a_killed_workers_counts_stay_and_it_is_no_longer_counted_as_serving(
    collector: WorkersCollector, job_id: str
) -> None:
    _post_batches(collector, job_id)
    victim, survivor = collector.workers()
    metrics_dir = Path(_multiproc_dir(survivor))
    os.kill(victim, signal.SIGKILL)
    # uvicorn starts a new worker in its place; it counts itself once it has made its app.
    deadline = time.monotonic() + 90
    while True:
        newcomers = [pid for pid in collector.workers() if pid not in (victim, survivor)]
        if newcomers and (metrics_dir / f"gauge_livesum_{newcomers[0]}.db").exists():
            break
        if time.monotonic() > deadline:
            pytest.fail(f"no worker replaced {victim}: {collector.log_path.read_text()[-2000:]}")
        time.sleep(0.2)
    collector.wait_ready()

    assert (metrics_dir / f"gauge_livesum_{victim}.db").exists()  # until a scrape finds it dead
    for _ in range(SCRAPES):
        values = collector.scrape()
        assert values["jobsight_batches_total{outcome=stored}"] == BATCHES  # the dead worker's included
        assert values["jobsight_collector_workers{}"] == 2  # the dead worker's gauge is not
    assert not (metrics_dir / f"gauge_livesum_{victim}.db").exists()
