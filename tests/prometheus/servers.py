"""Debian's Prometheus and Alertmanager as real servers for the tests, each on a free port with its
own configuration and data directory. Absent binaries skip the test naming them; with
``JOBSIGHT_REQUIRE_PROMETHEUS=1`` (CI) they fail it instead."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from jobsight.collector.store.embedded_db import free_port

PROMETHEUS = "prometheus"
PROMTOOL = "promtool"
ALERTMANAGER = "prometheus-alertmanager"


def binary(name: str) -> str:
    """The path of ``name``; skips (or, with ``JOBSIGHT_REQUIRE_PROMETHEUS=1``, fails) naming it when absent."""
    found = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if found is None:
        reason = (f"{name} is not installed (apt-get install prometheus prometheus-alertmanager)")
        if os.environ.get("JOBSIGHT_REQUIRE_PROMETHEUS") == "1":
            pytest.fail(f"JOBSIGHT_REQUIRE_PROMETHEUS=1 but {reason}")
        pytest.skip(reason)
    return found


def get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


def wait_until(condition: Any, what: str, timeout: float = 90, log: Path | None = None) -> Any:
    """Polls ``condition`` until it returns something true; fails naming ``what`` (and the log's tail)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = condition()
        except (urllib.error.URLError, OSError, KeyError, IndexError):
            found = None
        if found:
            return found
        if time.monotonic() > deadline:
            tail = log.read_text()[-3000:] if log is not None and log.exists() else ""
            raise AssertionError(f"{what} never happened\n{tail}")
        time.sleep(0.2)


class Server:
    """One server process: started, waited for, stopped."""

    def __init__(self, argv: list[str], url: str, ready_path: str, log: Path) -> None:
        self.argv, self.url, self.ready_path, self.log = argv, url, ready_path, log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)

        def ready() -> bool:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(f"{self.argv[0]} exited: {self.log.read_text()[-3000:]}")
            with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as response:
                return response.status == 200
        wait_until(ready, f"{self.argv[0]} ready", 60, self.log)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=20)
        self.process = None


def prometheus(workdir: Path, target: str, token_file: Path, interval_s: float = 1.0) -> Server:
    """A Prometheus scraping ``target`` (host:port) at ``/metrics/jobs`` with the token in ``token_file``."""
    path = binary(PROMETHEUS)
    port = free_port()
    config = workdir / "prometheus.yml"
    config.write_text(f"""
global:
  scrape_interval: {int(interval_s * 1000)}ms
  evaluation_interval: {int(interval_s * 1000)}ms
scrape_configs:
  - job_name: jobsight_jobs
    metrics_path: /metrics/jobs
    honor_labels: true
    authorization:
      credentials_file: {token_file}
    static_configs:
      - targets: ["{target}"]
""")
    data = workdir / "prometheus-data"
    data.mkdir(exist_ok=True)
    return Server([path, f"--config.file={config}", f"--storage.tsdb.path={data}",
                   f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                  f"http://127.0.0.1:{port}", "/-/ready", workdir / "prometheus.log")


def alertmanager(workdir: Path, webhook_url: str) -> Server:
    """An Alertmanager that notifies ``webhook_url`` of every group, resolves included, at once."""
    path = binary(ALERTMANAGER)
    port, cluster_port = free_port(), free_port()
    config = workdir / "alertmanager.yml"
    config.write_text(f"""
route:
  receiver: hook
  group_by: [alertname, job, subject]
  group_wait: 100ms
  group_interval: 1s
  repeat_interval: 24h
receivers:
  - name: hook
    webhook_configs:
      - url: "{webhook_url}"
        send_resolved: true
""")
    data = workdir / "alertmanager-data"
    data.mkdir(exist_ok=True)
    return Server([path, f"--config.file={config}", f"--storage.path={data}",
                   f"--web.listen-address=127.0.0.1:{port}", f"--cluster.listen-address=127.0.0.1:{cluster_port}",
                   "--log.level=warn"],
                  f"http://127.0.0.1:{port}", "/-/ready", workdir / "alertmanager.log")


def query(server: Server, promql: str) -> list[dict[str, Any]]:
    """An instant query's result vector (or matrix/scalar result list)."""
    answer = get_json(f"{server.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}")
    assert answer["status"] == "success", answer
    result = answer["data"]["result"]
    return result if isinstance(result, list) else [result]
