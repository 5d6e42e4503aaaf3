"""Findings into Debian's real Alertmanager through the outbox: a hung finding arrives firing with its
labels and the job's link, then resolves; a collector killed while Alertmanager was down sends it after
its restart, and a restart after it went sends nothing again; a hostile job name and user arrive as
data. Alertmanager notifies a webhook receiver of this test, which records what Alertmanager sent."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobsight.collector.store.embedded_db import free_port
from tests.prometheus.conftest import live_collector
from tests.prometheus.feed import FedJob, end, feed
from tests.prometheus.servers import alertmanager, binary, get_json, wait_until


class Webhook:
    """Where Alertmanager sends its notifications: every one kept, in order."""

    def __init__(self) -> None:
        self.notifications: list[dict[str, Any]] = []
        received = self.notifications

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def alerts(self, job: str, status: str) -> list[dict[str, Any]]:
        return [a for n in self.notifications for a in n["alerts"]
                if a["labels"].get("job") == job and a["status"] == status]


@pytest.fixture
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.server.shutdown()


def outbox(database_url: str, job_id: str) -> list[dict[str, Any]]:
    with psycopg.connect(database_url, autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute("SELECT event, sink, attempts, sent_at FROM alert_outbox WHERE job_id = %s ORDER BY id",
                            (job_id,)).fetchall()


def config(am_url: str, partition: str) -> str:
    return f"""
[health]
interval_s = 0.5
hung_min_s = 2
[alerts]
poll_interval_s = 0.2
retry_base_s = 0.2
retry_max_s = 0.5
[[alerts.alertmanagers]]
name = "site"
url = "{am_url}"
partitions = ["{partition}"]
"""


def test_a_hung_finding_fires_then_resolves_once_across_restarts(
    module_database: str, data_dir: Path, admin_token: str, tmp_path: Path, webhook: Webhook,
) -> None:
    binary("prometheus-alertmanager")
    am = alertmanager(tmp_path, webhook.url)
    # The collector starts while Alertmanager is not up yet: its alert fails and waits in the outbox.
    am_port = free_port()
    am.argv = [a if not a.startswith("--web.listen-address") else f"--web.listen-address=127.0.0.1:{am_port}"
               for a in am.argv]
    am.url = f"http://127.0.0.1:{am_port}"
    partition = f"p{uuid.uuid4().hex[:6]}"  # this test's own: only its jobs go to this Alertmanager
    hostile = 'x"}\n{alertname="silenced",severity="none"} <b>@here</b>'
    job = FedJob(f"hung-{uuid.uuid4().hex[:6]}", partition=partition, user="mallory", name=hostile)
    collector = live_collector(module_database, data_dir, admin_token, tmp_path, config(am.url, partition))
    collector.start()
    try:
        feed(collector.url, job)
        wait_until(lambda: any(r["attempts"] >= 2 for r in outbox(module_database, job.job_id)),
                   "two failed posts", log=collector.log_path)
        collector.kill()  # killed holding an unsent alert
        am.start()
        collector.start()
        fired = wait_until(lambda: webhook.alerts(job.job_id, "firing"), "the firing alert", log=am.log)
        alert = fired[0]
        # The labels are these (``subject`` only when the finding names a rank, node or GPU).
        assert {k: v for k, v in alert["labels"].items() if k not in ("severity", "subject")} == {
            "alertname": "jobsight_hung_rank", "cluster": "default", "job": job.job_id, "user": "mallory",
            "rule": "hung_rank"}
        assert alert["labels"]["severity"] in ("warning", "critical")
        assert alert["annotations"]["link"].startswith("https://jobsight.example.org/")
        assert job.job_id in alert["annotations"]["link"] and alert["generatorURL"] == alert["annotations"]["link"]
        # The hostile name is one annotation's value, its line feed shown as '?': no label came of it.
        assert alert["annotations"]["job_name"] == hostile.replace("\n", "?")
        active = get_json(f"{am.url}/api/v2/alerts?filter=job=\"{job.job_id}\"")
        assert [a["labels"]["alertname"] for a in active] == ["jobsight_hung_rank"]
        sent_once = outbox(module_database, job.job_id)
        assert [r["event"] for r in sent_once] == ["opened"] and sent_once[0]["sent_at"] is not None
        # A restart after the alert went sends nothing again: the row stays as it was.
        collector.kill()
        collector.start()
        wait_until(lambda: collector.process is not None, "restart")
        end(collector.url, job)
        resolved = wait_until(lambda: webhook.alerts(job.job_id, "resolved"), "the resolved alert", log=am.log)
        assert resolved[0]["labels"] == alert["labels"]
    finally:
        collector.kill()
        am.stop()
    rows = outbox(module_database, job.job_id)
    sink = "alertmanager:site"
    assert [(r["event"], r["sink"]) for r in rows] == [("opened", sink), ("resolved", sink)]
    assert rows[0] == {**sent_once[0]}
    assert all(r["sent_at"] is not None for r in rows)
    assert len({(a["startsAt"]) for a in webhook.alerts(job.job_id, "firing")}) == 1
