"""`jobsight up` as a user runs it, the external-database path, and a database outage."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.store import migrate
from jobsight.collector.store.embedded_db import EmbeddedPostgres, free_port
from jobsight.protocol.wire import now_us
from tests.collector.helpers import gz
from tests.conftest import REPO, LiveCollector


def _request(url: str, token: str, body: bytes | None = None) -> tuple[int, Any, dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None:
        headers["Content-Encoding"] = "gzip"
    request = urllib.request.Request(url, data=body, headers=headers, method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def _postgres_processes(data_dir: Path) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if "postgres" in cmdline and str(data_dir) in cmdline:
            found.append(int(entry.name))
    return found


class Up:
    """A `jobsight up` process with its own data dir and ports."""

    def __init__(self, data_dir: Path, log: Path, env: dict[str, str] | None = None, dashboard: bool = True):
        self.port, self.dashboard_port = free_port(), free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.data_dir = data_dir
        self.env = {**os.environ, "JOBSIGHT_DATA_DIR": str(data_dir), "JOBSIGHT_PORT": str(self.port),
                    "JOBSIGHT_DASHBOARD_PORT": str(self.dashboard_port), **(env or {})}
        self.env.pop("JOBSIGHT_DATABASE_URL", None) if env is None or "JOBSIGHT_DATABASE_URL" not in env else None
        self.args = [] if dashboard else ["--no-dashboard"]
        self.log = log

    def __enter__(self) -> Up:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen([sys.executable, "-m", "jobsight", "up", *self.args], env=self.env,
                                            stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        deadline = time.monotonic() + 120
        while "Press Ctrl-C" not in self.log.read_text():
            assert self.process.poll() is None, self.log.read_text()[-3000:]
            assert time.monotonic() < deadline, self.log.read_text()[-3000:]
            time.sleep(0.2)
        self.token = (self.data_dir / "admin_token").read_text().strip()
        return self

    def interrupt(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=60)

    def __exit__(self, *exc: object) -> None:
        if self.process.poll() is None:
            self.process.kill()


def _gpu_batch(job: str) -> bytes:
    return gz([{"kind": "gpu_sample", "job": job, "ts": now_us(), "node": "n1", "gpu_index": 0,
                "gpu_uuid": "GPU-0", "util_gpu": 42.0}])


def test_up_serves_stops_cleanly_and_keeps_data(tmp_path: Path, job_id: str) -> None:
    data_dir = tmp_path / "data"
    with Up(data_dir, tmp_path / "up.log") as up:
        status, body, _ = _request(f"{up.url}/v1/ingest", up.token, _gpu_batch(job_id))
        assert (status, body["status"]) == (200, "stored")
        status, body, _ = _request(f"{up.url}/v1/jobs/{job_id}/gpu", up.token)
        assert status == 200 and body["series"][0]["util_gpu"] == 42.0
        with urllib.request.urlopen(f"http://127.0.0.1:{up.dashboard_port}/", timeout=30) as page:
            assert page.status == 200
        assert _postgres_processes(data_dir)
        assert oct((data_dir / "admin_token").stat().st_mode & 0o777) == "0o600"
        # A trial install can mint job tokens: the cluster secret is there, readable by its owner only.
        assert oct((data_dir / "cluster_secret").stat().st_mode & 0o777) == "0o600"
        assert len((data_dir / "cluster_secret").read_text().strip()) >= 32
        assert up.interrupt() == 0
    assert _postgres_processes(data_dir) == []

    with Up(data_dir, tmp_path / "up2.log", dashboard=False) as again:
        status, body, _ = _request(f"{again.url}/v1/jobs/{job_id}/gpu", again.token)
        assert status == 200 and body["series"][0]["util_gpu"] == 42.0
        assert again.interrupt() == 0
    assert _postgres_processes(data_dir) == []


def test_external_database_url_is_used_instead_of_embedded(tmp_path: Path, job_id: str) -> None:
    second = EmbeddedPostgres(tmp_path / "second-server")
    url = second.start()
    try:
        data_dir = tmp_path / "data"
        with Up(data_dir, tmp_path / "up.log", env={"JOBSIGHT_DATABASE_URL": url}, dashboard=False) as up:
            status, _, _ = _request(f"{up.url}/v1/ingest", up.token, _gpu_batch(job_id))
            assert status == 200
            assert up.interrupt() == 0
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchone() == (1,)
        assert not (data_dir / "postgres").exists()
    finally:
        second.destroy()


def test_database_outage_gives_503_then_recovers(tmp_path: Path, job_id: str, admin_token: str,
                                                 data_dir: Path) -> None:
    server = EmbeddedPostgres(tmp_path / "flaky")
    url = server.start()
    migrate.upgrade(url)
    collector = LiveCollector(url, data_dir, admin_token, tmp_path / "collector.log")
    collector.start()
    try:
        body = _gpu_batch(job_id)
        server.stop()
        status, detail, headers = _request(f"{collector.url}/v1/ingest", admin_token, body)
        assert status == 503 and headers.get("retry-after") == "5", detail
        assert _request(f"{collector.url}/readyz", admin_token)[0] == 503
        server.start()
        deadline = time.monotonic() + 30
        while (status := _request(f"{collector.url}/v1/ingest", admin_token, body)[0]) == 503:
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert status == 200
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT count(*) FROM gpu_samples WHERE job_id = %s", (job_id,)).fetchone() == (1,)
    finally:
        collector.kill()
        server.destroy()


@pytest.mark.parametrize("bad", [{"JOBSIGHT_PORT": "eighty"}, {"JOBSIGHT_POOL_SIZE": "0"}])
def test_bad_setting_stops_the_collector_with_a_message(bad: dict[str, str], database_url: str) -> None:
    env = {**os.environ, "JOBSIGHT_DATABASE_URL": database_url, **bad}
    result = subprocess.run([sys.executable, "-m", "jobsight", "collector"], env=env, capture_output=True,
                            text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert next(iter(bad)) in result.stderr and "Traceback" not in result.stderr
